"""A secured local cluster, and the least-privilege ACLs of each docket role.

``docket-broker up --security sasl_ssl|mtls`` makes its own certificate authority, the brokers'
certificate and one credential per user, sets the brokers' listeners, TLS and authorizer from
them, and creates the SCRAM users when it formats the storage. Layout of a secured data
directory (beside ``cluster.json`` and the ``node-N`` folders of ``broker.cluster``)::

    DATA_DIR/security/           mode 0700: nobody but the cluster's owner lists or opens it
      ca.crt                     the cluster's CA certificate: what every client trusts
      ca.key                     its private key (0600); signs the certificates below
      broker.pem                 the brokers' private key and certificate (0600), CN=broker,
                                 SAN IP:127.0.0.1, DNS:localhost: Kafka's PEM keystore
      users/NAME.password        sasl_ssl: NAME's SCRAM-SHA-512 password, no newline (0600)
      users/NAME.crt             mtls: NAME's certificate (CN=NAME), signed by ca.crt
      users/NAME.key             mtls: its private key, PKCS#8 (0600)
      users/NAME.pem             mtls: key and certificate in one file (0600), for Java clients

Users: ``admin`` (a super user: docket's own admin work, topic creation, ACLs), one per role
(``agent``, ``count``, ``land``, ``reconcile``, ``mirror``), and ``broker``, the brokers' own
identity (a super user too: replication and the controller quorum need ``ClusterAction``).

Listeners (one client port and one controller port per node, as for a plain cluster):

- the client listener, on the node's client port, is ``SASL_SSL`` (SCRAM-SHA-512) or ``SSL``
  with ``ssl.client.auth=required``; brokers replicate over it too (inter-broker listener), as
  ``User:broker``: with SCRAM in ``sasl_ssl`` mode, with their certificate in ``mtls`` mode;
- the controller listener is ``SSL`` with client certificates required, in both modes: a
  PLAINTEXT one would authenticate every local process as ``User:ANONYMOUS``, which the brokers'
  registration (``ClusterAction``) would then need as a super user.

Secrets never appear on a command line: the storage tool takes SCRAM credentials only as
``--add-scram`` arguments, so ``broker.cluster`` hands them to ``java`` in an argument file
(``java @FILE``, mode 0600, deleted after the format). ``server.properties`` names the brokers'
password file through Kafka's ``DirectoryConfigProvider`` instead of holding the password.

The second half of this module declares, once, which ACLs each role needs
(:data:`ROLE_GRANTS`); ``docket-broker acl`` creates them through the AdminClient as ``admin``,
prints the equivalent ``kafka-acls`` lines, and ``docs/security.md`` lists them.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from docket_common.names import AUDIT_TOPIC, RECONCILE_GROUP

from .errors import BrokerError, SecuritySetupFailed

PLAINTEXT, SASL_SSL, MTLS = "plaintext", "sasl_ssl", "mtls"
MODES = (PLAINTEXT, SASL_SSL, MTLS)
SCRAM = "SCRAM-SHA-512"
ADMIN = "admin"
BROKER = "broker"                                   # the brokers' own identity
ROLES = ("agent", "count", "land", "reconcile", "mirror")
USERS = (ADMIN, *ROLES)                             # the users a client may be
SUPER_USERS = (ADMIN, BROKER)
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# A certificate's subject "CN=agent" (or "CN=agent,O=...") is the principal User:agent.
PRINCIPAL_RULES = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
CERT_DAYS = 825


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise BrokerError(f"--security {mode!r} is not one of {', '.join(MODES)}")
    return mode


def check_user(user: str) -> str:
    if user not in (*USERS, BROKER):
        raise BrokerError(f"no user {user!r} on a docket-broker cluster",
                          hint=f"the users are {', '.join(USERS)}")
    return user


def write_private(path: Path, data: str) -> None:
    """``data`` into a new file only its owner can read (created 0600, never wider)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)


