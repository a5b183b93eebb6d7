"""docket beside the shippers a user would pick, each run as a user runs it, on the same broker
in the same run, alternating: throughput from a file and append → consumer latency.

Throughput: LINES lines of 100 bytes in one file written beforehand; each shipper sends them to
a topic of its own (3 partitions) and is timed from its process's start until Kafka holds every
line (the topics' high watermarks), with its CPU time and peak RSS (VmHWM, sampled):

- docket: ``docket-agent run`` (1 GiB pool, 1 MiB slots, ``sync_on_seal``, audit on), with
  the Python send path, and as ``docket_native`` with the native one when it is built
  (``make native``);
- kcat: Debian's ``kcat -P -l FILE`` (librdkafka in C; acks=all, idempotence, snappy,
  linger.ms 5), a client that sends a file and exits, with no tailing, no buffer and no audit;
  and as ``kcat_headers``, the same with docket's three identity headers on every record
  (``-H``; values of the sizes the agent's carry): librdkafka's own cost for records that carry
  an identity; and as ``kcat_headers_own``, that again on the librdkafka docket runs (the
  venv's, loaded through ``LD_LIBRARY_PATH`` in place of Debian's 2.0.2): the same library's
  cost, since the two versions differ by up to 1.7x in kcat's own events/s;
- rsyslog: Debian's ``rsyslogd -n -f CONF -i PIDFILE`` with ``imfile`` (inotify) →
  ``omkafka`` (acks=all, snappy) through a disk-assisted queue, its own work folder, never the
  system's syslog.

Each shipper runs ROUNDS times, alternating; the best run of each is kept. Ratios: each docket
run / each peer, in events/s (``ratios``) and in CPU per event (``cpu_ratios``).
The records that arrived are counted per run (a shipper that loses lines shows it).

Latency: a writer appends 1,000 lines a second for 20 s to a file docket and rsyslog tail; a
consumer stamps each receipt (see ``bench_latency.py``); p50/p99/p99.9 per shipper, and where
the slowest lines' time went. The Python path once, then docket_native and rsyslog in two
rounds (``agent_native_1``, ``rsyslog_1``; then ``rsyslog_2``, ``agent_native_2``: the order
swapped), each after ``os.sync()``.

Prints one JSON line. Shippers not installed are named in ``missing`` (``make bench-tools``
installs them as root) and left out; docket still runs. Uses ``KAFKA_BOOTSTRAP`` when set,
else starts a 1-broker local cluster for the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from docket_common.names import INCARNATION_HEADER, ORIGIN_HEADER, SEQ_HEADER  # noqa: E402
from tests.agentkit import AgentProcess, compile_sources, native_built  # noqa: E402
from tests.bench.bench_agent import throughput_config, write_file  # noqa: E402
from tests.bench.bench_latency import RATE, RUN, WARMUP_S, run_agent, tail_latency  # noqa: E402
from tests.kafkautil import Held, bench_kafka  # noqa: E402

LINES = 1_000_000
LINE = 100
ROUNDS = 2
TIMEOUT_S = 600
LOOK_S = 0.02                   # between two looks at what Kafka holds (wait_for)
RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
KCAT = shutil.which("kcat")


class Watched:
    """A shipper's process: CPU seconds and peak RSS read from /proc while it runs."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.cpu_s = 0.0
        self.hwm_mb = 0.0

    def sample(self) -> None:
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.hwm_mb = int(line.split()[1]) / 1024
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass


def wait_for(bootstrap: str, topic: str, watched: Watched, t0: float,
             want: int = LINES, timeline: dict | None = None) -> tuple[float, int]:
    """Until Kafka holds ``want`` records of ``topic``: (seconds since t0, records), looked at
    every ``LOOK_S``. ``timeline``: filled with the seconds since t0 at which Kafka held the
    first record (``first_s``) and all but the last (``all_but_last_s``)."""
    deadline = t0 + TIMEOUT_S
    held = 0
    count = Held(bootstrap, topic)
    try:
        while time.perf_counter() < deadline:
            watched.sample()
            held = count()
            now = time.perf_counter() - t0
            if timeline is not None:
                if held and "first_s" not in timeline:
                    timeline["first_s"] = now
                if held >= want - 1 and "all_but_last_s" not in timeline:
                    timeline["all_but_last_s"] = now
            if held >= want:
                return now, held
            time.sleep(LOOK_S)
    finally:
        count.close()
    raise AssertionError(f"{topic}: {held} of {want} records after {TIMEOUT_S} s")


def _result(elapsed: float, held: int, w: Watched) -> dict:
    return {"events_s": round(LINES / elapsed), "mb_s": round(LINES * LINE / elapsed / 1e6, 1),
            "cpu_us_per_event": round(w.cpu_s / LINES * 1e6, 2),
            "peak_rss_mb": round(w.hwm_mb, 1), "records": held}


