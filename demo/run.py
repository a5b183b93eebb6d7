"""``make demo``: the docket pipeline running on this machine, end to end.

``python -m demo up`` (from the checkout) starts, under ``$XDG_STATE_HOME/docket/demo`` (or
``--dir``): a local Apache Kafka (1 broker, port 9092 unless ``--base-port``), the topics, an
application writing rotated JSON logs (``demo.generator``), the agent tailing them, the
cluster audit job and the warehouse landing job. Each runs in a session of its own, its output
in ``<name>.log`` and its pid in ``pids.json``. ``python -m demo down`` stops them all, then
the broker. Watch the tiers agree with ``docket-audit show --bootstrap-servers 127.0.0.1:9092``.
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

from agent.config import to_toml
from audit.contract.errors import print_error
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from broker.errors import BrokerError
from docket_common.dirs import docket_state_dir

TOPICS = {"app.events": "app.log*", "web.access": "access.log*"}
WINDOW_MS = 60_000          # every tier counts in 1-minute windows: verdicts within minutes
DASHBOARD = "127.0.0.1:8642"
BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[1]       # where ``python -m demo.generator`` runs




def agent_config(d: Path, bootstrap: str) -> Path:
    """The demo agent's config, written through the agent's own declarations (``to_toml``
    refuses a key the agent does not have, and parses the result back)."""
    (d / "logs").mkdir(parents=True, exist_ok=True)      # the sources' folder must exist
    path = d / "agent.toml"
    path.write_text(to_toml(
        {"agent.id": "demo-host", "agent.state_dir": str(d / "agent"),
         "buffer.size_bytes": 128 << 20, "broker.bootstrap_servers": bootstrap,
         "audit.interval_ms": 15000, "audit.window_ms": WINDOW_MS,
         "status.listen": "127.0.0.1:9464"},
        [{"type": "file", "paths": [str(d / "logs" / glob)], "topic": topic,
          "timestamp_field": "ts", "key_field": "user"} for topic, glob in TOPICS.items()]))
    return path


def reconcile_config(d: Path, bootstrap: str) -> Path:
    """The demo reconciler's config: 1-minute windows judged quickly (final 5 minutes after
    they end), the three tiers in order; checked by the reconciler's own parser."""
    from audit.reconcile import config as rconfig

    path = d / "reconcile.toml"
    path.write_text(
        f'[reconcile]\nbootstrap_servers = "{bootstrap}"\nevaluate_interval_ms = 10000\n'
        f'deliver_interval_ms = 2000\nlisten = "127.0.0.1:9465"\n\n'
        f'[windows]\nwindow_ms = {WINDOW_MS}\ngrace_ms = 120000\nfinal_ms = 300000\n'
        f'settle_ms = 30000\ntiers = ["producer", "kafka-local", "warehouse"]\n\n'
        f'[alerts]\nlag_ms = 300000\nsilent_ms = 300000\n')
    rconfig.load(path)
    return path


def _spawn(d: Path, name: str, cmd: list[str]) -> int:
    with open(d / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True,
                                cwd=CHECKOUT)
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
    jobs = ["--bootstrap-servers", bootstrap, "--trigger-s", "20", "--window-ms",
            str(WINDOW_MS), "--topics", r"app\.events|web\.access"]
    rconf, rdb = reconcile_config(d, bootstrap), d / "reconcile.db"
    pids = {
        "generator": _spawn(d, "generator", [sys.executable, "-m", "demo.generator",
                                             str(d / "logs"), "--rate", "300"]),
        "agent": _spawn(d, "agent", [str(BIN / "docket-agent"), "run", "--config", str(config)]),
        "count": _spawn(d, "count", [str(BIN / "docket-audit"), "count", "--cluster",
                                     "kafka-local", *jobs, "--checkpoint-dir",
                                     str(d / "checkpoint-count")]),
        "land": _spawn(d, "land", [str(BIN / "docket-audit"), "land", "--warehouse",
                                   str(d / "warehouse"), *jobs]),
        "reconcile": _spawn(d, "reconcile", [str(BIN / "docket-audit"), "reconcile", "--db",
                                             str(rdb), "--config", str(rconf)]),
    }
    (d / "pids.json").write_text(json.dumps(pids))
    deadline = time.monotonic() + 60                 # the dashboard reads what it writes
    while not rdb.exists() and time.monotonic() < deadline and _alive(pids["reconcile"]):
        time.sleep(0.5)
    pids["dashboard"] = _spawn(d, "dashboard", [str(BIN / "docket-dashboard"), "--db", str(rdb),
                                                "--listen", DASHBOARD])
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
  reconciler       1-minute windows, final 5 minutes after they end ({d}/reconcile.log)
  dashboard        http://{DASHBOARD}/

Open http://{DASHBOARD}/ : the cells fill in as the tiers report (the Spark jobs need a
minute to start; a window is final 5 minutes after it ends). On the command line:
  .venv/bin/docket-audit show --db {rdb}
Stop everything: make demo-down""")
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
    p = argparse.ArgumentParser(prog="python -m demo")
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