@dataclass(frozen=True)
class Security:
    """The security of one local cluster: ``mode`` and its files in ``folder``
    (``DATA_DIR/security``)."""
    mode: str
    folder: Path

    def __post_init__(self) -> None:
        check_mode(self.mode)

    @property
    def secured(self) -> bool:
        return self.mode != PLAINTEXT

    # -- files --------------------------------------------------------------------------------
    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def broker_keystore(self) -> Path:
        return self.folder / "broker.pem"

    @property
    def users_dir(self) -> Path:
        return self.folder / "users"

    def password_file(self, user: str) -> Path:
        return self.users_dir / f"{user}.password"

    def cert_file(self, user: str) -> Path:
        return self.users_dir / f"{user}.crt"

    def key_file(self, user: str) -> Path:
        return self.users_dir / f"{user}.key"

    def keystore_file(self, user: str) -> Path:
        """Key and certificate in one PEM file: a Java client's ``ssl.keystore.location``."""
        return self.users_dir / f"{user}.pem"

    def password(self, user: str) -> str:
        """``user``'s SCRAM password, read from its file (sasl_ssl)."""
        try:
            return self.password_file(check_user(user)).read_text()
        except FileNotFoundError:
            raise BrokerError(f"{self.password_file(user)} is missing",
                              hint="the cluster's credentials were removed; start it again "
                              "with `docket-broker up --fresh`") from None

    def _expected_files(self) -> list[Path]:
        if not self.secured:
            return []
        files = [self.ca_file, self.folder / "ca.key", self.broker_keystore]
        for user in (*USERS, BROKER):
            if self.mode == SASL_SSL:
                files.append(self.password_file(user))
            elif user != BROKER:
                files += [self.cert_file(user), self.key_file(user), self.keystore_file(user)]
        return files

    def check(self) -> None:
        """Raise unless every file this mode needs is there (a restart of an existing cluster
        must reuse them: its users and certificates are in its metadata and its clients)."""
        missing = [str(f) for f in self._expected_files() if not f.is_file()]
        if missing:
            raise SecuritySetupFailed(f"the cluster's credentials are incomplete: missing "
                                      f"{', '.join(missing)}",
                                      hint="start a new cluster with `docket-broker up --fresh`")

    def create(self) -> None:
        """Make the CA, the brokers' certificate and every user's credential (a new cluster)."""
        if not self.secured:
            return
        if shutil.which("openssl") is None:
            raise SecuritySetupFailed("`openssl` was not found; it makes the cluster's "
                                      "certificates", hint="install it (Debian: openssl)")
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, mode=0o700)
        self.users_dir.mkdir(mode=0o700)
        os.chmod(self.folder, 0o700)                # whatever the umask
        cluster = re.sub(r"[^A-Za-z0-9._-]", "-", self.folder.parent.name)[:40]
        key = self.folder / "ca.key"
        self._new_key(key)
        _openssl("req", "-x509", "-new", "-key", str(key), "-sha256", "-days", str(CERT_DAYS),
                 "-subj", f"/O=docket/CN=docket-broker CA {cluster}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-out", str(self.ca_file))
        broker_key = self.folder / "broker.key"
        self._new_key(broker_key)
        broker_cert = self._sign(BROKER, broker_key, self.folder / "broker.crt", server=True)
        write_private(self.broker_keystore, broker_key.read_text() + broker_cert.read_text())
        broker_key.unlink()
        broker_cert.unlink()
        for user in (*USERS, BROKER):
            if self.mode == SASL_SSL:
                write_private(self.password_file(user), secrets.token_urlsafe(24))
            elif user != BROKER:
                self._new_key(self.key_file(user))
                self._sign(user, self.key_file(user), self.cert_file(user), server=False)
                write_private(self.keystore_file(user), self.key_file(user).read_text()
                               + self.cert_file(user).read_text())
        (self.folder / "ca.srl").unlink(missing_ok=True)

    @staticmethod
    def _new_key(path: Path) -> None:
        """An EC P-256 key in PKCS#8 (what Kafka's PEM keystore reads), 0600."""
        write_private(path, "")
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", str(path))
        os.chmod(path, 0o600)

    def _sign(self, name: str, key: Path, out: Path, server: bool) -> Path:
        csr = out.with_suffix(".csr")
        ext = out.with_suffix(".ext")
        _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={name}", "-out", str(csr))
        usage = "serverAuth,clientAuth" if server else "clientAuth"
        ext.write_text("basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\n"
                       f"extendedKeyUsage={usage}\n"
                       + ("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else ""))
        try:
            _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_file),
                     "-CAkey", str(self.folder / "ca.key"), "-CAserial",
                     str(self.folder / "ca.srl"), "-CAcreateserial", "-sha256",
                     "-days", str(CERT_DAYS), "-extfile", str(ext), "-out", str(out))
        finally:
            csr.unlink(missing_ok=True)
            ext.unlink(missing_ok=True)
        return out

    # -- the brokers --------------------------------------------------------------------------
    @property
    def listener(self) -> str:
        """The name (and security protocol) of the client listener."""
        return {PLAINTEXT: "PLAINTEXT", SASL_SSL: "SASL_SSL", MTLS: "SSL"}[self.mode]

    def broker_properties(self, port: int, controller_port: int,
                          host: str = "127.0.0.1") -> dict[str, str]:
        """The listener, TLS, SASL and authorizer part of a node's ``server.properties``."""
        client = self.listener
        props = {
            "listeners": f"{client}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"{client}://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
        }
        if not self.secured:
            props["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
            return props
        props.update({
            "listener.security.protocol.map": f"{client}:{client},CONTROLLER:SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
            "listener.name.controller.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": PRINCIPAL_RULES,
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
        })
        if self.mode == MTLS:
            props["ssl.client.auth"] = "required"
        else:
            prefix = f"listener.name.{client.lower()}"
            props.update({
                "sasl.enabled.mechanisms": SCRAM,
                "sasl.mechanism.inter.broker.protocol": SCRAM,
                # The brokers' password stays in its file: Kafka reads it through the provider.
                "config.providers": "dir",
                "config.providers.dir.class":
                    "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
                f"{prefix}.{SCRAM.lower()}.sasl.jaas.config":
                    _jaas(BROKER, f"${{dir:{self.users_dir}:{BROKER}.password}}"),
            })
        return props

    def scram_arguments(self) -> list[str]:
        """``--add-scram`` arguments creating every user at format time. Secrets: hand them to
        ``java`` in an argument file, never on its command line."""
        if self.mode != SASL_SSL:
            return []
        out = []
        for user in (*USERS, BROKER):
            out += ["--add-scram", f"{SCRAM}=[name={user},password={self.password(user)}]"]
        return out

    # -- clients ------------------------------------------------------------------------------
    def client_settings(self, bootstrap_servers: str, user: str = ADMIN) -> dict[str, str]:
        """librdkafka settings connecting as ``user`` (the password read from its file)."""
        conf = {"bootstrap.servers": bootstrap_servers, **self._librdkafka(user)}
        if self.mode == SASL_SSL:
            conf["sasl.password"] = self.password(user)
        return conf

    def client_recipe(self, bootstrap_servers: str, user: str) -> dict[str, str]:
        """What a client of ``user`` sets, to print or document: librdkafka names, the password
        named by its file and never shown."""
        conf = {"bootstrap.servers": bootstrap_servers, **self._librdkafka(user)}
        if self.mode == SASL_SSL:
            conf["sasl.password"] = f"<the contents of {self.password_file(user)}>"
        return conf

    def _librdkafka(self, user: str) -> dict[str, str]:
        check_user(user)
        if self.mode == PLAINTEXT:
            return {}
        conf = {"security.protocol": self.listener, "ssl.ca.location": str(self.ca_file)}
        if self.mode == SASL_SSL:
            conf.update({"sasl.mechanism": SCRAM, "sasl.username": user})
        else:
            conf.update({"ssl.certificate.location": str(self.cert_file(user)),
                         "ssl.key.location": str(self.key_file(user))})
        return conf

    def java_client_properties(self, user: str) -> dict[str, str]:
        """The same for a Java client (kafka-acls, MirrorMaker 2, Spark's ``kafka.`` options):
        PEM trust and key stores, and the password read by ``DirectoryConfigProvider`` from its
        file, so that the properties hold no secret."""
        check_user(user)
        if self.mode == PLAINTEXT:
            return {}
        props = {"security.protocol": self.listener, "ssl.truststore.type": "PEM",
                 "ssl.truststore.location": str(self.ca_file)}
        if self.mode == SASL_SSL:
            props.update({
                "config.providers": "dir",
                "config.providers.dir.class":
                    "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
                "sasl.mechanism": SCRAM,
                "sasl.jaas.config": _jaas(user, f"${{dir:{self.users_dir}:{user}.password}}"),
            })
        else:
            props.update({"ssl.keystore.type": "PEM",
                          "ssl.keystore.location": str(self.keystore_file(user))})
        return props

    def docket_settings(self, user: str) -> dict[str, str]:
        """The same as docket's own security settings (``docket_common.kafka_security``:
        the agent's ``[broker]``, the reconciler's ``[reconcile]``, the Spark jobs' and the
        watcher's ``[kafka]``): files, never a secret."""
        check_user(user)
        if self.mode == PLAINTEXT:
            return {"security_protocol": "plaintext"}
        out = {"security_protocol": "sasl_ssl" if self.mode == SASL_SSL else "ssl"}
        if self.mode == SASL_SSL:
            out.update({"sasl_mechanism": SCRAM, "sasl_username": user,
                        "sasl_password_file": str(self.password_file(user))})
        out["ssl_ca_file"] = str(self.ca_file)
        if self.mode == MTLS:
            out.update({"ssl_certificate_file": str(self.cert_file(user)),
                        "ssl_key_file": str(self.key_file(user))})
        return out


def _jaas(user: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="{user}" password="{password}";')


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SecuritySetupFailed(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def write_argument_file(path: Path, args: list[str]) -> None:
    """``args`` as a ``java @FILE`` argument file (0600): each one quoted, ``\\`` and ``"``
    escaped, so that spaces in paths survive."""
    quoted = ['"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"' for a in args]
    write_private(path, "\n".join(quoted) + "\n")


# -- ACLs ---------------------------------------------------------------------------------------
# Each role's ACLs follow from the Kafka requests its clients send, as the brokers' authorizer
# log showed them (tests/integration/test_broker_security.py proves each list enough, and each
# entry needed). Kafka's rules make Read, Write, Delete and Alter imply Describe, and
# AlterConfigs imply DescribeConfigs, so Describe is granted alone only where nothing implies
# it. An idempotent producer needs no IdempotentWrite on the cluster once it may Write some
# topic (KIP-679, Kafka 3.0): granted only with ``legacy_brokers``, for older brokers.
#
# A grant names a resource of the role's scope (resolved by :func:`_resources`):
#   topics          the role's data topics (names and prefixes)
#   audit           the audit topic
#   groups          the role's consumer groups: its default, or --group / --group-prefix
#   catch-up        groups docket-caught-up-… (prefixed): the Spark jobs' reader of the audit
#                   topic assigns partitions and commits nothing; only FindCoordinator
#                   (Describe) names the group
#   watch           groups docket-mirror-watch-… (prefixed): the mirror's watcher, likewise
#   mm2-store       MirrorMaker 2's Connect worker store on this cluster:
#                   mm2-{configs,offsets,status}.PEER.internal
#   mm2-group       that worker's group, PEER-mm2
#   offset-syncs    mm2-offset-syncs.TARGET.internal (on the source)
#   heartbeats      the heartbeats topic its heartbeat connector writes on this cluster
#   remote-heartbeats  SOURCE.heartbeats on the target: the source's heartbeats, copied
RoleGrants = tuple[tuple[str, tuple[str, ...]], ...]
ROLE_GRANTS: dict[str, RoleGrants] = {
    # The agent produces its topics' records and its audit counts (idempotent producers).
    "agent": (("topics", ("Write",)), ("audit", ("Write",))),
    # Spark's Kafka source (4.0: offsets through the AdminClient, executors' consumers
    # assigned, nothing committed) reads the topics with no group ACL; the job reads the audit
    # topic (what the tiers caught up with) and writes its counts there.
    "count": (("topics", ("Read",)), ("audit", ("Read", "Write")), ("catch-up", ("Describe",)),
              ("groups", ("Read",))),
    "land": (("topics", ("Read",)), ("audit", ("Read", "Write")), ("catch-up", ("Describe",)),
             ("groups", ("Read",))),
    # The reconciler reads the audit topic in its group and commits its offsets there.
    "reconcile": (("audit", ("Read",)), ("groups", ("Read",))),
}
# The default consumer groups of a role ("groups" above); --group/--group-prefix replace them.
ROLE_GROUPS: dict[str, tuple[str, ...]] = {"reconcile": (RECONCILE_GROUP,)}
CATCH_UP_PREFIX = "docket-caught-up-"
AGENT_TXN_PREFIX = "docket-agent-"      # an agent's transactional id and marker group
WATCH_PREFIX = "docket-mirror-watch-"

# MirrorMaker 2 in dedicated mode, with broker/mirror.py's properties, for the flow
# SOURCE->TARGET: the worker of the flow (on TARGET) copies the topics and writes heartbeats and
# the offset syncs; with heartbeats on by default, a second worker for the disabled reverse flow
# (on SOURCE) writes heartbeats there, each worker with its own store and group. The watcher
# (audit.jobs.mirrored) reads the source's audit topic and the target's offset store, and
# writes the target's audit topic.
MIRROR_GRANTS: dict[str, RoleGrants] = {
    "source": (("topics", ("Read", "DescribeConfigs")), ("audit", ("Read", "DescribeConfigs")),
               ("mm2-store", ("Create", "Read", "Write", "DescribeConfigs")),
               ("mm2-group", ("Read",)), ("offset-syncs", ("Create", "Write")),
               ("heartbeats", ("Create", "Read", "Write", "DescribeConfigs")),
               ("watch", ("Describe",))),
    "target": (("topics", ("Create", "Write", "Alter", "AlterConfigs")),
               ("audit", ("Write", "Alter", "AlterConfigs")),
               ("mm2-store", ("Create", "Read", "Write", "DescribeConfigs")),
               ("mm2-group", ("Read",)), ("heartbeats", ("Create", "Write")),
               ("remote-heartbeats", ("Create", "Write", "AlterConfigs")),
               ("watch", ("Describe",))),
}
IDEMPOTENT_ROLES = ("agent", "count", "land")       # their producers are idempotent

_RESOURCE_TYPES = ("topic", "group", "cluster", "transactional-id")
_PATTERNS = ("literal", "prefixed")
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW rule: ``principal`` may do ``operation`` on the resource (``resource``,
    ``name``, ``pattern``) from any host."""
    resource: str                   # topic | group | cluster | transactional-id
    name: str
    pattern: str                    # literal | prefixed
    operation: str                  # Kafka's spelling: Read, Write, IdempotentWrite, ...
    principal: str

    def __post_init__(self) -> None:
        if self.resource not in _RESOURCE_TYPES or self.pattern not in _PATTERNS:
            raise BrokerError(f"not an ACL resource: {self.resource} {self.pattern}")

    def describe(self) -> str:
        what = "the cluster" if self.resource == "cluster" else \
            f"{self.resource} {self.name}{'*' if self.pattern == 'prefixed' else ''}"
        return f"{self.principal} {self.operation} on {what}"


@dataclass(frozen=True)
class Scope:
    """What a role's ACLs cover on one cluster: its data topics (literal names and prefixes;
    a regular expression cannot be an ACL), the audit topic, its consumer groups (None: the
    role's default) and, for the mirror, its flow and which end of it this cluster is."""
    topics: tuple[str, ...] = ()
    topic_prefixes: tuple[str, ...] = ()
    audit_topic: str | None = AUDIT_TOPIC
    groups: tuple[str, ...] | None = None
    group_prefixes: tuple[str, ...] = ()
    mirror_source: str | None = None
    mirror_target: str | None = None
    side: str | None = None                         # source | target (mirror only)
    legacy_brokers: bool = False                    # brokers before Kafka 3.0 (KIP-679)
    progress_topic: str | None = None               # agent, exactly once: its marker's topic


def role_acls(role: str, principal: str, scope: Scope) -> list[Acl]:
    """The least-privilege ACLs of ``role`` for ``principal`` on one cluster."""
    if role not in ROLES:
        raise BrokerError(f"no role {role!r}", hint=f"the roles are {', '.join(ROLES)}")
    if not principal or ":" not in principal:
        raise BrokerError(f"--principal {principal!r} is not TYPE:NAME",
                          hint="e.g. --principal User:agent")
    grants = MIRROR_GRANTS[_mirror_side(scope)] if role == "mirror" else ROLE_GRANTS[role]
    needs_topics = any(what == "topics" for what, _ in grants)
    if needs_topics and not (scope.topics or scope.topic_prefixes):
        raise BrokerError(f"the {role} role needs its topics",
                          hint="name them with --topic NAME or --topic-prefix PREFIX "
                          "(repeatable); a regular expression cannot be an ACL")
    out: set[Acl] = set()
    for what, operations in grants:
        for resource, name, pattern in _resources(role, what, scope):
            out |= {Acl(resource, name, pattern, op, principal) for op in operations}
    if scope.legacy_brokers and role in IDEMPOTENT_ROLES:
        out.add(Acl("cluster", CLUSTER_NAME, "literal", "IdempotentWrite", principal))
    if role == "agent" and scope.progress_topic:
        out |= _exactly_once_acls(principal, scope.progress_topic)
    return sorted(out)


def _exactly_once_acls(principal: str, progress_topic: str) -> set[Acl]:
    """An agent with ``broker.delivery = "exactly_once"``: its transactions (transactional id
    ``docket-agent-<id>``), its progress marker committed as an offset of its group of the
    same name, on the progress topic (Read: an offset commit's ACL). Write and Read imply
    Describe."""
    return {Acl("transactional-id", AGENT_TXN_PREFIX, "prefixed", "Write", principal),
            Acl("group", AGENT_TXN_PREFIX, "prefixed", "Read", principal),
            Acl("topic", progress_topic, "literal", "Read", principal)}


def _mirror_side(scope: Scope) -> str:
    if not (scope.mirror_source and scope.mirror_target):
        raise BrokerError("the mirror role needs its flow",
                          hint="add --flow SOURCE->TARGET (the clusters' names, MirrorMaker "
                          "2's aliases)")
    if scope.side not in ("source", "target"):
        raise BrokerError("the mirror role needs the end of the flow this cluster is",
                          hint="add --side source or --side target")
    return scope.side


def _resources(role: str, what: str, scope: Scope) -> list[tuple[str, str, str]]:
    """(resource type, name, pattern type) of each resource ``what`` names for ``role``."""
    def topics(*names: str) -> list[tuple[str, str, str]]:
        return [("topic", n, "literal") for n in names]

    # the mirror's worker on this cluster serves the flow whose target this cluster is
    peer = scope.mirror_target if scope.side == "source" else scope.mirror_source
    if what == "topics":
        return topics(*scope.topics) + [("topic", p, "prefixed") for p in scope.topic_prefixes]
    if what == "audit":
        return topics(scope.audit_topic) if scope.audit_topic else []
    if what == "groups":
        groups = ROLE_GROUPS.get(role, ()) if scope.groups is None else scope.groups
        return [("group", g, "literal") for g in groups] + \
               [("group", p, "prefixed") for p in scope.group_prefixes]
    if what == "catch-up":
        return [("group", CATCH_UP_PREFIX, "prefixed")]
    if what == "watch":
        return [("group", WATCH_PREFIX, "prefixed")] if scope.audit_topic else []
    if what == "mm2-store":
        return topics(*(f"mm2-{kind}.{peer}.internal" for kind in ("configs", "offsets",
                                                                     "status")))
    if what == "mm2-group":
        return [("group", f"{peer}-mm2", "literal")]
    if what == "offset-syncs":
        return topics(f"mm2-offset-syncs.{scope.mirror_target}.internal")
    if what == "heartbeats":
        return topics("heartbeats")
    if what == "remote-heartbeats":
        return topics(f"{scope.mirror_source}.heartbeats")
    raise AssertionError(what)


# -- through the AdminClient ------------------------------------------------------------------
def _binding(acl: Acl):
    return AclBinding(_resource_type(acl.resource), acl.name,
                      ResourcePatternType[acl.pattern.upper()], acl.principal, "*",
                      _operation(acl.operation), AclPermissionType.ALLOW)


def _resource_type(resource: str):
    return {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
            "cluster": ResourceType.BROKER,
            "transactional-id": ResourceType.TRANSACTIONAL_ID}[resource]


def _operation(name: str):
    snake = "".join("_" + c if c.isupper() else c for c in name).lstrip("_").upper()
    return AclOperation[snake]


def _from_binding(b) -> Acl:
    resource = {ResourceType.TOPIC: "topic", ResourceType.GROUP: "group",
                ResourceType.BROKER: "cluster",
                ResourceType.TRANSACTIONAL_ID: "transactional-id"}[b.restype]
    op = "".join(w.capitalize() for w in b.operation.name.split("_"))
    return Acl(resource, b.name, b.resource_pattern_type.name.lower(), op, b.principal)


def grant(admin, acls: Iterable[Acl], timeout_s: float = 30) -> None:
    """Create ``acls`` (as the AdminClient's user: a super user; creating one twice is fine)
    and return once the broker answering lists them all."""
    acls = list(acls)
    if not acls:
        return
    futures = admin.create_acls([_binding(a) for a in acls], request_timeout=timeout_s)
    _results(futures, "creating")
    _wait_listed(admin, acls, True, timeout_s)


def revoke(admin, acls: Iterable[Acl], timeout_s: float = 30) -> int:
    """Delete exactly ``acls``, and return (how many existed) once none is listed."""
    acls = list(acls)
    if not acls:
        return 0
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                b.host, b.operation, b.permission_type)
               for b in map(_binding, acls)]
    futures = admin.delete_acls(filters, request_timeout=timeout_s)
    deleted = sum(len(found) for found in _results(futures, "deleting"))
    _wait_listed(admin, acls, False, timeout_s)
    return deleted


def _wait_listed(admin, acls: list[Acl], present: bool, timeout_s: float) -> None:
    """ACLs reach a broker's authorizer through the metadata log, a moment after the
    controller accepted them: wait (bounded) until the answering broker lists them (or not)."""
    principals = sorted({a.principal for a in acls})
    deadline = time.monotonic() + timeout_s
    while True:
        listed = {a for p in principals for a in list_acls(admin, p, timeout_s)}
        if all((a in listed) == present for a in acls):
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"the ACLs {'created' if present else 'deleted'} are "
                              f"{'not yet' if present else 'still'} listed after "
                              f"{timeout_s:.0f}s")
        time.sleep(0.2)


