"""``make demo``: the docket pipeline running on this machine, end to end.

``python -m demo up`` (from the checkout) starts, under ``$XDG_STATE_HOME/docket/demo`` (or
``--dir``), every part on 127.0.0.1: a local Apache Kafka (1 broker; port 9092, or
``--base-port``), the topics, three simulated hosts (``web-1`` … ``web-3``: each an application
writing rotated JSON logs, ``demo.generator``, and an agent of its own with its own id, pool and
state), the cluster audit job and the warehouse landing job (Spark), the reconciler with
1-minute windows, the dashboard, and an alert receiver (``demo.receiver``) that the reconciler
notifies. Each part runs in a session of its own, its output in ``<part>.log``; what was started
is in ``demo.json``. ``up`` then shows a live line per part until Ctrl-C, which stops them all
(``--detach``: return at once). ``python -m demo down`` stops them from anywhere.

``python -m demo fault`` runs the drills in turn (``--only`` one of them): a 30 s broker pause
and an agent SIGKILL (nothing lost), then two real losses: records deleted from Kafka before the
warehouse job read them, and a log file deleted while its agent was stopped. It waits for the
alerts they should raise and prints them as the receiver got them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from agent.config import to_toml
from audit.contract.errors import print_error
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from broker.errors import BrokerError
from docket_common.dirs import docket_state_dir
from docket_common.procs import alive, group_alive, reap

from .receiver import describe, received

HOSTS = ("web-1", "web-2", "web-3")
TOPICS = {"app.events": "app.log*", "web.access": "access.log*",
          "pay.transactions": "payments.log*"}
TOPIC_PATTERN = r"app\.events|web\.access|pay\.transactions"
WINDOW_MS = 60_000          # every tier counts in 1-minute windows: verdicts within minutes
GRACE_MS, FINAL_MS = 120_000, 240_000
RATE = 100                  # lines per second per host
BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[1]       # where ``python -m demo.…`` runs
DEFAULT_HTTP_BASE = 8640


@dataclass
class Ports:
    kafka: int | None           # None: the local cluster's default (9092)
    dashboard: int
    receiver: int
    reconciler: int
    agents: list[int]

    @classmethod
    def plan(cls, base_port: int | None) -> Ports:
        """The dashboard on 8642 by default; with ``--base-port P``: Kafka on P (and P+1),
        the rest from P+12 on, so two demos (or a test's) never share a port."""
        http = DEFAULT_HTTP_BASE if base_port is None else base_port + 10
        return cls(base_port, http + 2, http + 3, http + 4, [http + 5 + i for i in range(3)])

    def all_http(self) -> list[int]:
        return [self.dashboard, self.receiver, self.reconciler, *self.agents]


def agent_config(d: Path, bootstrap: str, host: str, status_port: int) -> Path:
    """One host's agent config, written through the agent's own declarations (``to_toml``
    refuses a key the agent does not have, and parses the result back)."""
    home = d / "hosts" / host
    (home / "logs").mkdir(parents=True, exist_ok=True)      # the sources' folder must exist
    path = home / "agent.toml"
    path.write_text(to_toml(
        {"agent.id": host, "agent.state_dir": str(home / "agent"),
         "buffer.size_bytes": 64 << 20, "broker.bootstrap_servers": bootstrap,
         "audit.interval_ms": 15000, "audit.window_ms": WINDOW_MS,
         "status.listen": f"127.0.0.1:{status_port}"},
        [{"type": "file", "paths": [str(home / "logs" / glob)], "topic": topic,
          "timestamp_field": "ts", "key_field": "user"} for topic, glob in TOPICS.items()]))
    return path


def reconcile_config(d: Path, bootstrap: str, ports: Ports | None = None) -> Path:
    """The demo reconciler's config: 1-minute windows judged quickly (final 4 minutes after
    they end), the three tiers in order, every alert to the demo's receiver; checked by the
    reconciler's own parser."""
    from audit.reconcile import config as rconfig

    ports = ports or Ports.plan(None)
    path = d / "reconcile.toml"
    path.write_text(
        f'[reconcile]\nbootstrap_servers = "{bootstrap}"\nevaluate_interval_ms = 10000\n'
        f'deliver_interval_ms = 2000\nlisten = "127.0.0.1:{ports.reconciler}"\n\n'
        f'[windows]\nwindow_ms = {WINDOW_MS}\ngrace_ms = {GRACE_MS}\nfinal_ms = {FINAL_MS}\n'
        f'settle_ms = 30000\ntiers = ["producer", "kafka-local", "warehouse"]\n\n'
        f'[alerts]\nlag_ms = 300000\nsilent_ms = 300000\ndefault_channels = ["demo"]\n'
        f'health_channels = ["demo"]\n\n'
        f'[channels.demo]\ntype = "webhook"\n'
        f'url = "http://127.0.0.1:{ports.receiver}/alerts"\n')
    rconfig.load(path)
    return path


# -- the parts -----------------------------------------------------------------------------

class Demo:
    """The parts of one demo folder: their commands, pids and ports, kept in ``demo.json``."""

    def __init__(self, d: Path):
        self.d = d
        self.file = d / "demo.json"
        state = json.loads(self.file.read_text()) if self.file.exists() else {}
        self.pids: dict[str, int] = state.get("pids", {})
        self.commands: dict[str, list[str]] = state.get("commands", {})
        self.ports = Ports(**state["ports"]) if "ports" in state else None
        self.bootstrap: str | None = state.get("bootstrap")

    def save(self) -> None:
        self.file.write_text(json.dumps({"pids": self.pids, "commands": self.commands,
                                         "ports": asdict(self.ports),
                                         "bootstrap": self.bootstrap}, indent=1))

    def spawn(self, name: str, cmd: list[str] | None = None) -> int:
        cmd = cmd or self.commands[name]
        with open(self.d / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True,
                                    cwd=CHECKOUT)
        self.pids[name], self.commands[name] = proc.pid, cmd
        self.save()
        return proc.pid

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 40) -> None:
        """Stop one part and everything in its session (Spark's JVM with its Python): ``sig``
        to the group, then SIGKILL to what is left of it after ``timeout_s``; it returns when
        nothing of the group runs."""
        pid = self.pids.get(name)              # the leader of its group (a session of its own)
        if pid is None or not group_alive(pid):
            return
        _signal_group(pid, sig)
        deadline = time.monotonic() + timeout_s
        while self._running(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._running(pid):
            _signal_group(pid, signal.SIGKILL)
            while self._running(pid):
                time.sleep(0.1)
        reap(pid)

    @staticmethod
    def _running(pid: int) -> bool:
        reap(pid)                       # our own child that exited: no zombie left in the group
        return group_alive(pid)

    def cluster(self) -> LocalCluster:
        return LocalCluster(self.d / "kafka")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:                  # the group ended meanwhile
        pass


def up(d: Path, base_port: int | None, detach: bool) -> int:
    if (d / "demo.json").exists():
        print(f"the demo is already running from {d} (make demo-down stops it)", file=sys.stderr)
        return 1
    d.mkdir(parents=True, exist_ok=True)
    demo = Demo(d)
    demo.ports = ports = Ports.plan(base_port)
    layout = demo.cluster().up(brokers=1, base_port=base_port)
    demo.bootstrap = bootstrap = layout.bootstrap_servers
    demo.save()
    ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in TOPICS])
    ensure_audit_topic(bootstrap)
    jobs = ["--bootstrap-servers", bootstrap, "--trigger-s", "20", "--window-ms",
            str(WINDOW_MS), "--topics", TOPIC_PATTERN]
    rconf, rdb = reconcile_config(d, bootstrap, ports), d / "reconcile.db"
    demo.spawn("receiver", [sys.executable, "-m", "demo.receiver", str(ports.receiver),
                            str(d / "alerts.jsonl")])
    for i, host in enumerate(HOSTS):
        config = agent_config(d, bootstrap, host, ports.agents[i])
        demo.spawn(f"app-{host}", [sys.executable, "-m", "demo.generator",
                                   str(config.parent / "logs"), "--rate", str(RATE),
                                   "--seed", str(i)])
        demo.spawn(f"agent-{host}", [str(BIN / "docket-agent"), "run", "--config", str(config)])
    demo.spawn("count", [str(BIN / "docket-audit"), "count", "--cluster", "kafka-local", *jobs,
                         "--checkpoint-dir", str(d / "checkpoint-count")])
    demo.spawn("land", [str(BIN / "docket-audit"), "land", "--warehouse", str(d / "warehouse"),
                        *jobs])
    demo.spawn("reconcile", [str(BIN / "docket-audit"), "reconcile", "--db", str(rdb),
                             "--config", str(rconf)])
    deadline = time.monotonic() + 60                 # the dashboard reads what it writes
    while not rdb.exists() and time.monotonic() < deadline and alive(demo.pids["reconcile"]):
        time.sleep(0.5)
    demo.spawn("dashboard", [str(BIN / "docket-dashboard"), "--db", str(rdb), "--listen",
                             f"127.0.0.1:{ports.dashboard}"])
    time.sleep(3)
    dead = [n for n, pid in demo.pids.items() if not alive(pid)]
    if dead:
        print(f"exited at once: {', '.join(dead)} (see {d}/<part>.log)", file=sys.stderr)
    url = f"http://127.0.0.1:{ports.dashboard}/"
    print(f"""docket demo running from {d}
  dashboard        {url}
  Kafka            {bootstrap}
  hosts            {', '.join(HOSTS)}: an application writing {', '.join(
        g.rstrip('*') for g in TOPICS.values())} (rotated), and its agent
                   (docket-agent status --config {d}/hosts/web-1/agent.toml)
  cluster audit    Spark, counts every 20 s             ({d}/count.log)
  warehouse        Spark, lands Parquet and counts it   ({d}/land.log)
  reconciler       1-minute windows, final {FINAL_MS // 60000} minutes after they end
  alert receiver   http://127.0.0.1:{ports.receiver}/alerts  ({d}/alerts.jsonl)

Open {url} : the cells fill in as the tiers report (the Spark jobs need a minute or two to
start). In another terminal, `make demo-fault` breaks things and shows what docket sees;
`.venv/bin/docket-audit show --db {rdb}` is the command-line view.
Stop everything: Ctrl-C here, or make demo-down.""", flush=True)
    if detach:
        return 0
    return watch(demo)


