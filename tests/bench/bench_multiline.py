"""Multiline events: docket joining stack traces into events beside rsyslog's ``imfile`` with
``startmsg.regex``, and docket with multiline off, on the same broker in the same run.

EVENTS events written beforehand to one file, as Logback writes them: a message line beginning
with a date, and for one event in three an exception with 1–40 frames, a cause and "... N more"
(seeded; about 5 lines and 450 bytes per event on average). Each shipper sends them to a topic
of its own (3 partitions) and is timed from its process's start until Kafka holds every record,
with its CPU time (``bench_peers.Watched``):

- docket_start: ``docket-agent run`` (the throughput configuration of ``bench_agent.py``) with
  ``multiline = { start = "^\\d{4}-\\d{2}-\\d{2} " }``, the rule rsyslog is given;
- docket_java: the same with ``{ preset = "java" }`` (a ``continue`` rule);
- docket_native_start: docket_start on the native send path, when it is built;
- docket_lines: multiline off, every line a record (what multiline costs per line read);
- rsyslog: Debian's ``rsyslogd`` with ``imfile`` (inotify, ``startmsg.regex`` = the same start
  pattern in POSIX ERE, ``escapeLF="off"`` so a record holds the event's newlines as docket's
  does, ``readTimeout`` 1 s for the last event) → ``omkafka`` (acks=all, snappy), as
  ``bench_peers.py`` runs it;
- kcat_headers: Debian's ``kcat`` sending the same events, each already whole (a file of them
  ended by 0x1E instead of read as lines), with docket's three identity headers on every record
  and the producer settings above: what librdkafka itself spends on these records, with no
  reading, joining, buffering or counting — the floor under any shipper that sends them with an
  identity (``bench_peers.py``'s ``kcat_headers``, for events).

Every record that arrived is counted per run; for docket and kcat the records' values are
compared with the events written (every event exactly once, whole). Ratios: docket's events/s
over rsyslog's and CPU per event over rsyslog's (the issue's goal: >= 2x the events/s at <= 0.5x
the CPU), and kcat_headers' CPU per event over rsyslog's and over docket's.

The parts of each run's time (``result``): when Kafka held the first record
(``first_record_s``) and all but the last (``all_but_last_s``), and the events/s until then
(``events_s_before_last``) and between the two (``events_s_sending``), with their ratios to
rsyslog's. The last event ends a run for the shippers that read lines (docket, rsyslog): none
can tell it is whole until ``flush_ms`` / ``readTimeout`` passes with nothing after it —
docket counts it from its first look at the file's size, when its reading began (since
2026-12-07; from its read of the file's end before), rsyslog from its own look at the end.
Prints one JSON line. Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster.
``BENCH_MULTILINE_SHIPPERS`` (comma-separated names from the list above) runs only those.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import AgentProcess, compile_sources, native_built, write_config  # noqa: E402
from tests.bench.bench_peers import (  # noqa: E402
    KCAT,
    RSYSLOGD,
    Watched,
    kcat_command,
    start_rsyslog,
    stop,
    time_kcat,
    wait_for,
)
from tests.kafkautil import bench_kafka, read_all  # noqa: E402

EVENTS = 200_000
START = r"^\d{4}-\d{2}-\d{2} "
START_ERE = "^[0-9]{4}-[0-9]{2}-[0-9]{2} "
RUN = os.getpid()


def event(i: int, rnd: random.Random) -> bytes:
    head = b"2026-12-02 11:00:%02d.%03d [worker-%d] INFO app.Service - request %d served" % (
        i // 1000 % 60, i % 1000, i % 8, i)
    if rnd.random() >= 1 / 3:
        return head + b"\n"
    frames = rnd.randint(1, 40)
    out = [head.replace(b"INFO", b"ERROR").replace(b"served", b"failed"),
           b"java.lang.IllegalStateException: request %d: state %d" % (i, rnd.randint(0, 99))]
    out += [b"\tat app.layer%d.Handler.handle(Handler.java:%d)" % (k, 100 + k)
            for k in range(frames)]
    out += [b"Caused by: java.io.IOException: closed", b"\t... %d more" % frames]
    return b"\n".join(out) + b"\n"


def write_events(path: Path) -> list[bytes]:
    rnd = random.Random(20261202)
    events = [event(i, rnd) for i in range(EVENTS)]
    path.write_bytes(b"".join(events))
    return events


def result(elapsed: float, held: int, w: Watched, lines: int, events: int = EVENTS,
           timeline: dict | None = None) -> dict:
    """A run's figures. With ``timeline`` (``wait_for``'s) also the parts of its time: when
    Kafka held the first record and all but the last, the events/s until then
    (``events_s_before_last``: the whole run but the wait for the last event, which no
    shipper can tell is whole until ``flush_ms`` / ``readTimeout``, 1 s for both, passes
    with nothing after it) and while sending (``events_s_sending``: from the first record
    held to all but the last, so neither the start nor the last event's wait)."""
    out = {"events_s": round(events / elapsed), "records": held,
           "cpu_us_per_event": round(w.cpu_s / events * 1e6, 2),
           "cpu_us_per_line": round(w.cpu_s / lines * 1e6, 3),
           "peak_rss_mb": round(w.hwm_mb, 1), "seconds": round(elapsed, 3)}
    if timeline and "first_s" in timeline and "all_but_last_s" in timeline:
        first, most = timeline["first_s"], timeline["all_but_last_s"]
        out.update(first_record_s=round(first, 3), all_but_last_s=round(most, 3),
                   events_s_before_last=round((events - 1) / most))
        if most > first:
            out["events_s_sending"] = round((events - 1) / (most - first))
    return out


def run_docket(bootstrap: str, topic: str, work: Path, data: Path, want: int, lines: int,
               settings: dict, send_path: str = "python", events: int = EVENTS) -> dict:
    """docket's agent reading ``data`` with the source ``settings`` (``multiline``,
    ``format``) until Kafka holds ``want`` records; ``events``: what the file holds."""
    work.mkdir()
    source = {"type": "file", "paths": [str(data)], "topic": topic, **settings}
    cfg = write_config(work / "agent.toml", bootstrap, work / "state", [source],
                       buffer={"size_bytes": 1 << 30, "slot_size_bytes": 1 << 20,
                               "sync_on_seal": True},
                       agent={"id": "bench"}, broker={"send_path": send_path})
    agent = AgentProcess(cfg, work / "agent.log")
    t0 = time.perf_counter()
    agent.start()
    w = Watched(agent.proc)
    timeline: dict = {}
    try:
        elapsed, held = wait_for(bootstrap, topic, w, t0, want, timeline)
        w.sample()
    finally:
        agent.stop()
    return result(elapsed, held, w, lines, events, timeline if want == events else None)


# imfile: a message begins at a line matching the start pattern (the last one ends after
# readTimeout), its newlines kept in the message as docket keeps them in a record.
MULTILINE_FRAMING = f'startmsg.regex="{START_ERE}" escapeLF="off" readTimeout="1"'


def run_rsyslog(bootstrap: str, topic: str, work: Path, data: Path, lines: int,
                framing: str = MULTILINE_FRAMING, events: int = EVENTS) -> dict:
    """rsyslog's imfile with ``framing`` (where a message ends) until Kafka holds
    ``events`` records."""
    t0 = time.perf_counter()
    proc = start_rsyslog(bootstrap, topic, work, data, framing)
    w = Watched(proc)
    timeline: dict = {}
    try:
        elapsed, held = wait_for(bootstrap, topic, w, t0, events, timeline)
        w.sample()
    finally:
        stop(proc)
    return result(elapsed, held, w, lines, events, timeline)


def run_kcat_events(bootstrap: str, topic: str, work: Path, events: list[bytes],
                    lines: int) -> dict:
    """kcat sending ``events`` whole (each ended by 0x1E, its last newline left out as docket
    leaves it out of a record) with docket's identity headers, until Kafka holds them all."""
    work.mkdir()
    data = work / "events.rs"
    data.write_bytes(b"".join(e[:-1] + b"\x1e" for e in events))
    cmd = kcat_command(bootstrap, topic, data, headers=True, delimiter="\\x1e")
    timeline: dict = {}
    elapsed, held, w = time_kcat(bootstrap, topic, cmd, len(events), timeline)
    return result(elapsed, held, w, lines, len(events), timeline)


def rsyslog_usable() -> bool:
    return os.path.exists(RSYSLOGD) and bool(list(Path("/usr/lib").glob("*/rsyslog/omkafka.so")))


def main() -> None:
    native = native_built()
    with tempfile.TemporaryDirectory(prefix="bench-multiline-") as d:
        compile_sources()
        work = Path(d)
        data = work / "app.log"
        events = write_events(data)
        lines = sum(e.count(b"\n") for e in events)
        runs = ["docket_start", "docket_java", "docket_lines"] + \
            (["docket_native_start"] if native else []) + \
            (["rsyslog"] if rsyslog_usable() else []) + (["kcat_headers"] if KCAT else [])
        chosen = os.environ.get("BENCH_MULTILINE_SHIPPERS")
        if chosen:
            runs = [r for r in runs if r in chosen.split(",")]
        with bench_kafka(work) as bootstrap:
            topics = {r: f"bench.multiline.{r}.{RUN}" for r in runs}
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics.values()])
            out: dict = {}
            for r in runs:
                if r == "rsyslog":
                    out[r] = run_rsyslog(bootstrap, topics[r], work / r, data, lines)
                    continue
                if r == "kcat_headers":
                    out[r] = run_kcat_events(bootstrap, topics[r], work / r, events, lines)
                    got = sorted(m.value() for m in read_all(bootstrap, topics[r]))
                    out[r]["every_event_once_whole"] = got == sorted(e[:-1] for e in events)
                    continue
                rule = None if r == "docket_lines" else \
                    {"preset": "java"} if r == "docket_java" else {"start": START}
                want = lines if rule is None else EVENTS
                out[r] = run_docket(bootstrap, topics[r], work / r, data, want, lines,
                                    {"multiline": rule} if rule else {},
                                    "native" if "native" in r else "python")
                if rule is not None:
                    got = sorted(m.value() for m in read_all(bootstrap, topics[r]))
                    out[r]["every_event_once_whole"] = got == sorted(e[:-1] for e in events)
    figures = {"bench": "multiline", "events": EVENTS, "lines": lines,
               "bytes": data_size(events), **out}
    figures.update(vs_rsyslog(out))
    if "docket_start" in out and "docket_lines" in out:
        figures["multiline_cpu_per_line_vs_off"] = round(
            out["docket_start"]["cpu_us_per_line"] / out["docket_lines"]["cpu_us_per_line"], 2)
    print(json.dumps(figures))


