"""MirrorMaker 2 from Apache Kafka's own jars, copying topics from one cluster to another.

``docket-broker mirror up --source local --target aggregate --topics 'app\\..*'`` writes a
properties file for MirrorMaker 2's dedicated mode (``org.apache.kafka.connect.mirror.
MirrorMaker``, what Kafka's ``connect-mirror-maker.sh`` runs) and starts it in the background.
Layout of a mirror's folder (``mirrors_dir()/<source>.<target>``)::

    mirror.json           source, target, their bootstrap servers, the topic pattern, how
                          each cluster is reached (security settings: files, no secret)
    mm2.properties        generated from mirror.json; a secured cluster's secrets only by
                          reference (``${dir:...}``) to
    secrets/              their copies, written at each start (0700; files 0600)
    log4j2.properties     MirrorMaker 2's log goes to logs/mirror.log
    stdout.log, pid       the JVM's own output, its pid
    watch/stdout.log, pid the watcher's log and pid (below)
    watch/source.toml     a secured source's or target's settings for the watcher
    watch/target.toml     (``--kafka-config`` files, mode 0600)

The replication policy is the identity policy (``IdentityReplicationPolicy``): a topic keeps its
name on the target, so every tier (the local cluster, the aggregate, the warehouse) speaks of
the same topic and the audit records mirrored with the data need no translation. Record
headers (docket's record identity) and timestamps are copied as they are. The audit topic, when
named, is mirrored with the data and first created on the target with the audit topic's
settings: MirrorMaker 2 does not copy ``message.timestamp.type``, and the aggregate's brokers
must stamp each audit record as it arrives there (``LogAppendTime``).

MirrorMaker 2 copies at least once: killed, it resends what it copied after its last offset
commit. docket's count jobs count such copies as duplicates, by record identity.

With the audit topic copied, a *watcher* runs beside MirrorMaker 2 (``audit.jobs.mirrored``, a
Python process of its own): it appends to the target's audit topic how far the mirror has
copied, in positions, which is how a count job on the target (``--mirror-target``) knows it has
read the data an audit record counts (MirrorMaker 2 copies partitions in no order among them).
Killing the mirror (``kill``, a drill) leaves the watcher running: it waits for the mirror.

On secured clusters (docs/security.md) MirrorMaker 2 and the watcher log in as the mirror's
user on both ends, with the ``mirror`` role's ACLs; the audit topic on the target is created
by the target's admin (``up``'s ``admin``). Passwords and keys are copied from their files at
each ``up``: a password changed is taken by stopping the mirror and starting it again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from docket_common.dirs import docket_state_dir
from docket_common.kafka_security import (
    ALLOWED_URLS,
    KafkaSecurity,
    check_one_principal,
    kafka_config_text,
)
from docket_common.procs import alive, process_state, reap

from .admin import AUDIT_TOPIC_CONFIG, TopicSpec, admin_client, describe, ensure_topics
from .cluster import check_name, java_command, spawn, wait_gone, write_log_config
from .errors import BrokerError, ClusterStartFailed
from .libs import ensure_kafka_libs
from .security import write_private

MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
PROVIDER = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"
HEAP = "512m"
WATCHER = "audit.jobs.mirrored"        # the watcher's module (python -m)


def mirrors_dir() -> Path:
    """Where mirrors live, one folder each: ``$DOCKET_MIRRORS_DIR``, else
    ``<state>/docket/mirrors``."""
    override = os.environ.get("DOCKET_MIRRORS_DIR")
    return Path(override) if override else docket_state_dir("mirrors")


@dataclass(frozen=True)
class MirrorSpec:
    """What a mirror copies: ``topics`` (a regular expression, MirrorMaker 2's syntax) from
    ``source`` to ``target`` (cluster names, MirrorMaker 2's aliases)."""
    source: str
    target: str
    source_bootstrap: str
    target_bootstrap: str
    topics: str
    audit_topic: str | None = None
    refresh_s: int = 5                 # how soon a new topic matching ``topics`` is copied
    replication_factor: int = 1        # of the topics MirrorMaker 2 creates on the target
    properties: dict[str, str] = field(default_factory=dict)   # set over the generated ones
    # How the mirror (MirrorMaker 2 and its watcher) reaches each cluster: docket's security
    # settings as a ``[kafka]`` table holds them (docket_common.kafka_security), files only.
    source_security: dict[str, str] = field(default_factory=dict)
    target_security: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # (its watcher, one process, reaches both sides: one Kerberos principal for both)
        check_one_principal((self.security("source"), self.security("target")),
                            "the mirror's watcher")
        check_name(self.source)
        check_name(self.target)
        if self.source == self.target:
            raise BrokerError(f"a mirror copies between two clusters; both are {self.source!r}")
        if not self.topics:
            raise BrokerError("a mirror needs --topics", hint="e.g. --topics 'app\\..*'")
        try:
            re.compile(self.topics)
        except re.error as exc:
            raise BrokerError(f"--topics {self.topics!r} is not a regular expression: {exc}",
                              hint="e.g. --topics 'app\\..*|web\\..*'") from None
        if self.refresh_s < 1:
            raise BrokerError(f"--refresh-s must be at least 1, not {self.refresh_s}")

    def security(self, side: str) -> KafkaSecurity:
        """How the mirror reaches its ``side`` (source | target), checked for form."""
        table = self.source_security if side == "source" else self.target_security
        return KafkaSecurity.from_table(table, f"mirror.{side}")

    def java_options(self) -> list[str]:
        """MirrorMaker 2's JVM options for its sides' security: the token endpoints it may
        ask (OAUTHBEARER), allowed by name in one system property."""
        urls = [self.security(side).token_endpoint_url for side in ("source", "target")
                if self.security(side).oauth]
        return [f"-D{ALLOWED_URLS}={','.join(dict.fromkeys(urls))}"] if urls else []

    def client_conf(self, side: str) -> dict[str, str]:
        """librdkafka's settings reaching ``side`` as the mirror (reads its secret files)."""
        bootstrap = self.source_bootstrap if side == "source" else self.target_bootstrap
        return {"bootstrap.servers": bootstrap,
                **self.security(side).librdkafka_properties()}

    @property
    def pattern(self) -> str:
        """The topics copied: ``topics``, and the audit topic if named."""
        if self.audit_topic is None:
            return self.topics
        return f"{self.topics}|{re.escape(self.audit_topic)}"

    def properties_text(self, secrets_dir: Path | None = None) -> str:
        """``mm2.properties``: one flow, ``source->target``, the identity policy, every topic
        MirrorMaker 2 creates replicated ``replication_factor`` times, no consumer-group or ACL
        synchronisation (docket's jobs keep their own offsets on each cluster). A secured
        cluster's Java client settings go under its alias, each secret (a password, a private
        key) as a reference to a file in ``secrets_dir`` (``DirectoryConfigProvider``; the
        files are ``secret_files``, written by whoever starts the mirror): MirrorMaker 2 stores
        its connectors' settings, unresolved, in its config topics on both clusters, where a
        secret written here would be kept in clear."""
        s, t, rf = self.source, self.target, self.replication_factor
        props = {
            "clusters": f"{s}, {t}",
            f"{s}.bootstrap.servers": self.source_bootstrap,
            f"{t}.bootstrap.servers": self.target_bootstrap,
            f"{s}->{t}.enabled": "true",
            f"{s}->{t}.topics": self.pattern,
            f"{t}->{s}.enabled": "false",
            "replication.policy.class": POLICY,
            "refresh.topics.interval.seconds": self.refresh_s,
            "sync.topic.configs.enabled": "true",
            "sync.topic.acls.enabled": "false",
            "emit.checkpoints.enabled": "false",
            "sync.group.offsets.enabled": "false",
            "groups.exclude": ".*",
            "tasks.max": 1,
            "replication.factor": rf,
            **{f"{name}.replication.factor": rf for name in (
                "checkpoints.topic", "heartbeats.topic", "offset-syncs.topic",
                "offset.storage", "status.storage", "config.storage")},
            # Offsets committed every 5 s (Connect's default is 60 s): a killed mirror resends
            # at most the last few seconds. Worker settings are the target cluster's.
            f"{t}.offset.flush.interval.ms": 5000,
            # The copies are written as docket's agents write: idempotent, all replicas.
            f"{t}.producer.enable.idempotence": "true",
            f"{t}.producer.acks": "all",
            **self._secured(secrets_dir)[0],
            **self.properties,
        }
        return "".join(f"{k} = {_escaped(str(v))}\n" for k, v in props.items())

    def secret_files(self, secrets_dir: Path) -> dict[str, str]:
        """The files ``properties_text(secrets_dir)`` refers to: name → the secret."""
        return self._secured(secrets_dir)[1]

    def _secured(self, secrets_dir: Path | None) -> tuple[dict[str, str], dict[str, str]]:
        """The secured sides' properties, and the secret files they refer to."""
        props: dict[str, str] = {}
        files: dict[str, str] = {}
        for side, alias in (("source", self.source), ("target", self.target)):
            security = self.security(side)
            if not security.secured:
                continue
            if secrets_dir is None:
                raise BrokerError(f"the mirror's {side} is secured: its properties need a "
                                  "folder for the secrets they refer to")

            def by_reference(name: str, value: str, side: str = side) -> str:
                files[f"{side}.{name}"] = value
                return f"${{dir:{secrets_dir}:{side}.{name}}}"
            props.update({f"{alias}.{k}": v
                          for k, v in security.java_properties(by_reference).items()})
        if props:
            props.update({"config.providers": "dir", "config.providers.dir.class": PROVIDER})
        return props, files

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> MirrorSpec:
        return cls(**json.loads(text))


def _escaped(value: str) -> str:
    """``value`` as a Java properties file must spell it: a backslash starts an escape there
    (``app\\..*`` read back plainly would be ``app..*``, matching every topic)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + out if out.startswith((" ", "\t")) else out


class Mirror:
    """Start, inspect, kill and stop the MirrorMaker 2 kept in ``folder``."""

    def __init__(self, folder: Path, die_with_parent: bool = False):
        """``die_with_parent``: as ``LocalCluster``'s (tests)."""
        self.folder = Path(folder)
        self.die_with_parent = die_with_parent
        self._child: subprocess.Popen | None = None
        self._watch: subprocess.Popen | None = None

    @classmethod
    def named(cls, source: str, target: str, **kw) -> Mirror:
        return cls(mirrors_dir() / f"{check_name(source)}.{check_name(target)}", **kw)

    @property
    def spec_file(self) -> Path:
        return self.folder / "mirror.json"

    @property
    def log_file(self) -> Path:
        return self.folder / "logs" / "mirror.log"

    def spec(self) -> MirrorSpec | None:
        if not self.spec_file.is_file():
            return None
        return MirrorSpec.from_json(self.spec_file.read_text())

    def pid(self) -> int | None:
        """The pid of this folder's MirrorMaker 2 if it is alive and really ours."""
        return _live_pid(self.folder / "pid", self._child,
                         MAIN, str(self.folder / "mm2.properties"))

    @property
    def watch_folder(self) -> Path:
        return self.folder / "watch"

    def watch_pid(self) -> int | None:
        """The pid of this mirror's watcher if it is alive and really ours."""
        spec = self.spec()
        if spec is None:
            return None
        return _live_pid(self.watch_folder / "pid", self._watch,
                         WATCHER, f"{spec.source}->{spec.target}")

    def _start_watch(self, spec: MirrorSpec) -> None:
        if spec.audit_topic is None or self.watch_pid() is not None:
            return
        self.watch_folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", WATCHER, "--flow", f"{spec.source}->{spec.target}",
               "--source", spec.source, "--target", spec.target,
               "--source-bootstrap", spec.source_bootstrap,
               "--target-bootstrap", spec.target_bootstrap, "--topics", spec.pattern,
               "--audit-topic", spec.audit_topic]
        for side in ("source", "target"):
            security = spec.security(side)
            if security.secured:            # its files, as the Spark jobs' --kafka-config
                config = self.watch_folder / f"{side}.toml"
                write_private(config, kafka_config_text(security))
                cmd += [f"--{side}-kafka-config", str(config)]
        self._watch = spawn(cmd, self.watch_folder, self.die_with_parent,
                            f"the watcher of the mirror {spec.source} -> {spec.target}")

    def write_config(self, spec: MirrorSpec) -> None:
        """The mirror's folder as ``spec`` says: mirror.json, the secrets' private copies
        (secrets/, 0700, each file 0600) and the mm2.properties that refers to them."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec_file.write_text(spec.to_json())
        secrets_dir = self.folder / "secrets"
        files = spec.secret_files(secrets_dir)
        if files:
            secrets_dir.mkdir(mode=0o700, exist_ok=True)
            secrets_dir.chmod(0o700)
        for name, secret in files.items():
            write_private(secrets_dir / name, secret)
        write_private(self.folder / "mm2.properties", spec.properties_text(secrets_dir))
        write_log_config(self.folder, "mirror.log")

    def up(self, spec: MirrorSpec, timeout_s: float = 120.0,
           admin: dict[str, str] | None = None) -> None:
        """Start copying as ``spec`` says (the audit topic first created on the target), and
        return once MirrorMaker 2 has joined the target cluster (its offset store is there);
        with the audit topic, its watcher too. ``admin``: librdkafka's settings creating the
        audit topic on the target (a secured cluster's admin; default: the mirror's own)."""
        if self.pid() is not None:
            raise BrokerError(f"a mirror is already running from {self.folder}",
                              hint="stop it first with `docket-broker mirror down`")
        if spec.audit_topic is not None:     # as many partitions as the source's: copied 1:1
            source = spec.client_conf("source")
            held = describe(admin_client(source.pop("bootstrap.servers"), source),
                            spec.audit_topic)
            target = admin or spec.client_conf("target")
            ensure_topics(spec.target_bootstrap, [TopicSpec(
                spec.audit_topic, held[0] if held else 3, -1, AUDIT_TOPIC_CONFIG)],
                client={k: v for k, v in target.items() if k != "bootstrap.servers"})
        libs = ensure_kafka_libs()
        self.write_config(spec)
        cmd = java_command(libs, MAIN, str(self.folder / "mm2.properties"), heap=HEAP,
                           folder=self.folder, options=spec.java_options())
        self._child = spawn(cmd, self.folder, self.die_with_parent,
                            f"the mirror {spec.source} -> {spec.target}")
        try:
            self._wait_joined(spec, timeout_s)
            self._start_watch(spec)
        except BaseException:
            self.down()
            raise

    def _wait_joined(self, spec: MirrorSpec, timeout_s: float) -> None:
        target = spec.client_conf("target")
        admin = admin_client(target.pop("bootstrap.servers"), target)
        store = f"mm2-offsets.{spec.source}.internal"
        deadline = time.monotonic() + timeout_s
        while True:
            if self._child is not None and self._child.poll() is not None:
                raise ClusterStartFailed(f"MirrorMaker 2 exited during start-up:\n"
                                         f"{self.log_tail()}",
                                         hint=f"the full log is {self.log_file}")
            try:
                if store in admin.list_topics(timeout=2).topics:
                    return
            except Exception:  # KafkaException: the target does not answer yet
                pass
            if time.monotonic() > deadline:
                raise ClusterStartFailed(f"MirrorMaker 2 did not join {spec.target} within "
                                         f"{timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        texts = []
        for f in (self.folder / "stdout.log", self.log_file):
            if f.is_file():
                texts.extend(f.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(texts[-lines:])

    def kill(self) -> None:
        """SIGKILL (drills and tests: the mirror dies between two offset commits)."""
        pid = self.pid()
        if pid is None:
            raise BrokerError(f"no mirror is running from {self.folder}")
        os.kill(pid, signal.SIGKILL)
        if self._child is not None and self._child.pid == pid:
            self._child.wait(30)
        elif not wait_gone(pid, 30):
            raise BrokerError(f"the mirror (pid {pid}) outlived SIGKILL for 30 s")

    def start(self, timeout_s: float = 120.0, admin: dict[str, str] | None = None) -> None:
        """Start again what ``up`` started last (after ``kill`` or ``down``), its secured
        clusters' settings read again from their files."""
        spec = self.spec()
        if spec is None:
            raise BrokerError(f"no mirror was ever started from {self.folder}")
        self.up(spec, timeout_s, admin)

    def status(self) -> dict | None:
        spec = self.spec()
        if spec is None:
            return None
        pid, watch = self.pid(), self.watch_pid()
        return {"source": spec.source, "target": spec.target, "topics": spec.pattern,
                "pid": pid, "state": "stopped" if pid is None else process_state(pid),
                "log": str(self.log_file), "watch_pid": watch,
                "watch_state": "stopped" if watch is None else process_state(watch),
                "watch_log": str(self.watch_folder / "stdout.log")}

    def down(self, timeout_s: float = 30.0) -> int | None:
        """Stop this folder's MirrorMaker 2 (SIGTERM: it commits its offsets and leaves) and
        its watcher; returns the pid of MirrorMaker 2 stopped, None if none ran. Safe to
        repeat."""
        watch = self.watch_pid()
        if watch is not None:
            _terminate(watch, timeout_s)
            (self.watch_folder / "pid").unlink(missing_ok=True)
        pid = self.pid()
        if pid is None:
            return None
        _terminate(pid, timeout_s)
        (self.folder / "pid").unlink(missing_ok=True)
        return pid


def _live_pid(pid_file: Path, child: subprocess.Popen | None, *marks: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and ours: our own ``child``, or a
    process whose command line holds every one of ``marks`` (started by another command)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if child is not None and child.pid == pid:
        # poll() answers None while another thread waits on the child: /proc says too.
        return pid if child.poll() is None and alive(pid) else None
    cmdline = _cmdline(pid)
    ours = all(mark.encode() in cmdline for mark in marks)
    return pid if ours and alive(pid) else None


def _cmdline(pid: int) -> bytes:
    """``pid``'s command line, b"" when it is gone (reaped first if it is our child). Empty for
    a moment while the process execs (``setpriv`` becoming ``java`` or ``python``): seen, a
    watcher just started taken for a dead one. Asked again then, for up to a second."""
    deadline = time.monotonic() + 1.0
    while True:
        reap(pid)
        try:
            cmdline = _read_cmdline(pid)
        except (FileNotFoundError, ProcessLookupError):
            return b""
        if cmdline or not alive(pid) or time.monotonic() > deadline:
            return cmdline
        time.sleep(0.02)


def _read_cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM, and SIGKILL after ``timeout_s``. A process that ends meanwhile (between the
    caller's check of its pid and a signal) is gone, as asked."""
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, timeout_s):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
    except ProcessLookupError:
        pass


def mirrors() -> list[Mirror]:
    """Every mirror ever started from ``mirrors_dir()``."""
    root = mirrors_dir()
    if not root.is_dir():
        return []
    return [Mirror(d) for d in sorted(root.iterdir()) if (d / "mirror.json").is_file()]