def watch(demo: Demo) -> int:
    """A line per part every 10 s until Ctrl-C/SIGTERM (then stop them all) or until
    ``demo down`` elsewhere removed ``demo.json``."""
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(1))
    while not stopping and demo.file.exists():
        lines = status_lines(demo)
        if sys.stdout.isatty():
            print("\x1b[J" + "\n".join(lines) + f"\x1b[{len(lines)}A\r", end="", flush=True)
        else:
            print("\n".join(lines) + "\n", flush=True)
        for _ in range(50):
            if stopping or not demo.file.exists():
                break
            time.sleep(0.2)
    if sys.stdout.isatty():
        print("\x1b[J", end="")
    if stopping:
        print("\nstopping the demo …", flush=True)
        return down(demo.d)
    print("the demo was stopped", flush=True)
    return 0


def _get(port: int, path: str):
    try:
        r = requests.get(f"http://127.0.0.1:{port}{path}", timeout=2)
        return r.json() if r.ok else None
    except (requests.RequestException, ValueError):
        return None


def status_lines(demo: Demo) -> list[str]:
    """One line per part: up or down, and what it is doing."""
    ports, out = demo.ports, []
    broker = demo.cluster().pid(1)
    out.append(f"{time.strftime('%H:%M:%S')}  Kafka        "
               f"{'up' if broker else 'DOWN'}  {demo.bootstrap}")
    for i, host in enumerate(HOSTS):
        st = _get(ports.agents[i], "/status")
        app = "writing" if alive(demo.pids.get(f"app-{host}", 0)) else "app stopped"
        if st is None:
            state = "starting" if alive(demo.pids.get(f"agent-{host}", 0)) else "DOWN"
            out.append(f"          agent {host}  {state}  ({app})")
            continue
        r = st["rates"]
        out.append(f"          agent {host}  up  in {r.get('in_events_s', 0):.0f}/s out "
                   f"{r.get('out_events_s', 0):.0f}/s, backlog {st['backlog']['events']}, "
                   f"broker {st['broker']['state']}, loss journal "
                   f"{st['loss_journal']['entries']} ({app})")
    health = _get(ports.dashboard, "/api/health") or {}
    newest = {t["tier"]: t.get("newest_window") for t in health.get("tiers", [])}
    for name, tier in (("count", "kafka-local"), ("land", "warehouse")):
        state = "up" if alive(demo.pids.get(name, 0)) else "DOWN"
        out.append(f"          {name:12} {state}  newest {tier} window: "
                   f"{newest.get(tier) or 'none yet'}")
    alerts = _get(ports.dashboard, "/api/alerts?status=open")
    rec = "up" if alive(demo.pids.get("reconcile", 0)) else "DOWN"
    out.append(f"          reconciler   {rec}  open alerts: "
               f"{'?' if alerts is None else len(alerts['alerts'])}")
    dash = "up" if alerts is not None else "DOWN"
    out.append(f"          dashboard    {dash}  http://127.0.0.1:{ports.dashboard}/")
    got = received(demo.d / "alerts.jsonl")
    out.append(f"          receiver     {'up' if alive(demo.pids.get('receiver', 0)) else 'DOWN'}"
               f"  {len(got)} alert notification(s) received")
    return out


