"""The fleet fault harness: a 3-broker cluster and N agents, each broker and each agent in a
network namespace of its own, joined by one bridge; network faults made inside those
namespaces only, never on the host's interfaces or addresses.

Layout (every name carries the run's pid, ``dkt<pid>-``, so the next run finds a killed run's
leftovers and removes them, with the processes still inside)::

    dkt<pid>-hub    br0 10.77.255.254/16, the bridge every veth's far end is enslaved to; the
                    test itself works from here (``inside``: setns on its main thread): the
                    consumer, the admin client, the Spark count job, the reconciler
    dkt<pid>-bK     eth0 10.77.0.K (K = 1..3): broker K (``LocalCluster(spawn_prefixes=...)``)
    dkt<pid>-aI     eth0 10.77.1.(I+1): agent I, its status on 10.77.1.(I+1):9464

Faults (``Network``): every packet is dropped or held where it *arrives* (iptables INPUT of the
receiving namespace), so a sender sees a silent network, as across a real one: a DROP in
OUTPUT would hand it an immediate EPERM instead.

- ``delay(ms, loss)``: each packet from an agent to a broker held ``ms`` (so a round trip takes
  ``ms`` more), and ``loss`` of the packets dropped at random in both directions;
- ``partition(k)``: broker k cut off from the agents, the other brokers and the hub;
- ``all_down()``: every broker cut off from every agent (the brokers still see each other);
- ``heal()``: every rule removed at once (the namespaces' INPUT chains flushed in parallel),
  returning how many packets each fault dropped and what the delay tool held: the proof that the
  fault happened.

**No netem here.** This machine's kernel is built without ``CONFIG_NET_SCH_NETEM`` (``tc qdisc
add ... netem`` says "Specified qdisc kind is unknown") and has no modules to load. So: loss is
iptables' ``statistic`` match (``--mode random --probability P -j DROP``); delay is NFQUEUE:
``tests/netdelay.c`` (built here with the system's C compiler over libnetfilter_queue, as
``clockshift.c`` is) is handed every packet by ``-j NFQUEUE`` and gives its verdict ``ms``
after the packet arrived, in arrival order; a partition is ``-j DROP``. The faults are
measured, not assumed: ``connect_ms`` times a TCP connect across them, ``heal`` counts the drops.

``unavailable()`` names what this machine lacks (root, ``ip``, ``iptables``, ``setpriv``, the C
compiler or libnetfilter_queue's headers, a kernel feature: namespaces, veth, bridge, the
statistic match, NFQUEUE); the tests skip with that reason. ``make setup`` installs Debian's
``iptables`` and ``libnetfilter-queue-dev`` as root.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from docket_common.procs import alive
from tests.agentkit import AgentProcess, write_config
from tests.integration.test_agent_end_to_end import start_writer
from tests.kafkautil import TEST_BROKER_PROPS

SUBNET = "10.77"
HUB_HOST = f"{SUBNET}.255.254"      # outside the brokers' and the agents' /24s
STATUS_PORT = 9464
QUEUE = 0                       # the NFQUEUE number; each broker namespace has its own queues
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_STALE = re.compile(r"dkt(\d+)-")


def broker_host(k: int) -> str:
    """Broker k's address (k = 1, 2, 3)."""
    return f"{SUBNET}.0.{k}"


def agent_host(i: int) -> str:
    """Agent i's address (i = 0, 1, ...)."""
    return f"{SUBNET}.1.{i + 1}"


# -- what the harness needs -------------------------------------------------------------------
def netdelay_binary(build_dir: Path) -> Path:
    """``tests/netdelay.c`` built with the system's C compiler (once per folder)."""
    binary = build_dir / "netdelay"
    if not binary.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-Wall", "-o", str(binary),
                        str(Path(__file__).with_name("netdelay.c")), "-lnetfilter_queue",
                        "-lnfnetlink"], check=True, capture_output=True, text=True)
    return binary


