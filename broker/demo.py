"""``make demo``: the docket pipeline running on this machine, end to end.

``python -m broker.demo up`` starts, under ``$XDG_STATE_HOME/docket/demo`` (or ``--dir``):
a local Apache Kafka (1 broker, port 9092 unless ``--base-port``), the topics, an application
writing rotated JSON logs (``broker.generator``), the agent tailing them, the cluster audit job
and the warehouse landing job. Each runs in a session of its own, its output in ``<name>.log``
and its pid in ``pids.json``. ``python -m broker.demo down`` stops them all, then the broker.
Watch the tiers agree with ``docket-audit show --bootstrap-servers 127.0.0.1:9092``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from audit.contract.errors import print_error
from docket_common.dirs import docket_state_dir

from .admin import TopicSpec, ensure_audit_topic, ensure_topics
from .cluster import LocalCluster
from .errors import BrokerError

TOPICS = {"app.events": "app.log*", "web.access": "access.log*"}
BIN = Path(sys.executable).parent




def agent_config(d: Path, bootstrap: str) -> Path:
    sources = "".join(
        f'\n[[sources]]\ntype = "file"\npaths = ["{d / "logs" / glob}"]\ntopic = "{topic}"\n'
        f'timestamp_field = "ts"\nkey_field = "user"\n'
        for topic, glob in TOPICS.items())
    path = d / "agent.toml"
    path.write_text(
        f'[agent]\nid = "demo-host"\nstate_dir = "{d / "agent"}"\n\n'
        f'[buffer]\nsize_bytes = 134217728\n\n'
        f'[broker]\nbootstrap_servers = "{bootstrap}"\n\n'
        f'[audit]\ninterval_ms = 15000\n\n'
        f'[status]\nlisten = "127.0.0.1:9464"\n{sources}')
    return path


def _spawn(d: Path, name: str, cmd: list[str]) -> int:
    with open(d / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
    return proc.pid


def up(d: Path, base_port: int | None) -> int:
    if (d / "pids.json").exists():
        print(f"the demo is already running from {d} (make demo-down stops it)", file=sys.stderr)
        return 1
    d.mkdir(parents=True, exist_ok=True)
    layout = LocalCluster(d / "kafka").up(brokers=1, base_port=base_port)
    bootstrap = layout.bootstrap_servers
    ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in TOPICS])
    ensure_audit_topic(bootstrap)
    config = agent_config(d, bootstrap)
    jobs = ["--bootstrap-servers", bootstrap, "--trigger-s", "20",
            "--topics", r"app\.events|web\.access"]
    pids = {
        "generator": _spawn(d, "generator", [sys.executable, "-m", "broker.generator",
                                             str(d / "logs"), "--rate", "300"]),
        "agent": _spawn(d, "agent", [str(BIN / "docket-agent"), "run", "--config", str(config)]),
        "count": _spawn(d, "count", [str(BIN / "docket-audit"), "count", "--cluster",
                                     "kafka-local", *jobs, "--checkpoint-dir",
                                     str(d / "checkpoint-count")]),
        "land": _spawn(d, "land", [str(BIN / "docket-audit"), "land", "--warehouse",
                                   str(d / "warehouse"), *jobs]),
    }
    (d / "pids.json").write_text(json.dumps(pids))
    time.sleep(3)
    dead = [n for n, pid in pids.items() if not _alive(pid)]
    if dead:
        print(f"exited at once: {', '.join(dead)} (see {d}/<name>.log)", file=sys.stderr)
    print(f"""docket demo running from {d}
  Kafka            {bootstrap}
  application      writes {d / 'logs'}/app.log and access.log (rotated every 20,000 lines)
  agent            docket-agent status --config {config}
  cluster audit    Spark, counts every 20 s        ({d}/count.log)
  warehouse        Spark, lands Parquet in {d / 'warehouse'} and counts it ({d}/land.log)
See the tiers side by side (the Spark jobs need a minute to start):
  .venv/bin/docket-audit show --bootstrap-servers {bootstrap}
Stop everything: make demo-down
Still to come: the reconciler and the dashboard.""")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def down(d: Path) -> int:
    pids_file = d / "pids.json"
    pids = json.loads(pids_file.read_text()) if pids_file.exists() else {}
    for name, pid in pids.items():
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 40
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        print(f"stopped {name}")
    pids_file.unlink(missing_ok=True)
    if (d / "kafka").exists():
        LocalCluster(d / "kafka").down()
        print("stopped Kafka")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.demo")
    p.add_argument("command", choices=("up", "down"))
    p.add_argument("--dir", type=Path, default=docket_state_dir("demo"))
    p.add_argument("--base-port", type=int, default=None)
    args = p.parse_args(argv)
    try:
        return up(args.dir, args.base_port) if args.command == "up" else down(args.dir)
    except BrokerError as exc:
        print_error(exc, "demo")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
