"""``make demo``: the docket pipeline running on this machine, end to end, in LinkedIn's shape.

``python -m demo up`` (from the checkout) starts, under ``$XDG_STATE_HOME/docket/demo`` (or
``--dir``), every part on 127.0.0.1: two Apache Kafka clusters of 1 broker, ``local`` (where
the agents write; port 9092, or ``--base-port``) and ``aggregate`` (2 ports above), with
MirrorMaker 2 and its watcher copying the data topics and the audit topic from the first to the
second (``broker.mirror``); three simulated hosts (``web-1`` … ``web-3``: each an application
writing rotated JSON logs, ``demo.generator``, and an agent of its own with its own id, pool and
state); a Spark count job on each cluster (tiers ``kafka-local`` and ``kafka-aggregate``, the
aggregate's fed by the mirror) and the warehouse landing job reading the aggregate; the
reconciler reading the audit topic on the aggregate with 1-minute windows and the tier graph
producer → kafka-local → kafka-aggregate → warehouse; the dashboard; and an alert receiver
(``demo.receiver``) that the reconciler notifies. Each part runs in a session of its own, its
output in ``<part>.log``; what was started is in ``demo.json``. ``up`` then shows a live line
per part until Ctrl-C, which stops them all (``--detach``: return at once). ``python -m demo
down`` stops them from anywhere, the mirror and both clusters included.

``python -m demo fault`` runs the drills in turn (``--only`` some of them): a 30 s pause of the
local broker and an agent SIGKILL (nothing lost), then three real losses: records deleted from
the aggregate before the warehouse job read them, a log file deleted while its agent was
stopped, and the mirror stopped while records of web-2 age out of the local cluster before it
copied them. It waits for the alerts they should raise and prints them as the receiver got them.
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
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import DEFAULT_BASE_PORT, LocalCluster
from broker.errors import BrokerError
from broker.mirror import Mirror, MirrorSpec
from docket_common.dirs import docket_state_dir
from docket_common.errors import print_error
from docket_common.names import AUDIT_TOPIC
from docket_common.procs import alive, group_alive, reap

from .receiver import describe, received

HOSTS = ("web-1", "web-2", "web-3")
TOPICS = {"app.events": "app.log*", "web.access": "access.log*",
          "pay.transactions": "payments.log*"}
TOPIC_PATTERN = r"app\.events|web\.access|pay\.transactions"
LOCAL, AGGREGATE = "local", "aggregate"     # the clusters (MirrorMaker 2's aliases)
CLUSTERS = (LOCAL, AGGREGATE)
LAND_FROM = AGGREGATE                       # the cluster the warehouse lands from
TIERS = ("producer", "kafka-local", "kafka-aggregate", "warehouse")
GRAPH = {"kafka-local": ["producer"], "kafka-aggregate": ["kafka-local"],
         "warehouse": ["kafka-aggregate"]}   # [tiers.NAME] fed_by (docs/topology.md)
WINDOW_MS = 60_000          # every tier counts in 1-minute windows: verdicts within minutes
GRACE_MS, FINAL_MS = 120_000, 240_000
RATE = 100                  # lines per second per host
BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[1]       # where ``python -m demo.…`` runs
DEFAULT_HTTP_BASE = 8640


def tier(cluster: str) -> str:
    """The tier a cluster's count job reports under: ``kafka-local``, ``kafka-aggregate``."""
    return f"kafka-{cluster}"


def hop(to: str) -> str:
    """``kafka-local → kafka-aggregate``: the hop into tier ``to``, as the reconciler's loss
    alerts name it (detail ``hop``)."""
    return f"{' + '.join(GRAPH[to])} → {to}"


