"""The systemd journal into Kafka: docket's journald source beside rsyslog (``imjournal`` →
``omkafka``), same journal, same broker, same run, alternating.

A systemd-journald of the bench's own (``tests/journalkit.Journald``: a private mount
namespace, a volatile journal, no rate limit) holds ENTRIES entries an application logged
through a stdout stream (``systemd-cat``, about 120 bytes each) before either shipper starts;
each is timed from its start until Kafka holds every entry (the topic's high watermarks), with
the CPU its processes spent (docket's journalctl child counted with it). Two forms each:

- ``message``: the entry's message (docket ``format = "message"``; rsyslog ``%msg%``);
- ``json``: the entry's fields as JSON (docket's default; rsyslog ``%jsonmesg%``).

rsyslog sends with acks=all, idempotence, snappy and linger.ms 5 (as in ``bench_peers.py``),
keeping only the application's entries (``$programname``), as docket's ``identifiers`` does;
docket runs with its defaults (``sync_on_seal`` on). Each shipper runs ROUNDS times; the best
run is kept. Ratios: docket / rsyslog per form. Prints one JSON line; without rsyslog docket
runs alone. ``BENCH_JOURNALD_ENTRIES`` sets the count (a million by default: with 200,000 the
agent's start, which rsyslog's does not match, weighs 2-3 µs an entry; docs/performance.md).
Needs root (the namespace).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import KafkaException  # noqa: E402

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import AgentProcess, write_config  # noqa: E402
from tests.bench.bench_peers import RSYSLOGD, Watched, stop, wait_for  # noqa: E402
from tests.journalkit import Journald  # noqa: E402
from tests.kafkautil import bench_kafka, high_watermarks  # noqa: E402

ENTRIES = int(os.environ.get("BENCH_JOURNALD_ENTRIES", "1000000"))
ROUNDS = 2
IDENT = "billing"

RSYSLOG_JOURNAL_CONF = """\
global(workDirectory="{work}" maxMessageSize="64k")
module(load="imjournal" StateFile="{work}/imjournal.state" IgnorePreviousMessages="off"
       Ratelimit.Interval="0" PersistStateInterval="10000")
