"""The agent at the rates hosts really run, beside rsyslog in the same run.

A writer appends lines at a steady rate — idle (nothing), 10, 100, 1,000 and 10,000 lines/s,
each line written alone and stamped with its write time in ns — to one file, and then to 100
files at the same total rate (round robin). Each shipper is started once per layout and tails
the folder to a 1-partition topic of its own; a consumer stamps each record's receipt. Per
rate, for WINDOW_S seconds of writing:

- cores: the shipper's CPU time (from /proc, every thread) from the window's start until the
  consumer holds every line of it, over the window's length (idle: 3 × WINDOW_S, as /proc
  counts in 10 ms ticks);
- cpu_us_per_line: the same CPU time over the lines written;
- p50_ms, p99_ms: append → receipt, the window's first second left out;
- lost: lines written and not received (must be 0).

Shippers: ``docket_native`` (the default send path, when built: a slot sent while it fills,
``buffer.send_filling``), ``docket_native_sealed`` (the same with ``send_filling`` off: a slot
sealed before it is sent, a seal per line at low rates — the default before), ``docket_native_
nosync`` (``send_filling`` with ``sync_on_seal`` off: no power-loss safety, as rsyslog runs),
``docket_native_gatherN`` (``docket_native`` with ``buffer.gather_ms = N``, for each N of
``BENCH_RATES_GATHER_MS``, default none; before 2026-12-06 these ran with ``send_filling``
off),
``docket`` (the Python path),
``docket_exactly_once`` (the Python path, ``delivery = "exactly_once"``) and ``rsyslog``
(Debian's ``imfile`` in inotify mode → ``omkafka``, acks=all, as ``bench_peers.py`` runs it;
``make bench-tools`` installs it) — ``BENCH_RATES_SHIPPERS`` picks some by name. The agent runs
with its defaults (``linger_ms`` 5, ``sync_on_seal`` on, audit on).

Prints one JSON line: every figure, the ratios of each docket shipper's CPU per line to
rsyslog's (``cpu_ratio_vs_rsyslog``), and the goals (issue 50): CPU ≤ 1× rsyslog's from 10 to
1,000 lines/s and ≤ 0.5× at 10,000; idle ≤ 0.002 core; p50 ≤ rsyslog's + 1 ms at 1,000
lines/s. Beside them ``seal_floor``: the least CPU one seal costs under the agent's durability
rules, outside the agent (``seal_floor.py``), and ``lines_per_seal_to_match_rsyslog``: that floor
over rsyslog's CPU per line, per rate. Uses ``KAFKA_BOOTSTRAP`` when set, else starts a
1-broker local cluster for the run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import AgentProcess, compile_sources, native_built, write_config  # noqa: E402
from tests.bench.bench_latency import RUN, Receiver, _line  # noqa: E402
from tests.bench.bench_peers import RSYSLOGD, Watched, start_rsyslog, stop  # noqa: E402
from tests.bench.seal_floor import seal_floor  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

# Lines per second (0: idle) and files written round robin; ``BENCH_RATES_RATES`` and
# ``BENCH_RATES_FILES`` (comma lists) run a part of them.
RATES = tuple(int(r) for r in os.environ.get("BENCH_RATES_RATES", "0,10,100,1000,10000").split(","))
LAYOUTS = tuple(int(f) for f in os.environ.get("BENCH_RATES_FILES", "1,100").split(","))
WINDOW_S = float(os.environ.get("BENCH_RATES_WINDOW_S", "20"))
IDLE_S = 3 * WINDOW_S                    # idle: /proc counts CPU in 10 ms ticks
SETTLE_S = 3.0                           # after a shipper's start, before its first window
DRAIN_S = 60.0                           # longest wait for a window's lines to arrive
SKIP_S = 1.0                             # the first second of a window: not in its latency
# The native path again with ``buffer.gather_ms`` at each of these (``docket_native_gatherN``).
GATHER_MS = [g for g in os.environ.get("BENCH_RATES_GATHER_MS", "").split(",") if g]


def _rsyslog_present() -> bool:
    return os.path.exists(RSYSLOGD) and bool(list(Path("/usr/lib").glob("*/rsyslog/omkafka.so")))


class Writer:
    """Appends stamped lines to ``files`` in turn, each line one write; ids go on from one
    window to the next."""

    def __init__(self, files: list[Path]):
        self.fds = [os.open(f, os.O_WRONLY | os.O_APPEND) for f in files]
        self.next_id = 0

    def write(self, rate: int, seconds: float) -> range:
        """``rate`` lines a second for ``seconds``; the ids written."""
        first, total = self.next_id, int(rate * seconds)
        start = time.monotonic()
        done = 0
        while done < total:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            while done < due:
                i = first + done
                os.write(self.fds[i % len(self.fds)], _line(i))
                done += 1
            wait = start + done / rate - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.001) if rate >= 1000 else wait)
        if total == 0:
            time.sleep(seconds)
        self.next_id = first + total
        return range(first, first + total)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _window(rate: int, writer: Writer, recv: Receiver, watched: Watched) -> dict:
    watched.sample()
    cpu0 = watched.cpu_s
    t0 = time.monotonic()
    seconds = WINDOW_S if rate else IDLE_S
    ids = writer.write(rate, seconds)
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and sum(1 for i in ids if i in recv.latency_ms) < len(ids):
        time.sleep(0.1)
    watched.sample()
    cpu = watched.cpu_s - cpu0
    out = {"rate": rate, "cores": round(cpu / seconds, 4),
           "cpu_s": round(cpu, 3), "window_s": round(time.monotonic() - t0, 1)}
    if ids:
        skip = int(rate * SKIP_S)
        lat = sorted(recv.latency_ms[i] for i in ids[skip:] if i in recv.latency_ms)
        out["lines"] = len(ids)
        out["cpu_us_per_line"] = round(cpu / len(ids) * 1e6, 1)
        out["lost"] = sum(1 for i in ids if i not in recv.latency_ms)
        if lat:
            out["p50_ms"] = round(lat[len(lat) // 2], 2)
            out["p99_ms"] = round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2)
    return out


def _docket(bootstrap: str, topic: str, work: Path, logs: Path, shipper: str):
    send_path = "native" if shipper.startswith("docket_native") else "python"
    broker = {"send_path": send_path}
    if shipper == "docket_exactly_once":
        broker["delivery"] = "exactly_once"
    buffer = {"size_bytes": 256 << 20}
    if "_gather" in shipper:
        buffer["gather_ms"] = float(shipper.rsplit("_gather", 1)[1])
    if shipper.endswith("_sealed"):
        buffer["send_filling"] = False
    if shipper.endswith("_nosync"):
        buffer["sync_on_seal"] = False
    config = write_config(work / "agent.toml", bootstrap, work / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic}],
                          buffer=buffer, broker=broker)
    agent = AgentProcess(config, work / "agent.log").start()
    return agent.proc, agent.stop


def run_shipper(bootstrap: str, shipper: str, files: int, work: Path) -> list[dict]:
    topic = f"rates.{RUN}.{shipper}.{files}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    logs = work / "logs"
    logs.mkdir(parents=True)
    paths = [logs / f"app{k:03d}.log" for k in range(files)]
    for p in paths:
        p.touch()
    if shipper == "rsyslog":
        proc = start_rsyslog(bootstrap, topic, work / "rsyslog", logs / "*.log")
        halt = lambda: stop(proc)        # noqa: E731
    else:
        proc, halt = _docket(bootstrap, topic, work, logs, shipper)
    recv = Receiver(bootstrap, topic)
    recv.start()
    writer = Writer(paths)
    try:
        time.sleep(SETTLE_S)
        watched = Watched(proc)
        return [_window(rate, writer, recv, watched) for rate in RATES]
    finally:
        writer.close()
        recv.stop.set()
        recv.join(10)
        halt()


def _pairs(table: dict):
    """Each docket shipper's row beside rsyslog's of the same layout and rate, with its key
    (``shipper.Nf.rate``); nothing without rsyslog."""
    if "rsyslog" not in table:
        return
    for shipper, layouts in table.items():
        if shipper == "rsyslog":
            continue
        for files, rows in layouts.items():
            peer = {r["rate"]: r for r in table["rsyslog"][files]}
            for r in rows:
                yield f"{shipper}.{files}f.{r['rate']}", r, peer[r["rate"]]


def _goals(table: dict) -> dict:
    """The issue's goals, each docket shipper against rsyslog's figures of the same run."""
    goals = {}
    for key, r, p in _pairs(table):
        rate = r["rate"]
        if rate == 0:
            goals[f"{key}.idle_le_0.002_core"] = r["cores"] <= 0.002
            continue
        bound = 0.5 if rate >= 10000 else 1.0
        goals[f"{key}.cpu_le_{bound}x"] = r["cpu_us_per_line"] <= bound * p["cpu_us_per_line"]
        if rate == 1000 and "p50_ms" in r and "p50_ms" in p:
            goals[f"{key}.p50_le_rsyslog_plus_1ms"] = r["p50_ms"] <= p["p50_ms"] + 1
    return goals


def _lines_per_seal(table: dict, floor: dict) -> dict:
    """How many lines a seal must carry for the seal floor alone (``seal_floor.py``) to cost
    no more per line than rsyslog's whole CPU per line at each rate, one file and 100."""
    return {f"{files}f.{r['rate']}": round(floor["total_us"] / r["cpu_us_per_line"], 1)
            for files, rows in table.get("rsyslog", {}).items()
            for r in rows if r.get("cpu_us_per_line")}