@dataclass
class Ports:
    kafka: int | None           # the local cluster's first port; None: its default (9092)
    dashboard: int
    receiver: int
    reconciler: int
    agents: list[int]
    aggregate: int | None = None   # the aggregate cluster's first port (None: a demo from
                                   # before it had one)

    @classmethod
    def plan(cls, base_port: int | None) -> Ports:
        """The dashboard on 8642 by default; with ``--base-port P``: the local Kafka on P (and
        P+1), the aggregate on P+2 (and P+3), the rest from P+12 on to P+17, so two demos (or a
        test's) whose base ports are 18 or more apart never share a port."""
        http = DEFAULT_HTTP_BASE if base_port is None else base_port + 10
        return cls(base_port, http + 2, http + 3, http + 4, [http + 5 + i for i in range(3)],
                   aggregate=(base_port or DEFAULT_BASE_PORT) + 2)

    def cluster(self, name: str) -> int | None:
        """The first port (its broker's; the controller's is the next) of cluster ``name``."""
        return self.kafka if name == LOCAL else self.aggregate

    def all(self) -> list[int]:
        """Every port the demo binds: each cluster's broker and controller, then HTTP."""
        kafka = [self.cluster(c) or DEFAULT_BASE_PORT for c in CLUSTERS]
        return [p for first in kafka for p in (first, first + 1)] + \
            [self.dashboard, self.receiver, self.reconciler, *self.agents]


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
    """The demo reconciler's config: the audit topic on ``bootstrap`` (the aggregate's, where
    every tier's counts meet), 1-minute windows judged quickly (final 4 minutes after they
    end), the tier graph, every alert to the demo's receiver; checked by the reconciler's own
    parser."""
    from audit.reconcile import config as rconfig

    ports = ports or Ports.plan(None)
    graph = "".join(f'\n[tiers.{t}]\nfed_by = {json.dumps(f)}\n' for t, f in GRAPH.items())
    path = d / "reconcile.toml"
    path.write_text(
        f'[reconcile]\nbootstrap_servers = "{bootstrap}"\nevaluate_interval_ms = 10000\n'
        f'deliver_interval_ms = 2000\nlisten = "127.0.0.1:{ports.reconciler}"\n\n'
        f'[windows]\nwindow_ms = {WINDOW_MS}\ngrace_ms = {GRACE_MS}\nfinal_ms = {FINAL_MS}\n'
        f'settle_ms = 30000\ntiers = {json.dumps(list(TIERS))}\n{graph}\n'
        f'[alerts]\nlag_ms = 300000\nsilent_ms = 300000\ndefault_channels = ["demo"]\n'
        f'health_channels = ["demo"]\n\n'
        f'[channels.demo]\ntype = "webhook"\n'
        f'url = "http://127.0.0.1:{ports.receiver}/alerts"\n')
    rconfig.load(path)
    return path


def mirror_spec(clusters: dict[str, str]) -> MirrorSpec:
    """MirrorMaker 2 from the local cluster to the aggregate: the data topics and the audit
    topic (``clusters``: name → bootstrap servers)."""
    return MirrorSpec(LOCAL, AGGREGATE, clusters[LOCAL], clusters[AGGREGATE], TOPIC_PATTERN,
                      audit_topic=AUDIT_TOPIC)


def job_commands(d: Path, clusters: dict[str, str]) -> dict[str, list[str]]:
    """The Spark jobs, by part name: a count job per cluster (``count-local``,
    ``count-aggregate``) and the warehouse's ``land`` from ``LAND_FROM``. A job reading the
    aggregate knows it is a mirror's target (``--mirror-target``)."""
    def reading(cluster: str) -> list[str]:
        mirrored = ["--mirror-target", cluster] if cluster != LOCAL else []
        return ["--bootstrap-servers", clusters[cluster], "--trigger-s", "20", "--window-ms",
                str(WINDOW_MS), "--topics", TOPIC_PATTERN, *mirrored]
    audit = str(BIN / "docket-audit")
    jobs = {f"count-{c}": [audit, "count", "--cluster", tier(c), *reading(c),
                           "--checkpoint-dir", str(d / f"checkpoint-count-{c}")]
            for c in CLUSTERS}
    jobs["land"] = [audit, "land", "--warehouse", str(d / "warehouse"), *reading(LAND_FROM)]
    return jobs


# -- the parts -----------------------------------------------------------------------------