@functools.cache
def unavailable(build_dir: Path) -> str | None:
    """Why the harness cannot run here, or None: checked by doing each thing once in a probe
    namespace (removed after)."""
    if os.geteuid() != 0:
        return "the fleet harness needs root (network namespaces, veth, iptables)"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"),
                          ("setpriv", "util-linux"), ("cc", "gcc")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: install Debian's {package} (make setup, as root)"
    try:
        netdelay_binary(build_dir)
    except subprocess.CalledProcessError as exc:
        return ("tests/netdelay.c does not build (Debian's libnetfilter-queue-dev missing?): "
                + exc.stderr.strip()[-300:])
    probe = f"dkt{os.getpid()}-probe"
    steps = [
        (["ip", "netns", "add", probe], "network namespaces"),
        (["ip", "-n", probe, "link", "add", "br0", "type", "bridge"], "bridges (CONFIG_BRIDGE)"),
        (["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
         "veth pairs (CONFIG_VETH)"),
        (["ip", "netns", "exec", probe, "iptables", "-w", "-A", "INPUT", "-m", "statistic",
          "--mode", "random", "--probability", "0.5", "-j", "DROP"],
         "iptables' statistic match (CONFIG_NETFILTER_XT_MATCH_STATISTIC)"),
        (["ip", "netns", "exec", probe, "iptables", "-w", "-A", "INPUT", "-j", "NFQUEUE",
          "--queue-num", str(QUEUE)],
         "iptables' NFQUEUE target (CONFIG_NETFILTER_XT_TARGET_NFQUEUE)"),
    ]
    try:
        for cmd, feature in steps:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                return f"the kernel or tools here lack {feature}: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# -- namespaces -------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(ns: str):
    """Run the calling thread in network namespace ``ns`` for the block (Linux keeps the
    network namespace per thread), then back where it was. Sockets made inside stay in ``ns``;
    so do the processes and threads started inside (librdkafka's, a JVM)."""
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        _setns(there)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(there)
        os.close(here)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _remove_namespace(ns: str) -> None:
    """SIGKILL what still runs in ``ns`` (a killed run's agents, writers, delay tools), then
    remove it."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in map(int, pids.split()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def remove_stale() -> list[str]:
    """The namespaces of runs whose process is gone, removed; returns their names."""
    if not NETNS_DIR.is_dir():
        return []
    stale = [ns.name for ns in NETNS_DIR.iterdir()
             if (m := _STALE.match(ns.name)) and not alive(int(m.group(1)))]
    for ns in stale:
        _remove_namespace(ns)
    return stale


class Network:
    """The namespaces, the bridge and the faults (module docstring)."""

    def __init__(self, brokers: int, agents: int, netdelay: Path):
        tag = f"dkt{os.getpid()}"
        self.hub = f"{tag}-hub"
        self.brokers = [f"{tag}-b{k}" for k in range(1, brokers + 1)]
        self.agents = [f"{tag}-a{i}" for i in range(agents)]
        self.netdelay = netdelay
        self.delayers: list[subprocess.Popen] = []
        self.created: list[str] = []

    @property
    def members(self) -> list[str]:
        return [*self.brokers, *self.agents]

    def host_of(self, ns: str) -> str:
        if ns in self.brokers:
            return broker_host(self.brokers.index(ns) + 1)
        return agent_host(self.agents.index(ns))

    def create(self) -> Network:
        remove_stale()
        _ip("netns", "add", self.hub)
        self.created.append(self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{HUB_HOST}/16", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for n, ns in enumerate(self.members):
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            port = f"p{n}"                          # the veth's end in the hub, on br0
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port,
                "netns", self.hub)
            _ip("-n", ns, "addr", "add", f"{self.host_of(ns)}/16", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.hub, "link", "set", port, "master", "br0")
            _ip("-n", self.hub, "link", "set", port, "up")
        return self

    def destroy(self) -> None:
        """Stop the delay tools, then remove every namespace with what still runs in it."""
        self._stop_delayers()
        for ns in reversed(self.created):
            _remove_namespace(ns)
        self.created.clear()

    def prefix(self, ns: str) -> list[str]:
        """The command prefix that runs a program in ``ns``, SIGKILLed by the kernel when the
        thread that started it ends (a killed test leaves nothing running)."""
        return ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", ns]

    # -- faults -------------------------------------------------------------------------------
    def _iptables(self, ns: str, *rule: str) -> None:
        done = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", *rule],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(rule)} in {ns}: {done.stderr.strip()}")

    def delay(self, ms: int, loss: float) -> None:
        """Packets agent → broker held ``ms`` in each broker's namespace (a delay tool per
        broker), and ``loss`` of the packets dropped both ways."""
        agents = f"{SUBNET}.1.0/24"
        for ns in self.brokers:
            if loss:
                self._iptables(ns, "-A", "INPUT", "-s", agents, "-m", "statistic", "--mode",
                               "random", "--probability", str(loss), "-j", "DROP")
            if not ms:
                continue
            tool = subprocess.Popen([*self.prefix(ns), str(self.netdelay), str(QUEUE), str(ms)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.delayers.append(tool)
            ready = tool.stdout.readline().strip()
            if ready != "ready":
                raise RuntimeError(f"netdelay in {ns}: {ready}{tool.stdout.read()}")
            self._iptables(ns, "-A", "INPUT", "-s", agents, "-j", "NFQUEUE", "--queue-num",
                           str(QUEUE))
        if loss:
            for ns in self.agents:
                self._iptables(ns, "-A", "INPUT", "-s", f"{SUBNET}.0.0/24", "-m", "statistic",
                               "--mode", "random", "--probability", str(loss), "-j", "DROP")

    def partition(self, k: int) -> None:
        """Broker k (1-based) alone: nothing reaches it from outside, nothing from it arrives
        anywhere (the agents, the other brokers, the hub)."""
        self._iptables(self.brokers[k - 1], "-A", "INPUT", "-i", "eth0", "-j", "DROP")
        for ns in [self.hub, *self.members]:
            if ns != self.brokers[k - 1]:
                self._iptables(ns, "-A", "INPUT", "-s", broker_host(k), "-j", "DROP")

    def all_down(self) -> None:
        """No broker reaches any agent, nor any agent a broker."""
        for ns in self.brokers:
            self._iptables(ns, "-A", "INPUT", "-s", f"{SUBNET}.1.0/24", "-j", "DROP")
        for ns in self.agents:
            self._iptables(ns, "-A", "INPUT", "-s", f"{SUBNET}.0.0/24", "-j", "DROP")

    def dropped(self) -> int:
        """Packets the DROP rules in place have dropped, over every namespace."""
        total = 0
        for ns in [self.hub, *self.members]:
            listing = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", "-nvxL",
                                      "INPUT"], capture_output=True, text=True,
                                     check=True).stdout
            total += sum(int(line.split()[0]) for line in listing.splitlines()
                         if line.split()[2:3] == ["DROP"])
        return total

    def heal(self) -> dict:
        """Every rule gone at once; returns the packets dropped and the delay tools' reports."""
        dropped = self.dropped()
        flushes = [subprocess.Popen(["ip", "netns", "exec", ns, "iptables", "-w", "-F",
                                     "INPUT"]) for ns in [self.hub, *self.members]]
        if any(f.wait(timeout=30) != 0 for f in flushes):
            raise RuntimeError("an iptables flush failed: the faults may still be in place")
        return {"dropped_packets": dropped, "held": self._stop_delayers()}

    def _stop_delayers(self) -> list[str]:
        reports = []
        for tool in self.delayers:
            if tool.poll() is None:
                tool.send_signal(signal.SIGTERM)
            try:
                out, _ = tool.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                tool.kill()
                out, _ = tool.communicate()
            reports.append(out.strip())
        self.delayers.clear()
        return reports

    def delayed_packets(self, reports: list[str]) -> int:
        """Packets the delay tools held, from ``heal()``'s reports."""
        return sum(int(m.group(1)) for r in reports if (m := re.search(r"held (\d+)", r)))


