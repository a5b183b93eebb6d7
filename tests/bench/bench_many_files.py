"""The agent with many files under one glob, beside the same agent with few, in the same run.

Layouts: ``MANY`` one-line files (default 10,000) and ``FEW`` (default 100), all under one glob;
in each, ``WRITTEN`` (100) of the files are written at ``RATE`` lines/s in all (1,000), round
robin, one line per write. Per layout, with its own agent on a fresh state folder:

- ready_s: from the process's start until it logs that it is ready (every file found);
- start_work_s, start_cpu_s: from ready until the agent is quiet (every file found read once,
  its line sent, idle files closed: a second under 0.02 core), and the CPU it took;
- idle_cores: CPU over ``IDLE_S`` s with nothing written, from then on;
- cores, cpu_us_per_line: CPU over ``WINDOW_S`` s of writing, until every line arrived;
- fds (open descriptors, at the end of the writing window), rss_mb, info_lines (the log's
  INFO lines, start to end);

Both agents run with ``close_idle_ms`` = ``CLOSE_IDLE_MS`` (2 s): idle files are closed
before the idle window ends and reopened when written.
- lost: lines written and not received (must be 0).

Prints one JSON line with both layouts, the ratios many/few (issue 51's goals: CPU per line and
idle CPU ≤ 1.2× the few-file agent's; ready ≤ 10 s) and whether they are met. Uses
``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster for the run.
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
from tests.agentkit import AgentProcess, compile_sources, write_config  # noqa: E402
from tests.bench.bench_latency import RUN, Receiver, _line  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

MANY = int(os.environ.get("BENCH_MANY_FILES", "10000"))
FEW = 100
WRITTEN = 100
RATE = 1000
WINDOW_S = float(os.environ.get("BENCH_MANY_WINDOW_S", "20"))
IDLE_S = float(os.environ.get("BENCH_MANY_IDLE_S", "20"))
SETTLE_S = 5.0                  # after ready, at least: the files found are decided on
SETTLE_MAX_S = 120.0            # ... and until the agent is quiet, at most
QUIET_CORES = 0.02              # a second under this much CPU: the start's work is done
SEED_IDS = 100_000_000          # ids of the lines the files hold at the start (not measured)
# close_idle_ms of both agents: the files idle this long after their first read are closed
# before the idle window ends, so it and the writing window measure the agent with its idle
# files closed (the default, 5 minutes, would not be reached in a run)
CLOSE_IDLE_MS = int(os.environ.get("BENCH_MANY_CLOSE_IDLE_MS", "2000"))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pid: int) -> tuple[float, float]:
    """Wait until the agent is done with its start (every file read once, sent, closed when
    idle): a second with under ``QUIET_CORES`` of CPU, at least ``SETTLE_S`` after ready, at
    most ``SETTLE_MAX_S``. Returns (seconds waited, CPU-s used meanwhile)."""
    began, c_start = time.monotonic(), _cpu_s(pid)
    time.sleep(SETTLE_S)
    while time.monotonic() - began < SETTLE_MAX_S:
        c0 = _cpu_s(pid)
        time.sleep(1.0)
        if _cpu_s(pid) - c0 < QUIET_CORES:
            break
    return time.monotonic() - began, _cpu_s(pid) - c_start


def run_layout(bootstrap: str, files: int, work: Path) -> dict:
    topic = f"many.{RUN}.{files}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    logs = work / "logs"
    logs.mkdir(parents=True)
    paths = [logs / f"f{k:05d}.log" for k in range(files)]
    for k, p in enumerate(paths):                  # a line each before the agent starts
        p.write_bytes(_line(SEED_IDS + k))
    config = write_config(work / "agent.toml", bootstrap, work / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic,
                            "close_idle_ms": CLOSE_IDLE_MS}],
                          buffer={"size_bytes": 256 << 20})
    log = work / "agent.log"
    began = time.monotonic()
    agent = AgentProcess(config, log).start()
    while " ready: " not in log.read_text(errors="replace"):
        assert time.monotonic() - began < 600, agent.log_text()
        time.sleep(0.05)
    ready = time.monotonic() - began
    recv = Receiver(bootstrap, topic)
    recv.start()
    try:
        pid = agent.proc.pid
        settled, start_cpu = _settle(pid)
        c0 = _cpu_s(pid)
        time.sleep(IDLE_S)
        idle = (_cpu_s(pid) - c0) / IDLE_S
        fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in paths[:WRITTEN]]
        total = int(RATE * WINDOW_S)
        c0, start = _cpu_s(pid), time.monotonic()
        for i in range(total):
            os.write(fds[i % len(fds)], _line(i))
            wait = start + (i + 1) / RATE - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        for fd in fds:
            os.close(fd)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and \
                sum(1 for i in range(total) if i in recv.latency_ms) < total:
            time.sleep(0.1)
        cpu = _cpu_s(pid) - c0
        rss_kb = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if line.startswith("VmRSS")).split()[1])
        open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        recv.stop.set()
        recv.join(10)
        agent.stop()
    return {"files": files, "ready_s": round(ready, 2),
            "start_work_s": round(settled, 1), "start_cpu_s": round(start_cpu, 2),
            "idle_cores": round(idle, 4),
            "cores": round(cpu / WINDOW_S, 3), "cpu_us_per_line": round(cpu / total * 1e6, 1),
            "lines": total, "lost": sum(1 for i in range(total) if i not in recv.latency_ms),
            "fds": open_fds, "rss_mb": round(rss_kb / 1024, 1),
            "info_lines": log.read_text(errors="replace").count(" INFO ")}


def main() -> None:
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="docket-bench-many-") as tmp:
        with bench_kafka(Path(tmp)) as bootstrap:
            few = run_layout(bootstrap, FEW, Path(tmp) / "few")
            many = run_layout(bootstrap, MANY, Path(tmp) / "many")
    ratios = {"cpu_per_line": round(many["cpu_us_per_line"] / few["cpu_us_per_line"], 2),
              "idle": round(many["idle_cores"] / max(few["idle_cores"], 1e-4), 1)}
    goals = {"cpu_per_line_le_1.2x": ratios["cpu_per_line"] <= 1.2,
             "idle_le_1.2x": ratios["idle"] <= 1.2, "ready_le_10s": many["ready_s"] <= 10,
             "nothing_lost": few["lost"] == many["lost"] == 0}
    print(json.dumps({"bench": "many_files", "window_s": WINDOW_S, "few": few, "many": many,
                      "ratio_many_vs_few": ratios, "goals": goals}))


if __name__ == "__main__":
    main()