def list_acls(admin, principal: str | None = None, timeout_s: float = 30) -> list[Acl]:
    """Every ALLOW ACL on the cluster (of ``principal`` when given)."""
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    bindings = admin.describe_acls(flt, request_timeout=timeout_s).result()
    return sorted(_from_binding(b) for b in bindings)


def _results(futures, doing: str) -> list:
    out = []
    for binding, fut in futures.items():
        try:
            out.append(fut.result())
        except KafkaException as exc:
            err = exc.args[0]
            raise BrokerError(f"{doing} the ACL {_from_binding(binding).describe()} failed: "
                              f"{err.str()}",
                              hint="ACLs are changed as the cluster's admin user; on a "
                              "cluster docket-broker did not start, use the kafka-acls lines "
                              "of `docket-broker acl grant --print`") from exc
    return out


# -- kafka-acls ---------------------------------------------------------------------------------
def kafka_acls_lines(acls: Iterable[Acl], bootstrap_servers: str = "BOOTSTRAP",
                     command_config: str = "admin.properties", action: str = "--add") -> list[str]:
    """The ``kafka-acls.sh`` commands doing what :func:`grant` (``--add``) or :func:`revoke`
    (``--remove``) does: one per principal and resource, its operations together."""
    by_resource: dict[tuple[str, str, str, str], list[str]] = {}
    for a in sorted(acls):
        by_resource.setdefault((a.principal, a.resource, a.name, a.pattern),
                               []).append(a.operation)
    lines = []
    for (principal, resource, name, pattern), ops in by_resource.items():
        words = ["kafka-acls.sh", "--bootstrap-server", bootstrap_servers, "--command-config",
                 command_config, action, "--allow-principal", principal]
        for op in ops:
            words += ["--operation", op]
        words += ["--cluster"] if resource == "cluster" else [f"--{resource}", name]
        if pattern == "prefixed":
            words += ["--resource-pattern-type", "prefixed"]
        if action == "--remove":
            words.append("--force")
        lines.append(shlex.join(words))
    return lines


GRANT_NAMES = {
    "topics": "its topics", "audit": "the audit topic",
    "groups": "its consumer groups: `--group`, `--group-prefix` (the reconciler's default: "
              "`docket-reconcile`)",
    "catch-up": f"groups `{CATCH_UP_PREFIX}` (prefixed)",
    "watch": f"groups `{WATCH_PREFIX}` (prefixed)",
    "mm2-store": "`mm2-{configs,offsets,status}.PEER.internal`",
    "mm2-group": "group `PEER-mm2`",
    "offset-syncs": "`mm2-offset-syncs.TARGET.internal`",
    "heartbeats": "`heartbeats`", "remote-heartbeats": "`SOURCE.heartbeats`",
}


def grants_table() -> str:
    """The ACLs of each role as a Markdown table (``docs/security.md`` holds it; a test
    compares)."""
    rows = ["| role | resource | operations |", "|---|---|---|"]
    for role, grants in [*ROLE_GRANTS.items(),
                         *((f"mirror, on the {side}", g) for side, g in MIRROR_GRANTS.items())]:
        for what, ops in grants:
            rows.append(f"| {role} | {GRANT_NAMES[what]} | {', '.join(ops)} |")
    return "\n".join(rows) + "\n"