class Demo:
    """The parts of one demo folder: their commands, pids and ports, kept in ``demo.json``;
    its two clusters (``DIR/clusters/NAME``) and its mirror (``DIR/mirror``)."""

    def __init__(self, d: Path):
        self.d = d
        self.file = d / "demo.json"
        state = json.loads(self.file.read_text()) if self.file.exists() else {}
        self.pids: dict[str, int] = state.get("pids", {})
        self.commands: dict[str, list[str]] = state.get("commands", {})
        self.ports = Ports(**state["ports"]) if "ports" in state else None
        self.clusters: dict[str, str] = state.get("clusters", {})   # name → bootstrap

    def save(self) -> None:
        self.file.write_text(json.dumps({"pids": self.pids, "commands": self.commands,
                                         "ports": asdict(self.ports),
                                         "clusters": self.clusters}, indent=1))

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
        to the group (continued first: a paused process cannot act on SIGTERM), then SIGKILL
        to what is left of it after ``timeout_s``; it returns when nothing of the group runs."""
        pid = self.pids.get(name)              # the leader of its group (a session of its own)
        if pid is None or not group_alive(pid):
            return
        _signal_group(pid, signal.SIGCONT)
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

    def cluster(self, name: str) -> LocalCluster:
        return LocalCluster(self.d / "clusters" / name)

    def mirror(self) -> Mirror:
        return Mirror(self.d / "mirror")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:                  # the group ended meanwhile
        pass


def start(demo: Demo) -> None:
    """Start every part, in ``demo.ports``: the clusters and their topics, the mirror, the
    receiver, the hosts, the Spark jobs, the reconciler and the dashboard."""
    d, ports = demo.d, demo.ports
    for name in CLUSTERS:
        layout = demo.cluster(name).up(brokers=1, base_port=ports.cluster(name))
        demo.clusters[name] = layout.bootstrap_servers
        demo.save()
    local, aggregate = demo.clusters[LOCAL], demo.clusters[AGGREGATE]
    ensure_topics(local, [TopicSpec(t, partitions=3) for t in TOPICS])
    for bootstrap in (local, aggregate):        # the aggregate's jobs write there from the start
        ensure_audit_topic(bootstrap)
    # MirrorMaker 2 first: the agents' reports reach the aggregate as they are written (copied
    # minutes late, they would read as clocks behind the broker's), and no Spark JVM starting
    # beside it on a small machine keeps it from joining the aggregate.
    demo.mirror().up(mirror_spec(demo.clusters), timeout_s=300)
    rconf, rdb = reconcile_config(d, aggregate, ports), d / "reconcile.db"
    demo.spawn("receiver", [sys.executable, "-m", "demo.receiver", str(ports.receiver),
                            str(d / "alerts.jsonl")])
    for i, host in enumerate(HOSTS):
        config = agent_config(d, local, host, ports.agents[i])
        demo.spawn(f"app-{host}", [sys.executable, "-m", "demo.generator",
                                   str(config.parent / "logs"), "--rate", str(RATE),
                                   "--seed", str(i)])
        demo.spawn(f"agent-{host}", [str(BIN / "docket-agent"), "run", "--config", str(config)])
    for name, cmd in job_commands(d, demo.clusters).items():
        demo.spawn(name, cmd)
    demo.spawn("reconcile", [str(BIN / "docket-audit"), "reconcile", "--db", str(rdb),
                             "--config", str(rconf)])
    deadline = time.monotonic() + 60                 # the dashboard reads what it writes
    while not rdb.exists() and time.monotonic() < deadline and alive(demo.pids["reconcile"]):
        time.sleep(0.5)
    demo.spawn("dashboard", [str(BIN / "docket-dashboard"), "--db", str(rdb), "--config",
                             str(rconf), "--listen", f"127.0.0.1:{ports.dashboard}"])
    time.sleep(3)
    dead = [n for n, pid in demo.pids.items() if not alive(pid)]
    if dead:
        print(f"exited at once: {', '.join(dead)} (see {d}/<part>.log)", file=sys.stderr)


def up(d: Path, base_port: int | None, detach: bool) -> int:
    if (d / "demo.json").exists():
        print(f"the demo is already running from {d} (make demo-down stops it)", file=sys.stderr)
        return 1
    d.mkdir(parents=True, exist_ok=True)
    demo = Demo(d)
    demo.ports = Ports.plan(base_port)
    try:
        start(demo)
    except BaseException:                         # nothing left half started
        print("the demo did not start; stopping what it started", file=sys.stderr)
        down(d)
        raise
    ports, rdb = demo.ports, d / "reconcile.db"
    local, aggregate = demo.clusters[LOCAL], demo.clusters[AGGREGATE]
    url = f"http://127.0.0.1:{ports.dashboard}/"
    print(f"""docket demo running from {d}
  dashboard        {url}
  Kafka local      {local}  (the agents write here)
  Kafka aggregate  {aggregate}  (the reconciler reads the audit topic here)
  mirror           MirrorMaker 2 copying the data and the audit topic, local → aggregate,
                   with its watcher ({d}/mirror/logs/mirror.log)
  hosts            {', '.join(HOSTS)}: an application writing {', '.join(
        g.rstrip('*') for g in TOPICS.values())} (rotated), and its agent
                   (docket-agent status --config {d}/hosts/web-1/agent.toml)
  count jobs       Spark, on each cluster, every 20 s  ({d}/count-local.log, count-aggregate.log)
  warehouse        Spark, lands the aggregate as Parquet and counts it  ({d}/land.log)
  reconciler       1-minute windows, final {FINAL_MS // 60000} minutes after they end, tiers
                   {' → '.join(TIERS)}
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
    for i, name in enumerate(CLUSTERS):
        broker = demo.cluster(name).pid(1)
        when = time.strftime('%H:%M:%S') if i == 0 else ""
        out.append(f"{when:8}  Kafka {name:10} {'up' if broker else 'DOWN'}  "
                   f"{demo.clusters.get(name, '?')}")
    mirror = demo.mirror().status()
    if mirror is None:
        out.append("          mirror           DOWN  (never started)")
    else:
        out.append(f"          mirror           {'DOWN' if mirror['pid'] is None else 'up'}  "
                   f"{mirror['source']} → {mirror['target']}, watcher "
                   f"{'DOWN' if mirror['watch_pid'] is None else 'up'}")
    for i, host in enumerate(HOSTS):
        st = _get(ports.agents[i], "/status")
        app = "writing" if alive(demo.pids.get(f"app-{host}", 0)) else "app stopped"
        if st is None:
            state = "starting" if alive(demo.pids.get(f"agent-{host}", 0)) else "DOWN"
            out.append(f"          agent {host}      {state}  ({app})")
            continue
        r = st["rates"]
        out.append(f"          agent {host}      up  in {r.get('in_events_s', 0):.0f}/s out "
                   f"{r.get('out_events_s', 0):.0f}/s, backlog {st['backlog']['events']}, "
                   f"broker {st['broker']['state']}, loss journal "
                   f"{st['loss_journal']['entries']} ({app})")
    health = _get(ports.dashboard, "/api/health") or {}
    newest = {t["tier"]: t.get("newest_window") for t in health.get("tiers", [])}
    jobs = [(f"count-{c}", tier(c)) for c in CLUSTERS] + [("land", "warehouse")]
    for name, shown in jobs:
        state = "up" if alive(demo.pids.get(name, 0)) else "DOWN"
        out.append(f"          {name:16} {state}  newest {shown} window: "
                   f"{newest.get(shown) or 'none yet'}")
    alerts = _get(ports.dashboard, "/api/alerts?status=open")
    rec = "up" if alive(demo.pids.get("reconcile", 0)) else "DOWN"
    out.append(f"          reconciler       {rec}  open alerts: "
               f"{'?' if alerts is None else len(alerts['alerts'])}")
    dash = "up" if alerts is not None else "DOWN"
    out.append(f"          dashboard        {dash}  http://127.0.0.1:{ports.dashboard}/")
    got = received(demo.d / "alerts.jsonl")
    out.append(f"          receiver         "
               f"{'up' if alive(demo.pids.get('receiver', 0)) else 'DOWN'}"
               f"  {len(got)} alert notification(s) received")
    return out


def down(d: Path) -> int:
    demo = Demo(d)
    for name in list(demo.pids):
        if alive(demo.pids[name]):
            demo.stop(name)
            print(f"stopped {name}")
    demo.file.unlink(missing_ok=True)
    mirror = demo.mirror()
    if mirror.spec() is not None:
        mirror.down()
        print(f"stopped the mirror {LOCAL} → {AGGREGATE}")
    # Each cluster the demo started (``kafka``: a demo from before it had two).
    for folder in [*sorted((d / "clusters").glob("*")), d / "kafka"]:
        if (folder / "cluster.json").is_file():
            LocalCluster(folder).down()
            print(f"stopped Kafka {folder.name}")
    return 0


# -- the fault drills ----------------------------------------------------------------------

def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def drill_pause(demo: Demo) -> None:
    _say("broker pause: the local Kafka frozen (SIGSTOP) for 30 s; the agents keep reading "
         "into their pools, the mirror waits")
    cluster = demo.cluster(LOCAL)
    cluster.pause_node(1)
    try:
        time.sleep(30)
    finally:
        cluster.resume_node(1)
    _say("broker resumed: the agents drain their backlog, the mirror copies it; nothing is "
         "lost, the cells stay green")


def drill_kill(demo: Demo) -> None:
    _say("agent SIGKILL: web-2's agent killed mid-stream, started again 5 s later")
    demo.stop("agent-web-2", signal.SIGKILL)
    time.sleep(5)
    demo.spawn("agent-web-2")
    _say("web-2's agent recovered its pool: sealed slots go again (a few duplicates, counted "
         "as such), nothing is lost")


def _count_job_committed(d: Path, cluster: str) -> dict[tuple[str, int], int]:
    """The Kafka offsets ``cluster``'s count job has finished (its checkpoint's last committed
    batch)."""
    ckpt = d / f"checkpoint-count-{cluster}" / "count"      # the count query's own folder
    done = [int(p.name) for p in (ckpt / "commits").glob("[0-9]*")] if ckpt.exists() else []
    if not done:
        return {}
    lines = (ckpt / "offsets" / str(max(done))).read_text().splitlines()
    out = {}
    for line in lines[2:]:
        for topic, parts in json.loads(line).items():
            out.update({(topic, int(p)): off for p, off in parts.items()})
    return out


def _wait_counted(demo: Demo, cluster: str, topic: str, partition: int, offset: int) -> None:
    """Until ``cluster``'s count job has counted ``topic``'s ``partition`` up to ``offset``."""
    deadline = time.monotonic() + 180
    while _count_job_committed(demo.d, cluster).get((topic, partition), -1) < offset:
        if time.monotonic() > deadline:
            raise BrokerError(f"the {cluster} cluster's count job did not reach the offsets to "
                              f"delete in 3 minutes; see {demo.d}/count-{cluster}.log")
        time.sleep(2)


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "docket-demo-fault"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        consumer.close()


def _delete_below(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """Delete the records of ``topic``'s ``partition`` below ``offset`` (what retention does to
    old segments, at once: the admin API's delete records)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})  # not its notices
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(30)


def drill_delete_records(demo: Demo) -> None:
    bootstrap = demo.clusters[LAND_FROM]
    _say(f"records deleted: the warehouse job is stopped, 20 s of app.events partition 0 are "
         f"counted by the {LAND_FROM} cluster's job, then deleted from that cluster before the "
         f"warehouse job reads them")
    demo.stop("land")
    try:
        time.sleep(20)
        low, high = _watermarks(bootstrap, "app.events", 0)
        _wait_counted(demo, LAND_FROM, "app.events", 0, high)
        _delete_below(bootstrap, "app.events", 0, high)
        _say(f"deleted app.events partition 0 up to offset {high} ({high - low} records) on the "
             f"{LAND_FROM} cluster; the warehouse job starts again where it stopped and finds "
             "the rest of them gone")
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


# -- the mirror drill ------------------------------------------------------------------------

MIRROR_STOP_S = 150         # the mirror stays stopped this long: a few 1-minute windows
ALONE_S = 30                # web-2 alone writes this long, its records then deleted uncopied
LOST_ORIGIN, LOST_TOPIC = "web-2", "app.events"
Identity = tuple[str, str, int]      # (origin, incarnation, record number): one record


def _identity(msg) -> Identity:
    h = dict(msg.headers() or [])
    return (h.get("docket-origin", b"").decode(), h.get("docket-incarnation", b"").decode(),
            int.from_bytes(h.get("docket-seq", b""), "big"))


def _records(bootstrap: str, topic: str, partition: int, start: int | None = None,
             end: int | None = None, since_ms: int | None = None
             ) -> list[tuple[Identity, int]]:
    """(identity, timestamp) of each record of ``topic``'s ``partition`` from offset ``start``
    (or from the first record stamped ``since_ms`` or later) to offset ``end`` (default: its
    end now)."""
    from confluent_kafka import Consumer, TopicPartition

    from docket_common.read_to_end import read_to_ends

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "docket-demo-fault",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        if end is None:
            _low, end = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=10)
        if start is None:
            [found] = consumer.offsets_for_times([TopicPartition(topic, partition, since_ms)],
                                                 timeout=10)
            start = end if found.offset < 0 else found.offset
        consumer.assign([TopicPartition(topic, partition, start)])
        out: list[tuple[Identity, int]] = []
        if read_to_ends(consumer, topic, {partition: end},
                        lambda msg: out.append((_identity(msg), msg.timestamp()[1])), 60):
            raise BrokerError(f"{topic} partition {partition} not read to offset {end} in 60 s")
        return out
    finally:
        consumer.close()


def lost_by_window(held: list[tuple[Identity, int]], copied: set[Identity]
                   ) -> dict[int, list[int]]:
    """window start → the record numbers of the records ``held`` (identity, timestamp) that are
    not among the ``copied``: lost at the hop once the local cluster drops them."""
    out: dict[int, list[int]] = {}
    for ident, ts in held:
        if ident not in copied:
            out.setdefault(ts // WINDOW_MS * WINDOW_MS, []).append(ident[2])
    return {w: sorted(ns) for w, ns in sorted(out.items())}


def ranges(numbers: list[int]) -> list[list[int]]:
    """``[[a, b], …]``: sorted ``numbers`` as runs, as an alert's ``missing_ranges`` lists them."""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        elif not out or n > out[-1][1]:
            out.append([n, n])
    return out


def _wait_drained(demo: Demo, hosts: list[str], timeout_s: float = 120) -> None:
    """Until the agents of ``hosts`` have sent every event they read, and read nothing more
    for 2 s (their applications paused: the files are read to their last whole line)."""
    before: dict[str, int | None] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        now = {}
        for host in hosts:
            st = _get(demo.ports.agents[HOSTS.index(host)], "/status")
            now[host] = None if st is None or st["backlog"]["events"] else \
                st["totals"]["read_events"]
        if now == before and None not in now.values():
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"the agents of {', '.join(hosts)} did not send what they read "
                              f"in {timeout_s:.0f} s", hint=f"see {demo.d}/agent-*.log")
        before = now
        time.sleep(2)


def _losses_since(demo: Demo, since_ms: int, tiers: tuple[str, ...]) -> list[dict]:
    """The loss alerts at ``tiers`` fired since ``since_ms`` (the reconciler's database, through
    the dashboard's API: fired, delivered or not)."""
    got = _get(demo.ports.dashboard, "/api/alerts?status=all")
    if got is None:
        raise BrokerError("the dashboard does not answer: cannot tell which alerts fired",
                          hint=f"see {demo.d}/dashboard.log")
    return [a for a in got["alerts"] if a["kind"] == "loss" and a["tier"] in tiers
            and a["fired_at"] >= since_ms]


def _states(demo: Demo, tier_: str, topic: str, since_ms: int) -> dict[str, str]:
    """Window (UTC, HH:MM) → the state of ``tier_`` on ``topic``, of the windows from
    ``since_ms`` on, as the dashboard shows them."""
    got = _get(demo.ports.dashboard, f"/api/completeness?tier={tier_}&topic={topic}&range=1h")
    cells = ((got or {}).get("topics") or {}).get(topic, {})
    return {time.strftime("%H:%M", time.gmtime(int(w) / 1000)): c["state"]
            for w, c in sorted(cells.items(), key=lambda wc: int(wc[0])) if int(w) >= since_ms}


def drill_mirror(demo: Demo) -> None:
    """The mirror stopped longer than the local cluster keeps a stretch of web-2's records:
    ``kafka-local`` counted them, ``kafka-aggregate`` never gets them. To make it one host's
    loss, web-1's and web-3's applications pause (SIGSTOP) until the mirror has copied what
    they wrote, so that app.events partition 0 then holds only web-2's records past it."""
    local, aggregate = demo.clusters[LOCAL], demo.clusters[AGGREGATE]
    others = [h for h in HOSTS if h != LOST_ORIGIN]
    mirror = demo.mirror()
    _say(f"mirror stopped: {' and '.join(others)} pause their applications, MirrorMaker 2 is "
         f"stopped for {MIRROR_STOP_S} s, and {ALONE_S} s of {LOST_ORIGIN}'s {LOST_TOPIC} "
         f"records in partition 0 are deleted on the local cluster before it could copy them")
    paused_ms = int(time.time() * 1000)
    apps = [demo.pids[f"app-{h}"] for h in others]
    stopped_at = None
    try:
        for pid in apps:
            os.kill(pid, signal.SIGSTOP)
        _wait_drained(demo, others)
        _low, first = _watermarks(local, LOST_TOPIC, 0)    # past here: web-2's records only
        [(last, _ts)] = _records(local, LOST_TOPIC, 0, start=first - 1, end=first)
        deadline = time.monotonic() + 120
        while last not in {i for i, _ts in _records(aggregate, LOST_TOPIC, 0,
                                                    since_ms=paused_ms - 120_000)}:
            if time.monotonic() > deadline:
                raise BrokerError(f"the mirror did not copy {LOST_TOPIC} partition 0 to offset "
                                  f"{first} in 2 minutes", hint=f"see {mirror.log_file}")
            time.sleep(2)
        stopped_at = time.monotonic()
        stopped_ms = int(time.time() * 1000)
        mirror.down()
        _say(f"the mirror is stopped; only {LOST_ORIGIN} writes for {ALONE_S} s")
        time.sleep(ALONE_S)
        _low, high = _watermarks(local, LOST_TOPIC, 0)
        for pid in apps:
            os.kill(pid, signal.SIGCONT)
        apps = []
        _wait_counted(demo, LOCAL, LOST_TOPIC, 0, high)
        held = _records(local, LOST_TOPIC, 0, start=first, end=high)
        if {ident[0] for ident, _ts in held} != {LOST_ORIGIN}:
            raise BrokerError(f"{LOST_TOPIC} partition 0 holds records of "
                              f"{sorted({i[0] for i, _ts in held})} past offset {first}")
        copied = {i for i, _ts in _records(aggregate, LOST_TOPIC, 0,
                                           since_ms=paused_ms - 120_000)}
        lost = lost_by_window(held, copied)
        numbers = [n for ns in lost.values() for n in ns]
        if not numbers:
            raise BrokerError(f"the mirror had copied every record of {LOST_TOPIC} partition 0 "
                              "before it stopped: nothing to delete")
        _delete_below(local, LOST_TOPIC, 0, high)
        (demo.d / "mirror-drill.json").write_text(json.dumps(
            {"topic": LOST_TOPIC, "origin": LOST_ORIGIN, "tier": tier(AGGREGATE),
             "hop": hop(tier(AGGREGATE)), "deleted_below": high,
             "lost": {str(w): ns for w, ns in lost.items()}}, indent=1))
        _say(f"deleted {LOST_TOPIC} partition 0 below offset {high} on the local cluster, after "
             f"its count job counted it: {len(numbers)} records of {LOST_ORIGIN} the mirror had "
             f"not copied, in {len(lost)} window(s), numbers {_short(ranges(numbers))} "
             f"({demo.d}/mirror-drill.json)")
        since = stopped_ms // WINDOW_MS * WINDOW_MS
        while (left := stopped_at + MIRROR_STOP_S - time.monotonic()) > 1:
            time.sleep(min(30.0, left))
            early = _losses_since(demo, stopped_ms, (tier(LOCAL), tier(AGGREGATE)))
            states = _states(demo, tier(AGGREGATE), LOST_TOPIC, since)
            if early or "incomplete" in states.values():
                raise BrokerError("a loss was called while the mirror was stopped: "
                                  + "; ".join(a["summary"] for a in early) + f" {states}")
            _say(f"the mirror has been stopped {time.monotonic() - stopped_at:.0f} s: no loss; "
                 f"{tier(AGGREGATE)} on {LOST_TOPIC} since the stop: "
                 + (", ".join(f"{w} {st}" for w, st in states.items()) or "no word yet")
                 + " (the agents' reports wait on the local cluster too)")
    finally:
        for pid in apps:
            os.kill(pid, signal.SIGCONT)
        if stopped_at is not None:
            mirror.start()
    _say(f"the mirror started again and copies what waited; {tier(AGGREGATE)} stays unknown "
         f"until its job has read what the mirror vouches for, then {LOST_ORIGIN}'s records "
         f"are missing at the hop {hop(tier(AGGREGATE))}, {tier(LOCAL)} complete")


def _short(rs: list[list[int]], shown: int = 4, tail: bool = True) -> str:
    """The first ``shown`` of the ranges ``rs``, and (``tail``) how many there are."""
    text = ", ".join(f"{a}–{b}" if a != b else str(a) for a, b in rs[:shown])
    if len(rs) <= shown:
        return text
    return text + (f" … ({len(rs)} runs)" if tail else " …")


DRILLS = {"pause": drill_pause, "kill": drill_kill, "delete-records": drill_delete_records,
          "delete-log": drill_delete_log, "mirror": drill_mirror}


@dataclass(frozen=True)
class Expected:
    """The alert a real loss must raise at the receiver: firing, of ``kind`` at ``tier``, for
    ``origin`` (None: any host), naming ``hop`` in its detail (None: a tier fed by the
    producer)."""
    kind: str
    tier: str
    origin: str | None = None
    hop: str | None = None

    def met_by(self, alert) -> bool:
        return isinstance(alert, dict) and alert.get("event") == "firing" and \
            (alert.get("kind"), alert.get("tier")) == (self.kind, self.tier) and \
            self.origin in (None, alert.get("origin")) and \
            (alert.get("detail") or {}).get("hop") == self.hop


EXPECTED = {"delete-records": Expected("loss", "warehouse", None, hop("warehouse")),
            "delete-log": Expected("loss", "producer", "web-3"),
            "mirror": Expected("loss", tier(AGGREGATE), LOST_ORIGIN, hop(tier(AGGREGATE)))}


def fault(d: Path, only: list[str] | None, wait_s: float) -> int:
    demo = Demo(d)
    if not demo.pids:
        print(f"no demo is running from {d} (make demo starts one)", file=sys.stderr)
        return 1
    seen = len(received(d / "alerts.jsonl"))
    names = [n for n in DRILLS if n in only] if only else list(DRILLS)
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
            met = next((w for w in wanted if w.met_by(alert)), None)
            if met is None:
                continue
            wanted.remove(met)
            if met.hop is not None:
                detail = alert["detail"]
                one = detail.get("worst", detail)      # grouped: its worst origin's figures
                who = f" (worst of {detail['origins']} origins: {detail['worst_origin']})" \
                    if "worst" in detail else ""
                print(f"    at the hop {detail['hop']}{who}: {one.get('missing')} of "
                      f"{one.get('hop_expected')} missing in this window; the hop misses "
                      f"{one.get('missing_ranges_total')} record numbers in all, from "
                      f"{_short(one.get('missing_ranges') or [], tail=False)}", flush=True)
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
    p.add_argument("--only", choices=list(DRILLS), action="append",
                   help="fault: this drill only (repeatable)")
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