def down(d: Path) -> int:
    demo = Demo(d)
    for name in list(demo.pids):
        if alive(demo.pids[name]):
            demo.stop(name)
            print(f"stopped {name}")
    demo.file.unlink(missing_ok=True)
    if (d / "kafka").exists():
        demo.cluster().down()
        print("stopped Kafka")
    return 0


# -- the fault drills ----------------------------------------------------------------------

def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def drill_pause(demo: Demo) -> None:
    _say("broker pause: Kafka frozen (SIGSTOP) for 30 s; the agents keep reading into their "
         "pools")
    cluster = demo.cluster()
    cluster.pause_node(1)
    try:
        time.sleep(30)
    finally:
        cluster.resume_node(1)
    _say("broker resumed: the agents drain their backlog; nothing is lost, the cells stay green")


def drill_kill(demo: Demo) -> None:
    _say("agent SIGKILL: web-2's agent killed mid-stream, started again 5 s later")
    demo.stop("agent-web-2", signal.SIGKILL)
    time.sleep(5)
    demo.spawn("agent-web-2")
    _say("web-2's agent recovered its pool: sealed slots go again (a few duplicates, counted "
         "as such), nothing is lost")


def _count_job_committed(d: Path) -> dict[tuple[str, int], int]:
    """The Kafka offsets the count job has finished (its checkpoint's last committed batch)."""
    ckpt = d / "checkpoint-count" / "count"        # the count query's own folder
    done = [int(p.name) for p in (ckpt / "commits").glob("[0-9]*")] if ckpt.exists() else []
    if not done:
        return {}
    lines = (ckpt / "offsets" / str(max(done))).read_text().splitlines()
    out = {}
    for line in lines[2:]:
        for topic, parts in json.loads(line).items():
            out.update({(topic, int(p)): off for p, off in parts.items()})
    return out


