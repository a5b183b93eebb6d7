"""A real local Apache Kafka: 1 or 3 combined broker+controller nodes in KRaft mode on 127.0.0.1.

Layout of a data directory::

    DATA_DIR/
      cluster.json          brokers, ports, cluster id, Kafka version, security mode (by `up`)
      security/             a secured cluster's CA, certificates, passwords (broker.security)
      node-1/
        server.properties   generated from the layout below
        log4j2.properties   broker logs go to node-1/logs/server.log
        data/               Kafka's log.dirs, formatted once with kafka.tools.StorageTool
        stdout.log          the JVM's own output (start-up failures land here)
        pid                 pid of the java process, written right after it starts

Ports: with base port B and N nodes, node i (1-based) takes B+i-1 for clients and B+N+i-1 for
its controller listener. Base port 0 asks the OS for free ports (what the tests use).

Hosts: every node listens on 127.0.0.1 unless ``up(hosts=...)`` gives each its own address (a
plaintext cluster only: the certificates name 127.0.0.1). ``LocalCluster(spawn_prefixes=...)``
runs a node's JVM through a command, e.g. ``ip netns exec NS`` to put it in a network namespace
of its own (tests/fleetkit.py). The wait for the ports and for metadata runs from this
process, so it must reach every host; a node without a prefix binds its host here, where its
ports are checked free first.

Security (``--security``): ``plaintext`` (the default: no authentication, no authorizer),
``sasl_ssl`` or ``mtls``; the listeners, certificates and users of a secured cluster are
``broker.security``'s. The mode is kept in ``cluster.json``: a restart keeps it.

Only processes whose pid file this module wrote, and whose command line names this data
directory, are ever signalled: ``down`` never touches a Kafka that someone else started.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from docket_common.dirs import docket_state_dir
from docket_common.procs import alive, process_state, reap

from .errors import BrokerError, ClusterAlreadyRunning, ClusterStartFailed, PortBusy
from .libs import KAFKA_VERSION, ensure_kafka_libs
from .security import ADMIN, PLAINTEXT, Security, check_mode, write_argument_file

DEFAULT_BASE_PORT = 9092
LOOPBACK = "127.0.0.1"
HEAP = "512m"


_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


def default_data_dir(name: str | None = None) -> Path:
    """The data directory of the cluster called ``name`` (``clusters_dir()/name``), or of the
    unnamed cluster: ``$DOCKET_BROKER_DIR``, else the user's state folder."""
    if name is not None:
        return clusters_dir() / check_name(name)
    override = os.environ.get("DOCKET_BROKER_DIR")
    if override:
        return Path(override)
    return docket_state_dir("broker")


def clusters_dir() -> Path:
    """Where named clusters live, one folder each: ``$DOCKET_CLUSTERS_DIR``, else
    ``<state>/docket/clusters``."""
    override = os.environ.get("DOCKET_CLUSTERS_DIR")
    return Path(override) if override else docket_state_dir("clusters")


def check_name(name: str) -> str:
    """``name`` if it can name a cluster (a folder, a tier, a MirrorMaker 2 alias)."""
    if not _NAME.fullmatch(name):
        raise BrokerError(f"{name!r} cannot name a cluster",
                          hint="lower-case letters, digits, '-' and '_', at most 40, "
                          "e.g. local or aggregate")
    return name


def named_clusters() -> dict[str, LocalCluster]:
    """name → cluster, of every named cluster that has a layout (was ever started)."""
    root = clusters_dir()
    if not root.is_dir():
        return {}
    return {d.name: LocalCluster(d) for d in sorted(root.iterdir())
            if _NAME.fullmatch(d.name) and (d / "cluster.json").is_file()}


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int
    controller_port: int
    host: str = LOOPBACK               # the address both listeners bind (up(hosts=...))


@dataclass(frozen=True)
class Layout:
    cluster_id: str
    kafka_version: str
    nodes: tuple[Node, ...]
    security: str = PLAINTEXT           # plaintext | sasl_ssl | mtls (broker.security)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps(
            {"cluster_id": self.cluster_id, "kafka_version": self.kafka_version,
             "nodes": [asdict(n) for n in self.nodes], "security": self.security},
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Layout:
        raw = json.loads(text)
        return cls(raw["cluster_id"], raw["kafka_version"], tuple(Node(**n) for n in raw["nodes"]),
                   raw.get("security", PLAINTEXT))