module(load="omkafka")
template(name="out" type="string" string="{prop}")
ruleset(name="tokafka" queue.type="LinkedList" queue.filename="q" queue.size="100000"
        queue.saveOnShutdown="on" queue.dequeueBatchSize="1024") {{
    if $programname == "{ident}" then {{
        action(type="omkafka" topic="{topic}" broker=["{bootstrap}"] template="out"
               partitions.auto="on" confParam=["compression.codec=snappy", "acks=all",
               "enable.idempotence=true", "linger.ms=5", "socket.nagle.disable=true"])
    }}
}}
call tokafka
"""
RSYSLOG_PROPERTY = {"message": "%msg%", "json": "%jsonmesg%"}


class Family(Watched):
    """A shipper and its children (docket's journalctl): their CPU seconds summed, each child's
    last reading kept once it is gone."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(proc)
        self.children: dict[int, float] = {}

    def sample(self) -> None:
        super().sample()
        own = self.cpu_s
        try:
            tasks = Path(f"/proc/{self.proc.pid}/task")
            pids = {int(p) for t in tasks.iterdir()
                    for p in (t / "children").read_text().split()}
        except (FileNotFoundError, ProcessLookupError):
            pids = set()
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.children[pid] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
        self.cpu_s = own + sum(self.children.values())


def topic_ready(bootstrap: str, topic: str) -> None:
    """The topic made and its partitions led: its watermarks answer (a broker may say it is
    not the leader yet for a moment after the creation)."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=3)])
    deadline = time.monotonic() + 60
    while True:
        try:
            high_watermarks(bootstrap, topic)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def measured(bootstrap: str, topic: str, t0: float, w: Family) -> dict:
    elapsed, held = wait_for(bootstrap, topic, w, t0, want=ENTRIES)
    w.sample()
    return {"events_s": round(ENTRIES / elapsed),
            "cpu_us_per_event": round(w.cpu_s / ENTRIES * 1e6, 2),
            "cores": round(w.cpu_s / elapsed, 2), "peak_rss_mb": round(w.hwm_mb, 1),
            "records": held}


def run_docket(bootstrap: str, form: str, work: Path, journald: Journald) -> dict:
    topic = f"bench.journald.docket.{form}.{work.name}"
    topic_ready(bootstrap, topic)
    work.mkdir()
    config = write_config(work / "agent.toml", bootstrap, work / "state",
                          [{"type": "journald", "identifiers": [IDENT], "format": form,
                            "topic": topic}],
                          buffer={"size_bytes": 1 << 30, "slot_size_bytes": 1 << 20,
                                  "sync_on_seal": True},
                          agent={"id": "bench"})
    agent = AgentProcess(config, work / "agent.log", prefix=journald.prefix)
    t0 = time.perf_counter()
    agent.start()
    try:
        return measured(bootstrap, topic, t0, Family(agent.proc))
    finally:
        agent.stop()


def run_rsyslog(bootstrap: str, form: str, work: Path, journald: Journald) -> dict:
    topic = f"bench.journald.rsyslog.{form}.{work.name}"
    topic_ready(bootstrap, topic)
    work.mkdir()
    conf = work / "rsyslog.conf"
    conf.write_text(RSYSLOG_JOURNAL_CONF.format(work=work, topic=topic, bootstrap=bootstrap,
                                                ident=IDENT, prop=RSYSLOG_PROPERTY[form]))
    log = open(work / "rsyslogd.out", "wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen([*journald.prefix, RSYSLOGD, "-n", "-f", str(conf), "-i",
                             str(work / "rsyslogd.pid")], stdout=log, stderr=log,
                            start_new_session=True)
    log.close()
    try:
        return measured(bootstrap, topic, t0, Family(proc))
    finally:
        stop(proc)


def fill(journald: Journald) -> None:
    """ENTRIES entries of the application's, through one stdout stream, all in the journal."""
    lines = [f"id-{i:08d} payment accepted for order {i * 7} amount {i % 997}.{i % 100:02d} "
             f"currency EUR customer c-{i % 50_000:05d}" for i in range(ENTRIES)]
    journald.log_lines(IDENT, lines)
    deadline = time.monotonic() + 300
    while True:
        n = len(journald.run(["journalctl", "--identifier", IDENT, "-o", "cat",
                              "--no-pager"]).stdout.splitlines())
        if n >= ENTRIES:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the journal holds {n} of {ENTRIES} entries")
        time.sleep(0.5)


def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda r: r["events_s"]) | {"runs": len(runs)}


def main() -> None:
    have_rsyslog = os.path.exists(RSYSLOGD) and Path(
        "/usr/lib/x86_64-linux-gnu/rsyslog/imjournal.so").exists()
    with tempfile.TemporaryDirectory(prefix="bench-journald-") as tmp:
        work = Path(tmp)
        journald = Journald(work / "journald", max_file_bytes=128 << 20)
        try:
            fill(journald)
            with bench_kafka(work) as bootstrap:
                runs: dict[str, list[dict]] = {}
                for r in range(ROUNDS):
                    for form in ("message", "json"):
                        runs.setdefault(f"docket_{form}", []).append(
                            run_docket(bootstrap, form, work / f"docket-{form}-{r}", journald))
                        if have_rsyslog:
                            runs.setdefault(f"rsyslog_{form}", []).append(
                                run_rsyslog(bootstrap, form, work / f"rsyslog-{form}-{r}",
                                            journald))
        finally:
            journald.close()
    results = {name: best(rs) for name, rs in runs.items()}
    ratios = {}
    for form in ("message", "json"):
        d, p = results.get(f"docket_{form}"), results.get(f"rsyslog_{form}")
        if d and p:
            ratios[form] = {"events_s": round(d["events_s"] / p["events_s"], 2),
                            "cpu_per_event": round(d["cpu_us_per_event"]
                                                   / p["cpu_us_per_event"], 2)}
    print(json.dumps({"bench": "journald", "entries": ENTRIES, "results": results,
                      "ratios_docket_over_rsyslog": ratios,
                      "goal": "events/s >= 2x rsyslog's at <= 0.5x its CPU per event",
                      "missing": [] if have_rsyslog else ["rsyslog imjournal"]}))


if __name__ == "__main__":
    main()