def drill_delete_records(demo: Demo) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    _say("records deleted: the warehouse job is stopped, 20 s of app.events partition 0 are "
         "counted by the cluster job, then deleted from Kafka before the warehouse job reads "
         "them")
    demo.stop("land")
    try:
        time.sleep(20)
        consumer = Consumer({"bootstrap.servers": demo.bootstrap, "group.id": "docket-demo-fault"})
        tp = TopicPartition("app.events", 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.close()
        deadline = time.monotonic() + 180
        while _count_job_committed(demo.d).get(("app.events", 0), -1) < high:
            if time.monotonic() > deadline:
                raise BrokerError("the cluster count job did not reach the offsets to delete in "
                                  f"3 minutes; see {demo.d}/count.log")
            time.sleep(2)
        admin = AdminClient({"bootstrap.servers": demo.bootstrap})
        for _tp, future in admin.delete_records([TopicPartition("app.events", 0, high)]).items():
            future.result(30)
        _say(f"deleted app.events partition 0 up to offset {high} ({high - low} records); the "
             "warehouse job starts again where it stopped and finds the rest of them gone")
    finally:                                     # never leave the job stopped
        demo.spawn("land")


def drill_delete_log(demo: Demo) -> None:
    _say("log deleted: web-3's agent is stopped, its application goes on writing for 15 s, "
         "rotates, and the rotated files are deleted before the agent comes back")
    demo.stop("agent-web-3")
    try:
        time.sleep(15)
        logs = demo.d / "hosts" / "web-3" / "logs"
        before = {p.name: p.stat().st_ino for p in logs.glob("*.log")}
        os.kill(demo.pids["app-web-3"], signal.SIGUSR1)
        deadline = time.monotonic() + 30
        rotated = [logs / f"{n}.1" for n in before]
        while not all(p.exists() and p.stat().st_ino == before[p.name[:-2]] for p in rotated):
            if time.monotonic() > deadline:
                raise BrokerError(f"web-3's application did not rotate its logs "
                                  f"({demo.d}/app-web-3.log)")
            time.sleep(0.2)
        for p in rotated:
            p.unlink()
    finally:
        demo.spawn("agent-web-3")
    _say(f"deleted {', '.join(p.name for p in rotated)} unread; only web-3's loss journal knows "
         "(deleted_unread, unknown size)")


DRILLS = {"pause": drill_pause, "kill": drill_kill, "delete-records": drill_delete_records,
          "delete-log": drill_delete_log}
# What each real loss must raise at the receiver: (kind, tier, origin or None: any host).
EXPECTED = {"delete-records": ("loss", "warehouse", None),
            "delete-log": ("loss", "producer", "web-3")}


def fault(d: Path, only: str | None, wait_s: float) -> int:
    demo = Demo(d)
    if not demo.pids:
        print(f"no demo is running from {d} (make demo starts one)", file=sys.stderr)
        return 1
    seen = len(received(d / "alerts.jsonl"))
    names = [only] if only else list(DRILLS)
    for name in names:
        DRILLS[name](demo)
    wanted = [EXPECTED[n] for n in names if n in EXPECTED]
    if not wanted:
        return 0
    _say(f"waiting up to {wait_s:.0f} s for the alerts (a 1-minute window is judged "
         f"{GRACE_MS // 60000} minutes after it ends); the dashboard's cells turn red")
    deadline = time.monotonic() + wait_s
    while wanted and time.monotonic() < deadline:
        got = received(d / "alerts.jsonl")[seen:]
        for alert in got:
            print(f"  receiver got: {describe(alert)}", flush=True)
            for w in list(wanted):
                if isinstance(alert, dict) and alert.get("event") == "firing" and \
                        (alert.get("kind"), alert.get("tier")) == w[:2] and \
                        w[2] in (None, alert.get("origin")):
                    wanted.remove(w)
        seen += len(got)
        time.sleep(2)
    if wanted:
        print(f"not received in {wait_s:.0f} s: {wanted}", file=sys.stderr)
        return 1
    _say("every loss was caught and delivered to the receiver")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo")
    p.add_argument("command", choices=("up", "down", "fault", "status"))
    p.add_argument("--dir", type=Path, default=docket_state_dir("demo"))
    p.add_argument("--base-port", type=int, default=None)
    p.add_argument("--detach", action="store_true", help="up: return once it runs")
    p.add_argument("--only", choices=list(DRILLS), help="fault: this drill only")
    p.add_argument("--wait-s", type=float, default=600, help="fault: how long to wait for alerts")
    args = p.parse_args(argv)
    try:
        if args.command == "up":
            return up(args.dir, args.base_port, args.detach)
        if args.command == "fault":
            return fault(args.dir, args.only, args.wait_s)
        if args.command == "status":
            demo = Demo(args.dir)
            if demo.ports is None:
                print(f"no demo is running from {args.dir}", file=sys.stderr)
                return 1
            print("\n".join(status_lines(demo)))
            return 0
        return down(args.dir)
    except BrokerError as exc:
        print_error(exc, "demo")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