def main() -> None:
    compile_sources()
    peer = _rsyslog_present()
    gathers = [f"docket_native_gather{g}" for g in GATHER_MS] if native_built() else []
    natives = ["docket_native", "docket_native_sealed", "docket_native_nosync"]
    shippers = (natives if native_built() else []) + gathers + ["docket"] \
        + ["docket_exactly_once"] + (["rsyslog"] if peer else [])
    chosen = os.environ.get("BENCH_RATES_SHIPPERS")
    if chosen:
        shippers = [s for s in shippers if s in chosen.split(",")]
    missing = [] if peer else ["rsyslog"]
    table: dict[str, dict[int, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="docket-bench-rates-") as tmp:
        work = Path(tmp)
        with bench_kafka(work) as bootstrap:
            for files in LAYOUTS:
                for shipper in shippers:
                    table.setdefault(shipper, {})[files] = run_shipper(
                        bootstrap, shipper, files, work / f"{shipper}-{files}")
            topic = f"rates.{RUN}.floor"
            ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
            floor = seal_floor(bootstrap, topic)
    ratios = {key: round(r["cpu_us_per_line"] / p["cpu_us_per_line"], 2)
              for key, r, p in _pairs(table) if r["rate"] and p.get("cpu_us_per_line")}
    print(json.dumps({"bench": "rates", "window_s": WINDOW_S, "missing": missing,
                      "results": {s: {f"{f}_files": rows for f, rows in layouts.items()}
                                  for s, layouts in table.items()},
                      "cpu_ratio_vs_rsyslog": ratios, "seal_floor": floor,
                      "lines_per_seal_to_match_rsyslog": _lines_per_seal(table, floor),
                      "goals": _goals(table)}))


if __name__ == "__main__":
    main()
