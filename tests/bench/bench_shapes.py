"""The agent on other shapes of input: 1 KiB lines, and the same lines spread over 10 and 100
files, each beside the bare positional produce loop sending the same values with the same
headers (``bench_agent.bare_loop``) in the same run.

Prints one JSON line with, per shape, the agent's events/s, MB/s and CPU µs per event (from the
moment it answers on its status endpoint until Kafka acknowledged the last record, as
``bench_agent.py`` measures), the bare loop's events/s, and their ratio. Shapes:
- ``100B_1file``: 1,000,000 lines of 100 bytes in one file (the reference);
- ``1KiB_1file``: 200,000 lines of 1,024 bytes in one file;
- ``100B_10files`` / ``100B_100files``: the 1,000,000 lines of 100 bytes cut into 10 / 100
  files of one glob.
Every record the agent read must reach its topic (high watermarks), and the bare loop's
``flush`` must leave none undelivered, or the benchmark fails.
Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster for the run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_agent import agent_run, bare_loop, write_file  # noqa: E402

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import compile_sources  # noqa: E402
from tests.kafkautil import bench_kafka, high_watermarks  # noqa: E402

SHAPES = {                      # name: (lines, bytes per line, files)
    "100B_1file": (1_000_000, 100, 1),
    "1KiB_1file": (200_000, 1024, 1),
    "100B_10files": (1_000_000, 100, 10),
    "100B_100files": (1_000_000, 100, 100),
}


def write_files(folder: Path, lines: int, size: int, files: int) -> list[Path]:
    folder.mkdir()
    paths = [folder / f"events-{k:03d}.log" for k in range(files)]
    per = lines // files
    for k, path in enumerate(paths):
        write_file(path, first=k * per, lines=per, size=size)
    return paths


def main() -> None:
    out = {}
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="bench-shapes-") as d:
        work = Path(d)
        with bench_kafka(work) as bootstrap:
            for name, (lines, size, files) in SHAPES.items():
                folder = work / name
                paths = write_files(folder, lines, size, files)
                agent_topic, bare_topic = (f"bench.shapes.{name}.{os.getpid()}.{who}"
                                           for who in ("agent", "bare"))
                ensure_topics(bootstrap, [TopicSpec(t, partitions=3)
                                          for t in (agent_topic, bare_topic)])
                agent_s, agent_cpu, _exec_s, rss = agent_run(
                    bootstrap, agent_topic, work / f"agent-{name}", f"{folder}/events-*.log",
                    lines=lines)
                bare_s, bare_cpu = bare_loop(bootstrap, bare_topic, paths, callback=False,
                                             positional=True)
                arrived = sum(high_watermarks(bootstrap, agent_topic).values())
                assert arrived == lines, f"{name}: {arrived} of {lines} records in Kafka"
                out[name] = {
                    "agent_events_s": round(agent_s),
                    "agent_mb_s": round(agent_s * size / 1e6, 1),
                    "agent_cpu_us_per_event": round(agent_cpu, 2),
                    "agent_peak_rss_mb": round(rss["VmHWM"], 1),
                    "bare_positional_events_s": round(bare_s),
                    "bare_cpu_us_per_event": round(bare_cpu, 2),
                    "ratio": round(agent_s / bare_s, 3)}
    print(json.dumps({"bench": "agent_input_shapes", "shapes": out}))


if __name__ == "__main__":
    main()