def run_docket(bootstrap: str, topic: str, work: Path, data: Path,
               send_path: str = "python") -> dict:
    agent = AgentProcess(throughput_config(bootstrap, topic, work, data, send_path=send_path),
                         work / "agent.log")
    t0 = time.perf_counter()
    agent.start()
    w = Watched(agent.proc)
    try:
        elapsed, held = wait_for(bootstrap, topic, w, t0)
        w.sample()
    finally:
        agent.stop()
    return _result(elapsed, held, w)


# kcat_headers: every record with docket's three identity headers, values of the sizes the
# agent's records carry (its id here, an incarnation, an 8-byte record number): what librdkafka
# itself spends on records that carry an identity, the floor for any shipper that does.
IDENTITY_HEADERS = [f"{ORIGIN_HEADER}=bench", f"{INCARNATION_HEADER}=1763766000000-0a1b2c3d",
                    f"{SEQ_HEADER}=00000001"]


def kcat_command(bootstrap: str, topic: str, data: Path, headers: bool = False,
                 delimiter: str | None = None) -> list[str]:
    """kcat sending ``data``'s messages (lines, or pieces ended by ``delimiter``: kcat's
    ``-D`` notation, ``\\xNN``) with the producer settings every shipper here gets."""
    cmd = [KCAT, "-P", "-b", bootstrap, "-t", topic, "-l", "-z", "snappy",
           "-X", "acks=all", "-X", "enable.idempotence=true", "-X", "linger.ms=5",
           "-X", "queue.buffering.max.kbytes=65536"]
    if delimiter is not None:
        cmd += ["-D", delimiter]
    for header in IDENTITY_HEADERS if headers else []:
        cmd += ["-H", header]
    return cmd + [str(data)]


def own_librdkafka() -> Path | None:
    """The folder of the librdkafka docket runs (the venv's confluent-kafka, which ``make
    setup`` builds), for kcat to load in place of Debian's; None without one."""
    try:
        import confluent_kafka
    except ImportError:
        return None
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    return libs if (libs / "librdkafka.so.1").exists() else None


def time_kcat(bootstrap: str, topic: str, cmd: list[str], want: int = LINES,
              timeline: dict | None = None,
              library: Path | None = None) -> tuple[float, int, Watched]:
    """``cmd`` (``kcat_command``) run until Kafka holds ``want`` records of ``topic``:
    (seconds, records, its CPU); ``timeline`` as ``wait_for`` fills it; ``library``: a folder
    whose librdkafka.so.1 kcat loads instead of the system's."""
    t0 = time.perf_counter()
    env = None if library is None else dict(os.environ, LD_LIBRARY_PATH=str(library))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    w = Watched(proc)
    try:
        elapsed, held = wait_for(bootstrap, topic, w, t0, want, timeline)
        w.sample()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return elapsed, held, w


def run_kcat(bootstrap: str, topic: str, data: Path, headers: bool = False,
             library: Path | None = None) -> dict:
    return _result(*time_kcat(bootstrap, topic, kcat_command(bootstrap, topic, data, headers),
                              library=library))


RSYSLOG_CONF = """\
global(workDirectory="{work}")
module(load="imfile" mode="inotify")
module(load="omkafka")
template(name="line" type="string" string="%msg%")
ruleset(name="tokafka" queue.type="LinkedList" queue.filename="q" queue.size="100000"
        queue.saveOnShutdown="on" queue.dequeueBatchSize="1024") {{
    action(type="omkafka" topic="{topic}" broker=["{bootstrap}"] template="line"
           partitions.auto="on" confParam=["compression.codec=snappy", "acks=all",
           "enable.idempotence=true", "linger.ms=5", "socket.nagle.disable=true"])
}}
input(type="imfile" File="{file}" Tag="bench" ruleset="tokafka" freshStartTail="off"
      maxLinesAtOnce="0" {framing})
"""
LINES_FRAMING = 'readMode="0"'          # one message per line


def start_rsyslog(bootstrap: str, topic: str, work: Path, file: Path,
                  framing: str = LINES_FRAMING) -> subprocess.Popen:
    """rsyslogd tailing ``file`` into ``topic``; ``framing``: imfile's settings of where a
    message ends (one per line by default)."""
    work.mkdir(parents=True, exist_ok=True)
    conf = work / "rsyslog.conf"
    conf.write_text(RSYSLOG_CONF.format(work=work, topic=topic, bootstrap=bootstrap, file=file,
                                        framing=framing))
    log = open(work / "rsyslogd.out", "wb")
    proc = subprocess.Popen([RSYSLOGD, "-n", "-f", str(conf), "-i", str(work / "rsyslogd.pid")],
                            stdout=log, stderr=log, start_new_session=True)
    log.close()
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_rsyslog(bootstrap: str, topic: str, work: Path, data: Path) -> dict:
    t0 = time.perf_counter()
    proc = start_rsyslog(bootstrap, topic, work, data)
    w = Watched(proc)
    try:
        elapsed, held = wait_for(bootstrap, topic, w, t0)
        w.sample()
    finally:
        stop(proc)
    return _result(elapsed, held, w)