# -- probes -----------------------------------------------------------------------------------
def connect_ms(ns: str, host: str, port: int, timeout_s: float = 1.0) -> float | None:
    """How long a TCP connect from namespace ``ns`` to ``host:port`` takes (one round trip),
    in ms; None when it does not complete within ``timeout_s``."""
    with inside(ns):
        began = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return (time.monotonic() - began) * 1000
        except OSError:
            return None


def least_connect_ms(ns: str, host: str, port: int, tries: int = 5) -> float | None:
    """The fastest of ``tries`` connects (a lost SYN costs a second, not the delay)."""
    times = [t for t in (connect_ms(ns, host, port) for _ in range(tries)) if t is not None]
    return min(times) if times else None


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the fleet --------------------------------------------------------------------------------
def first_id(phase: int, agent: int) -> int:
    """The first id agent ``agent``'s writer writes in ``phase``: ids never repeat across
    agents and phases (each gets a million; ``parse_id`` reads nine digits)."""
    return phase * 100_000_000 + agent * 1_000_000


class Fleet:
    """The network, a 3-broker cluster in it (replication 3, ``min.insync.replicas`` 2) and one
    agent per agent namespace tailing its own folder, where ``write`` starts its writer.
    ``running`` builds it all and takes it all down; the calling thread works from the hub."""

    def __init__(self, folder: Path, agents: int, netdelay: Path):
        self.folder = folder
        self.net = Network(3, agents, netdelay)
        self.cluster: LocalCluster | None = None
        self.bootstrap = ""
        self.agents: list[AgentProcess] = []
        self.logs: list[Path] = []
        self.writers: list[subprocess.Popen] = []

    @contextlib.contextmanager
    def running(self, topic: str, audit_topic: str, partitions: int = 6, **sections):
        """The fleet up, the calling thread in the hub; ``sections`` override the agents'
        configuration (write_config's)."""
        self.net.create()
        try:
            with inside(self.net.hub):
                self.cluster = LocalCluster(
                    self.folder / "kafka", die_with_parent=True, broker_props=TEST_BROKER_PROPS,
                    spawn_prefixes={k + 1: self.net.prefix(ns)
                                    for k, ns in enumerate(self.net.brokers)})
                layout = self.cluster.up(brokers=3, base_port=9092, timeout_s=300,
                                         hosts=tuple(broker_host(k) for k in (1, 2, 3)))
                self.bootstrap = layout.bootstrap_servers
                ensure_topics(self.bootstrap, [TopicSpec(topic, partitions=partitions,
                                                         replication_factor=3)])
                ensure_audit_topic(self.bootstrap, audit_topic)
                for i, ns in enumerate(self.net.agents):
                    self.agents.append(self._start_agent(i, ns, topic, audit_topic, sections))
                yield self
        finally:
            self.stop_agents()
            for writer in self.writers:
                if writer.poll() is None:
                    writer.kill()
                writer.wait()
            if self.cluster is not None:
                self.cluster.down()
            self.net.destroy()

    def _start_agent(self, i: int, ns: str, topic: str, audit_topic: str,
                     sections: dict) -> AgentProcess:
        home = self.folder / f"agent-{i}"
        logs = home / "logs"
        logs.mkdir(parents=True)
        self.logs.append(logs)
        conf = {"agent": {"id": f"fleet-{i}"},
                "status": {"listen": f"{agent_host(i)}:{STATUS_PORT}"},
                "buffer": {"size_bytes": 32 << 20, "slot_size_bytes": 256 << 10},
                "audit": {"topic": audit_topic}}
        for name, values in sections.items():
            conf.setdefault(name, {}).update(values)
        config = write_config(home / "agent.toml", self.bootstrap, home / "state",
                              [{"type": "file", "paths": [str(logs / "app.log*")],
                                "topic": topic}], **conf)
        return AgentProcess(config, home / "agent.log", prefix=self.net.prefix(ns)).start()

    def stop_agents(self) -> list[int]:
        """SIGTERM each agent (its last audit round goes out); their exit codes."""
        codes = [a.stop() if a.alive() else a.proc.returncode for a in self.agents
                 if a.proc is not None]
        return codes

    def write(self, phase: int, rate: float, per_agent: int) -> list[subprocess.Popen]:
        """Each agent's writer appends ``per_agent`` lines at ``rate`` lines/s to its file (one
        file, never rotated: a phase's writer goes on where the last one stopped)."""
        writers = [start_writer(logs, per_agent, per_agent, rate, first_id(phase, i))
                   for i, logs in enumerate(self.logs)]
        self.writers += writers
        return writers

    def statuses(self) -> list[dict | None]:
        return [a.status() for a in self.agents]

    def agent_cpu(self) -> list[float]:
        return [a.cpu_seconds() for a in self.agents]

    def broker_cpu(self) -> float:
        """CPU seconds of the three broker JVMs so far."""
        return sum(cpu_seconds(pid) for pid in map(self.cluster.pid, (1, 2, 3))
                   if pid is not None)

    def wait_sent(self, accepted: list[float], timeout_s: float) -> float | None:
        """Seconds until every agent I has had at least ``accepted[I]`` events acknowledged
        (``totals.sent_events``: counted once per event, when its slot is freed); None when the
        time ran out."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            sent = [(st or {}).get("totals", {}).get("sent_events", -1)
                    for st in self.statuses()]
            if all(s >= a for s, a in zip(sent, accepted, strict=True)):
                return time.monotonic() - began
            time.sleep(0.2)
        return None