def vs_rsyslog(out: dict) -> dict:
    """Each docket run's events/s and CPU per event over rsyslog's (none without rsyslog; the
    plain-lines baseline left out)."""
    rs, floor = out.get("rsyslog"), out.get("kcat_headers")
    figures = {}
    for r, got in out.items():
        if rs and r.startswith("docket") and r != "docket_lines":
            figures[f"{r}_vs_rsyslog_events_s"] = round(got["events_s"] / rs["events_s"], 2)
            figures[f"{r}_vs_rsyslog_cpu"] = round(got["cpu_us_per_event"]
                                                   / rs["cpu_us_per_event"], 2)
            for part in ("events_s_before_last", "events_s_sending"):
                if part in got and part in rs:
                    figures[f"{r}_vs_rsyslog_{part}"] = round(got[part] / rs[part], 2)
        if floor and r.startswith("docket") and r != "docket_lines":
            figures[f"{r}_vs_kcat_headers_cpu"] = round(got["cpu_us_per_event"]
                                                        / floor["cpu_us_per_event"], 2)
    if rs and floor:
        figures["kcat_headers_vs_rsyslog_cpu"] = round(floor["cpu_us_per_event"]
                                                       / rs["cpu_us_per_event"], 2)
    return figures


def data_size(events: list[bytes]) -> int:
    return sum(map(len, events))


if __name__ == "__main__":
    main()