def latency_rounds(bootstrap: str, work: Path, shippers: list[str]) -> dict:
    """The latency part: the Python path once, then docket_native and rsyslog twice each in
    turn, the order swapped in the second round; each run's figures suffixed with its round.
    Before every run the page cache's dirty data is written out (``os.sync``): the throughput
    part leaves a gigabyte or more of it, whose writeback would otherwise fall on whichever
    shipper is measured while it runs (docket syncs its buffer; a shipper that does not is
    not slowed by it). ``BENCH_LATENCY_SYNC=0`` leaves it out, to compare."""
    work.mkdir()
    synced = os.environ.get("BENCH_LATENCY_SYNC", "1") == "1"
    out = {"latency_rate_lines_s": RATE, "latency_warmup_s": WARMUP_S,
           "latency_synced_before_each": synced}
    runs = [("docket", 0)]
    peers = [s for s in ("docket_native", "rsyslog") if s in shippers]
    runs += [(s, 1) for s in peers] + [(s, 2) for s in reversed(peers)]
    for shipper, k in runs:
        if synced:
            os.sync()
        where = work / f"{shipper}{k}"
        if shipper == "docket":
            figures = run_agent(bootstrap, where)
        elif shipper == "docket_native":
            figures = run_agent(bootstrap, where, "native", prefix=f"agent_native_{k}")
        else:
            figures = latency_rsyslog(bootstrap, where, f"rsyslog_{k}")
        out.update(figures)
    return out


def latency_rsyslog(bootstrap: str, work: Path, prefix: str) -> dict:
    topic = f"lat.{prefix}.{RUN}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    work.mkdir()
    app = work / "app.log"
    app.touch()
    proc = start_rsyslog(bootstrap, topic, work / "rsyslog", app)
    try:
        return tail_latency(bootstrap, topic, app, prefix, settle_s=2, stamped_at_read=False)
    finally:
        stop(proc)


def main() -> None:
    missing = [name for name, path in (("kcat", KCAT), ("rsyslog", RSYSLOGD))
               if not path or not os.path.exists(path)]
    if "rsyslog" not in missing and not Path("/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so") \
            .exists() and not list(Path("/usr/lib").glob("*/rsyslog/omkafka.so")):
        missing.append("rsyslog-kafka")
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as d:
        work = Path(d)
        with bench_kafka(work) as bootstrap:
            data = work / "events.log"
            write_file(data, lines=LINES, size=LINE)
            own = own_librdkafka()
            shippers = ["docket"] + (["docket_native"] if native_built() else []) \
                + [s for s in ("kcat", "kcat_headers", "kcat_headers_own", "rsyslog")
                   if s.split("_")[0] not in missing
                   and not (s == "rsyslog" and "rsyslog-kafka" in missing)
                   and not (s == "kcat_headers_own" and own is None)]
            # With $KAFKA_BOOTSTRAP a topic of an earlier run may hold LINES records already.
            topics = {(s, k): f"peers.{RUN}.{s}.{k}" for s in shippers for k in range(ROUNDS)}
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics.values()])
            runs: dict[str, list[dict]] = {s: [] for s in shippers}
            for k in range(ROUNDS):
                for s in shippers:
                    topic = topics[s, k]
                    if s.startswith("docket"):
                        runs[s].append(run_docket(bootstrap, topic, work / f"{s}{k}", data,
                                                  "native" if s == "docket_native"
                                                  else "python"))
                    elif s.startswith("kcat"):
                        runs[s].append(run_kcat(bootstrap, topic, data, s != "kcat",
                                                own if s == "kcat_headers_own" else None))
                    else:
                        runs[s].append(run_rsyslog(bootstrap, topic, work / f"rsyslog{k}",
                                                   data))
            best = {s: max(r, key=lambda x: x["events_s"]) for s, r in runs.items()}
            out = {"bench": "peers", "lines": LINES, "line_bytes": LINE, "rounds": ROUNDS,
                   "missing": missing, "best": best,
                   "runs_events_s": {s: [x["events_s"] for x in r] for s, r in runs.items()},
                   "ratios": {f"{d}_vs_{s}": round(best[d]["events_s"] / best[s]["events_s"], 2)
                              for d in shippers if d.startswith("docket")
                              for s in shippers if not s.startswith("docket")},
                   "cpu_ratios": {f"{d}_vs_{s}": round(best[d]["cpu_us_per_event"]
                                                       / best[s]["cpu_us_per_event"], 2)
                                  for d in shippers if d.startswith("docket")
                                  for s in shippers if not s.startswith("docket")}}
            out.update(latency_rounds(bootstrap, work / "lat", shippers))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