def _new_cluster_id() -> str:
    """A random KRaft cluster id. Like Kafka's own Uuid, never one starting with '-', which the
    storage tool's argument parser would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _free_ports(count: int) -> list[int]:
    """Ports the OS hands out now; the sockets stay open until all are chosen, so no repeats."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True unless something listens there (SO_REUSEADDR, as Kafka's own listeners: TIME_WAIT
    connections left by a cluster that just stopped do not make a port busy). Raises
    BrokerError when ``host`` is not an address of this host (of this network namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise BrokerError(f"{host} is not an address of this host",
                                  hint="start the cluster from the network namespace that "
                                  "holds its hosts' addresses") from None
            return False
    return True


def _port_answers(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class LocalCluster:
    """Start, inspect, fault and stop the local cluster kept in ``data_dir``."""

    def __init__(self, data_dir: Path | str | None = None, die_with_parent: bool = False,
                 broker_props: dict | None = None,
                 spawn_prefixes: dict[int, list[str]] | None = None,
                 java_options: list[str] | None = None):
        """``die_with_parent``: brokers this object starts are SIGKILLed by the kernel when the
        process that started them dies, however it dies (tests: a killed pytest leaves no
        JVM). The kernel ties them to the *thread* that started them (PR_SET_PDEATHSIG), so
        start such a cluster from a thread that lives as long as it should. ``docket-broker up``
        leaves it off: its cluster outlives the command."""
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        self.die_with_parent = die_with_parent
        # server.properties set over the defaults (tests: auto.create.topics.enable=false)
        self.broker_props = dict(broker_props or {})
        # system properties of the brokers' JVMs (tests: the URLs an OAUTHBEARER validator may
        # read, which Kafka allows only by name)
        self.java_options = list(java_options or [])
        # node id → the command its JVM runs through (module docstring, "Hosts")
        self.spawn_prefixes = {k: list(v) for k, v in (spawn_prefixes or {}).items()}
        self.log = logging.getLogger("docket.broker")
        self._children: dict[int, subprocess.Popen] = {}   # brokers this object started

    # -- layout -------------------------------------------------------------------------------
    @property
    def layout_file(self) -> Path:
        return self.data_dir / "cluster.json"

    def layout(self) -> Layout | None:
        if not self.layout_file.is_file():
            return None
        return Layout.from_json(self.layout_file.read_text())

    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    @property
    def security_dir(self) -> Path:
        return self.data_dir / "security"

    def security(self, layout: Layout | None = None) -> Security:
        """The security of this cluster (of ``layout``, else of the one ``up`` wrote)."""
        layout = layout or self.layout()
        return Security(layout.security if layout else PLAINTEXT, self.security_dir)

    def client_settings(self, user: str = ADMIN) -> dict[str, str]:
        """librdkafka settings reaching this cluster as ``user`` (``admin``: a super user);
        only ``bootstrap.servers`` on a plaintext cluster."""
        layout = self.layout()
        if layout is None:
            raise BrokerError(f"no cluster in {self.data_dir}",
                              hint="start one with `docket-broker up`")
        return self.security(layout).client_settings(layout.bootstrap_servers, user)

    def _plan(self, brokers: int, base_port: int, security: str = PLAINTEXT,
              hosts: tuple[str, ...] | None = None) -> Layout:
        if brokers not in (1, 3):
            raise BrokerError(f"--brokers must be 1 or 3, not {brokers}")
        hosts = tuple(hosts or (LOOPBACK,) * brokers)
        if len(hosts) != brokers:
            raise BrokerError(f"{len(hosts)} host(s) given for {brokers} broker(s)")
        if set(hosts) != {LOOPBACK} and check_mode(security) != PLAINTEXT:
            raise BrokerError(f"a {security} cluster listens on {LOOPBACK} only",
                              hint="its certificates name 127.0.0.1; give hosts to a "
                              "plaintext cluster")
        if base_port == 0:
            ports = _free_ports(2 * brokers)
        else:
            ports = list(range(base_port, base_port + 2 * brokers))
            if ports[-1] > 65535 or base_port < 1024:
                raise BrokerError(f"--base-port {base_port} leaves no room for {2 * brokers} ports",
                                  hint="choose a port between 1024 and 65000")
        nodes = tuple(Node(i + 1, ports[i], ports[brokers + i], hosts[i])
                      for i in range(brokers))
        return Layout(_new_cluster_id(), KAFKA_VERSION, nodes, check_mode(security))

    # -- processes ----------------------------------------------------------------------------
    def pid(self, node_id: int) -> int | None:
        """The pid of this node's broker if it is alive and really ours."""
        pid_file = self.node_dir(node_id) / "pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        child = self._children.get(node_id)
        if child is not None and child.pid == pid:
            return pid if child.poll() is None else None
        reap(pid)
        cmdline = [b""]
        for _ in range(10):   # empty for an instant while the java launcher re-execs itself
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                return None
            if cmdline != [b""]:
                break
            time.sleep(0.05)
        here = str(self.node_dir(node_id)).encode()
        ours = b"kafka.Kafka" in cmdline and here in b" ".join(cmdline)
        return pid if ours and alive(pid) else None

    def running_nodes(self) -> list[int]:
        layout = self.layout()
        if layout is None:
            return []
        return [n.node_id for n in layout.nodes if self.pid(n.node_id) is not None]

    def up(self, brokers: int = 1, base_port: int | None = None, fresh: bool = False,
           timeout_s: float = 120.0, security: str | None = None,
           hosts: tuple[str, ...] | None = None) -> Layout:
        """Start the cluster and return once every broker answers a metadata request.
        ``security``: plaintext, sasl_ssl or mtls; None keeps an existing cluster's (a new
        one is plaintext). ``hosts``: each node's address (a new cluster's; module docstring),
        else 127.0.0.1."""
        running = self.running_nodes()
        if running:
            raise ClusterAlreadyRunning(
                f"a cluster is already running from {self.data_dir} (nodes {running})",
                hint="use it as it is, or stop it first with `docket-broker down`",
            )
        existing = None if fresh else self.layout()
        if existing is not None and (
            len(existing.nodes) != brokers
            or (base_port not in (None, 0) and existing.nodes[0].port != base_port)
        ):
            raise BrokerError(
                f"{self.data_dir} holds a {len(existing.nodes)}-broker cluster on port "
                f"{existing.nodes[0].port}; asked for {brokers} broker(s) on {base_port}",
                hint="add --fresh to wipe it, or pick another --data-dir",
            )
        if existing is not None and security not in (None, existing.security):
            raise BrokerError(
                f"{self.data_dir} holds a cluster secured as {existing.security}; asked for "
                f"{security}",
                hint="add --fresh to wipe it (new credentials), or pick another --data-dir",
            )
        if existing is not None and hosts is not None \
                and tuple(hosts) != tuple(n.host for n in existing.nodes):
            raise BrokerError(
                f"{self.data_dir} holds a cluster on {[n.host for n in existing.nodes]}; "
                f"asked for {list(hosts)}",
                hint="add --fresh to wipe it, or pick another --data-dir",
            )
        if existing is None:
            self._clear_data_dir()
            layout = self._plan(brokers, DEFAULT_BASE_PORT if base_port is None else base_port,
                                security or PLAINTEXT, hosts)
        else:
            layout = existing
        ports = [(n.host, p) for n in layout.nodes if n.node_id not in self.spawn_prefixes
                 for p in (n.port, n.controller_port)]
        busy = [f"{h}:{p}" for h, p in ports if not _port_is_free(p, h)]
        if busy:
            raise PortBusy(
                f"{', '.join(busy)} already in use",
                hint="another Kafka may be running: stop it, or pass --base-port N "
                "(or --base-port 0 for any free ports) with a new --data-dir",
            )
        libs = ensure_kafka_libs()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if existing is None:
            self.security(layout).create()
            for node in layout.nodes:
                self._write_node_files(layout, node)
                self._format(libs, node, layout)
            self.layout_file.write_text(layout.to_json())
        else:
            self.security(layout).check()
        for node in layout.nodes:
            self._write_node_files(layout, node)
            self._spawn(libs, node)
        try:
            self._wait_ready(layout, timeout_s)
        except BaseException:
            self.down()
            raise
        return layout

    def _clear_data_dir(self) -> None:
        """Remove an old cluster's files; refuse to touch a folder that is not a cluster's."""
        if not self.data_dir.exists():
            return
        if self.layout_file.is_file():
            shutil.rmtree(self.data_dir)
        elif any(self.data_dir.iterdir()):
            raise BrokerError(f"{self.data_dir} is not empty and holds no docket-broker cluster",
                              hint="pass an empty or new --data-dir")

    def _write_node_files(self, layout: Layout, node: Node) -> None:
        d = self.node_dir(node.node_id)
        (d / "logs").mkdir(parents=True, exist_ok=True)
        n = len(layout.nodes)
        replication = 3 if n == 3 else 1
        min_isr = 2 if n == 3 else 1
        voters = ",".join(f"{m.node_id}@{m.host}:{m.controller_port}" for m in layout.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            **self.security(layout).broker_properties(node.port, node.controller_port,
                                                      node.host),
            "log.dirs": d / "data",
            "num.partitions": 1,
            "default.replication.factor": replication,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 10,
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": 0,
            "unclean.leader.election.enable": "false",
            "auto.create.topics.enable": "true",
            "broker.session.timeout.ms": 6000,
            "broker.heartbeat.interval.ms": 1000,
            **self.broker_props,
        }
        (d / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        write_log_config(d, "server.log")

    def _format(self, libs: Path, node: Node, layout: Layout) -> None:
        """Format the node's storage; on a sasl_ssl cluster with its SCRAM users, whose
        passwords reach ``java`` through an argument file (0600, removed after), never its
        command line: the storage tool takes them only as ``--add-scram`` arguments."""
        d = self.node_dir(node.node_id)
        scram = self.security(layout).scram_arguments()
        cmd = java_command(libs, "kafka.tools.StorageTool", "format", "--ignore-formatted",
                           "-t", layout.cluster_id, "-c", str(d / "server.properties"),
                           *scram, heap="256m", folder=d)
        argfile = d / "format.args"
        if scram:
            write_argument_file(argfile, cmd[1:])
            cmd = [cmd[0], f"@{argfile}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        finally:
            argfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise ClusterStartFailed(
                f"formatting node {node.node_id}'s storage failed:\n{proc.stdout}{proc.stderr}"
            )

    def _spawn(self, libs: Path, node: Node) -> None:
        d = self.node_dir(node.node_id)
        cmd = [*self.spawn_prefixes.get(node.node_id, []),
               *java_command(libs, "kafka.Kafka", str(d / "server.properties"), folder=d,
                             options=self.java_options)]
        proc = spawn(cmd, d, self.die_with_parent, f"broker {node.node_id}")
        self._children[node.node_id] = proc

    def _wait_ready(self, layout: Layout, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {n.node_id: n for n in layout.nodes}
        while pending:
            for node_id, node in list(pending.items()):
                # The child handle, not /proc: the java launcher may re-exec itself at start-up,
                # and its command line reads empty for that instant.
                if self._children[node_id].poll() is not None:
                    raise ClusterStartFailed(
                        f"broker {node_id} exited during start-up:\n{self.log_tail(node_id)}",
                        hint=f"the full logs are under {self.node_dir(node_id)}",
                    )
                if _port_answers(node.port, node.host):
                    del pending[node_id]
            if pending and time.monotonic() > deadline:
                raise ClusterStartFailed(f"broker(s) {sorted(pending)} did not open their port "
                                         f"within {timeout_s:.0f}s")
            time.sleep(0.2)
        wait_for_metadata(layout.bootstrap_servers, len(layout.nodes),
                          max(1.0, deadline - time.monotonic()),
                          self.security(layout).client_settings(layout.bootstrap_servers))

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        texts = []
        for name in ("stdout.log", "logs/server.log"):
            f = self.node_dir(node_id) / name
            if f.is_file():
                texts.extend(f.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(texts[-lines:])

    # -- faults, for tests and drills ---------------------------------------------------------
    def signal_node(self, node_id: int, sig: int) -> int:
        pid = self.pid(node_id)
        if pid is None:
            raise BrokerError(f"broker {node_id} is not running")
        os.kill(pid, sig)
        return pid

    def kill_node(self, node_id: int) -> None:
        pid = self.signal_node(node_id, signal.SIGKILL)
        wait_gone(pid, 30)

    def pause_node(self, node_id: int) -> None:
        self.signal_node(node_id, signal.SIGSTOP)

    def resume_node(self, node_id: int) -> None:
        self.signal_node(node_id, signal.SIGCONT)

    def start_node(self, node_id: int, timeout_s: float = 60) -> None:
        """Start one stopped node again (after kill_node) and wait until its port answers."""
        layout = self.layout()
        node = next(n for n in layout.nodes if n.node_id == node_id)
        if self.pid(node_id) is not None:
            return
        self._spawn(ensure_kafka_libs(), node)
        deadline = time.monotonic() + timeout_s
        while not _port_answers(node.port, node.host):
            if self._children[node_id].poll() is not None or time.monotonic() > deadline:
                raise ClusterStartFailed(f"broker {node_id} did not come back:\n"
                                         f"{self.log_tail(node_id)}")
            time.sleep(0.2)

    # -- status and stop ----------------------------------------------------------------------
    def status(self) -> list[dict]:
        layout = self.layout()
        if layout is None:
            return []
        rows = []
        for n in layout.nodes:
            pid = self.pid(n.node_id)
            state = "stopped" if pid is None else process_state(pid)
            if state == "running" and not _port_answers(n.port, n.host):
                state = "starting"
            rows.append({"node_id": n.node_id, "pid": pid, "port": n.port,
                         "controller_port": n.controller_port, "state": state,
                         "log": str(self.node_dir(n.node_id) / "logs" / "server.log")})
        return rows

    def down(self, timeout_s: float = 30.0) -> list[int]:
        """Stop every broker this data dir started; returns the pids stopped. Safe to repeat."""
        layout = self.layout()
        if layout is None:
            return []
        pids = {n.node_id: self.pid(n.node_id) for n in layout.nodes}
        pids = {k: v for k, v in pids.items() if v is not None}
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)   # a paused JVM cannot act on SIGTERM
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in pids.values():
            if not wait_gone(pid, max(0.0, deadline - time.monotonic())):
                os.kill(pid, signal.SIGKILL)
                wait_gone(pid, 10)
        for node_id in pids:
            (self.node_dir(node_id) / "pid").unlink(missing_ok=True)
        return sorted(pids.values())


def java_command(libs: Path, main: str, *args: str, heap: str = HEAP,
                 folder: Path, options: list[str] | None = None) -> list[str]:
    """``java`` running ``main`` from the Kafka jars, logging (Log4j 2) as ``folder``'s
    ``log4j2.properties`` says, into ``folder/logs``; ``options``: more of the JVM's own."""
    home = Path(os.environ.get("JAVA_HOME") or "/nonexistent")
    java = str(home / "bin" / "java") if (home / "bin" / "java").is_file() \
        else shutil.which("java")
    if java is None:
        raise BrokerError("`java` was not found", hint="install a JDK 17+ or set JAVA_HOME")
    return [
        java, f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={folder / 'logs'}",
        *(options or []),
        "-cp", f"{libs}/*", main, *args,
    ]


def write_log_config(folder: Path, log_name: str) -> None:
    """``folder/log4j2.properties``: INFO and above into ``folder/logs/<log_name>``, rolled at
    20 MB, three kept."""
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (folder / "log4j2.properties").write_text(
        "status = warn\n"
        "appender.file.type = RollingFile\n"
        "appender.file.name = file\n"
        f"appender.file.fileName = {logs / log_name}\n"
        f"appender.file.filePattern = {logs / log_name}.%i\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "appender.file.policies.type = Policies\n"
        "appender.file.policies.size.type = SizeBasedTriggeringPolicy\n"
        "appender.file.policies.size.size = 20MB\n"
        "appender.file.strategy.type = DefaultRolloverStrategy\n"
        "appender.file.strategy.max = 3\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.file.ref = file\n"
    )


def spawn(cmd: list[str], folder: Path, die_with_parent: bool, what: str) -> subprocess.Popen:
    """Start ``cmd`` in its own session in ``folder``, its output into ``folder/stdout.log``,
    its pid into ``folder/pid``. ``die_with_parent``: SIGKILLed by the kernel when the thread
    that started it ends (tests: a killed pytest leaves no JVM)."""
    log = logging.getLogger("docket.broker")
    if die_with_parent:
        # util-linux's setpriv sets PR_SET_PDEATHSIG, then execs java (same pid). Not
        # prctl in a preexec_fn: Python code between fork and exec can deadlock in a
        # process with threads (librdkafka's, in a test session).
        setpriv = shutil.which("setpriv")
        if setpriv:
            cmd = [setpriv, "--pdeathsig", "KILL", *cmd]
        else:
            log.warning("setpriv (util-linux) not found: %s will outlive its parent if that "
                        "is killed", what)
    with open(folder / "stdout.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder)
    (folder / "pid").write_text(f"{proc.pid}\n")
    return proc


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        reap(pid)
        if not alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def wait_for_metadata(bootstrap_servers: str, brokers: int, timeout_s: float,
                      client: dict | None = None) -> None:
    """Block until a metadata request lists ``brokers`` brokers, or raise ClusterStartFailed.
    ``client``: librdkafka settings over ``bootstrap.servers`` (a secured cluster's)."""
    from .admin import admin_client

    admin = admin_client(bootstrap_servers, client)
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        try:
            seen = len(admin.list_topics(timeout=2).brokers)
        except Exception:  # KafkaException while the controller elects itself
            seen = 0
        if seen >= brokers:
            return
        time.sleep(0.3)
    raise ClusterStartFailed(f"metadata listed {seen} of {brokers} brokers after {timeout_s:.0f}s")
