"""Shared fixtures: a real local Apache Kafka from ``docket-broker``, started once per session.

``kafka`` is a 1-broker cluster (``aggregate`` a second one beside it, for mirrors); ``kafka3``
a 3-broker one (replication factor 3, ``min.insync.replicas=2``) for tests marked ``cluster3``.
All bind free ports chosen by the OS.
When ``KAFKA_BOOTSTRAP`` is set, ``kafka`` uses that cluster instead and starts nothing; tests
that kill or pause brokers then skip, since they cannot control a cluster they did not start.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.cluster import LocalCluster
from tests.agentkit import native_built
from tests.kafkautil import TEST_BROKER_PROPS


@dataclass
class Kafka:
    bootstrap_servers: str
    cluster: LocalCluster | None   # None when the cluster came from KAFKA_BOOTSTRAP

    def controlled(self) -> LocalCluster:
        if self.cluster is None:
            pytest.skip("the cluster comes from KAFKA_BOOTSTRAP; faults need one docket started")
        return self.cluster


def pytest_configure(config):
    """SIGTERM (what CI runners and ``timeout`` send) ends the session as Ctrl-C does, so the
    fixtures' teardown stops the brokers. Should pytest die without teardown (SIGKILL), the
    brokers die with it (``die_with_parent``)."""
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)


def _running(tmp_path_factory, name: str, brokers: int):
    """A cluster of ``brokers`` started for the session, stopped after it (or after the last
    test that uses it, for the ``RELEASED`` ones)."""
    cluster = LocalCluster(tmp_path_factory.mktemp(name), die_with_parent=True,
                           broker_props=TEST_BROKER_PROPS)
    layout = cluster.up(brokers=brokers, base_port=0)
    _LIVE[name] = cluster
    try:
        yield Kafka(layout.bootstrap_servers, cluster)
    finally:
        cluster.down()


# -- clusters only some tests use -----------------------------------------------------------------
# An idle broker costs about a tenth of a core (its JVM's own threads). Kept for the whole
# session, the clusters below slowed every test after their last user on a two-core host. So the
# tests that use one of them run one after another, and the cluster stops as soon as the last of
# them is done (pytest itself keeps a session fixture to the session's end). Each is named by its
# fixture; a test reaches one only through its arguments (or its fixtures'), never
# ``request.getfixturevalue``, so that the order below sees it.
RELEASED = ("kafka3", "kafka_sasl", "kafka_mtls", "second_local", "aggregate")
_LIVE: dict[str, LocalCluster] = {}
_LAST: dict[str, str] = {}                  # fixture → the node id of its last test
_GONE: set[str] = set()


def _released_by(item) -> list[str]:
    return [name for name in RELEASED if name in getattr(item, "fixturenames", ())]


@pytest.hookimpl(trylast=True)         # after -k and -m have deselected what does not run
def pytest_collection_modifyitems(session, config, items):
    """Within each folder, the files that use none of ``RELEASED`` first, then those that do,
    grouped by the first one they use (so each one's tests run together); otherwise pytest's
    order."""
    uses: dict = {}
    for item in items:
        uses.setdefault(item.path, set()).update(_released_by(item))
    folders = list(dict.fromkeys(item.path.parent for item in items))

    def key(pair):
        index, item = pair
        ranks = sorted(RELEASED.index(name) for name in uses[item.path])
        return folders.index(item.path.parent), ranks[:1] or [-1], ranks, index

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
    _LAST.clear()
    for item in items:
        for name in _released_by(item):
            _LAST[name] = item.nodeid


def pytest_runtest_setup(item):
    gone = [name for name in _released_by(item) if name in _GONE]
    if gone:
        raise RuntimeError(f"{item.nodeid} uses {gone}, stopped after {_LAST}: a fixture "
                           "reached through request.getfixturevalue? (tests/conftest.py)")


@pytest.hookimpl(trylast=True)         # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    for name in _released_by(item):
        if _LAST.get(name) == item.nodeid and name in _LIVE:
            _GONE.add(name)
            _LIVE.pop(name).down()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield Kafka(external, None)
        return
    yield from _running(tmp_path_factory, "kafka1", 1)


@pytest.fixture(scope="session")
def aggregate(tmp_path_factory):
    """A second 1-broker cluster beside ``kafka``: the aggregate a mirror copies into."""
    yield from _running(tmp_path_factory, "aggregate", 1)


@pytest.fixture(scope="session")
def second_local(tmp_path_factory):
    """A third 1-broker cluster: a second data centre's local cluster, mirrored into
    ``aggregate`` beside ``kafka``."""
    yield from _running(tmp_path_factory, "second_local", 1)


@pytest.fixture(scope="session")
def kafka3(tmp_path_factory):
    yield from _running(tmp_path_factory, "kafka3", 3)


@pytest.fixture(params=["python", "native"])
def agent_send_path(request):
    """The agent's send path (``broker.send_path``): a fault test taking it runs once with
    each; the native one skips where the extension is not built (``make setup`` builds it
    when cargo is there)."""
    if request.param == "native" and not native_built():
        pytest.skip("the native send path is not built here (make setup builds it with cargo)")
    return request.param


@pytest.fixture
def topic_name(request):
    """A topic name unique to this test, so tests sharing a cluster never see each other's data."""
    return f"t.{request.node.name[:40].replace('[', '.').replace(']', '')}.{uuid.uuid4().hex[:8]}"


# -- secured clusters (docs/security.md) ---------------------------------------------------------
@dataclass
class SecuredKafka:
    """A local cluster started with ``--security``; ``settings(user)`` are librdkafka settings
    reaching it as that user (``admin``: the super user docket's own admin work uses)."""
    bootstrap_servers: str
    cluster: LocalCluster
    security: str

    def settings(self, user: str = "admin") -> dict[str, str]:
        return self.cluster.client_settings(user)


def _secured(tmp_path_factory, name: str, security: str, brokers: int = 1,
             broker_props: dict | None = None, **more):
    """A secured cluster of ``brokers`` started for the session, stopped after it
    (``broker_props``: settings over ``TEST_BROKER_PROPS``; ``more``: ``LocalCluster``'s further
    arguments)."""
    cluster = LocalCluster(tmp_path_factory.mktemp(name), die_with_parent=True,
                           broker_props={**TEST_BROKER_PROPS, **(broker_props or {})}, **more)
    layout = cluster.up(brokers=brokers, base_port=0, security=security, timeout_s=300)
    _LIVE[name] = cluster
    try:
        yield SecuredKafka(layout.bootstrap_servers, cluster, security)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def idp(tmp_path_factory):
    """An OpenID Connect token endpoint on 127.0.0.1 (tests/oidckit.py) with one client per
    docket role, each id its principal's name."""
    from tests.oidckit import IdentityProvider

    provider = IdentityProvider(tmp_path_factory.mktemp("idp"), {
        role: secrets.token_urlsafe(18)
        for role in ("agent", "count", "land", "reconcile", "mirror")})
    yield provider.start()
    provider.stop()


@pytest.fixture(scope="session")
def kdc(tmp_path_factory):
    """A Kerberos realm on 127.0.0.1 (tests/krbkit.py) with one principal per docket role,
    each its principal's name, or None where Debian's MIT KDC is not installed."""
    from tests.krbkit import Realm, available

    if available() is not None:
        yield None
        return
    realm = Realm(tmp_path_factory.mktemp("kdc"), ("agent", "count", "land", "reconcile",
                                                    "mirror")).start()
    yield realm
    realm.stop()


@pytest.fixture
def krb(kdc):
    """``kdc``, or the test skipped saying what is missing."""
    if kdc is None:
        from tests.krbkit import available
        pytest.skip(available())
    return kdc


@pytest.fixture(scope="session")
def kafka_sasl(tmp_path_factory, idp, kdc):
    """A 1-broker cluster with a SASL_SSL listener taking SCRAM-SHA-512, OAUTHBEARER (tokens
    of ``idp``) and, where ``kdc`` is, GSSAPI (Kerberos tickets of its realm), ACLs
    enforced."""
    props, options = idp.broker_props(), idp.java_options()
    if kdc is not None:
        props = {**props, **kdc.broker_props(),
                 "sasl.enabled.mechanisms": props["sasl.enabled.mechanisms"] + ",GSSAPI"}
        options = [*options, *kdc.java_options()]
    yield from _secured(tmp_path_factory, "kafka_sasl", "sasl_ssl", broker_props=props,
                        java_options=options)


@pytest.fixture(scope="session")
def kafka_mtls(tmp_path_factory):
    """A 1-broker cluster with an SSL listener requiring client certificates, ACLs enforced."""
    yield from _secured(tmp_path_factory, "kafka_mtls", "mtls")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed on SQLite's "database is locked" (or "locking protocol") carries a
    diagnosis: how long the call took (the agent's connections wait 60 s for a lock), and,
    once the test's own cleanup has run, each database under its temporary folder with the
    locks ``/proc/locks`` still lists on it and whose they are, this process's descriptors on
    it and its threads — what another process or a connection left open still holds.
    ``tests/run_groups.py`` repeats the line at the end of a CI log. The diagnosis never fails
    the session: an error while making it is named in its place."""
    outcome = yield
    report = outcome.get_result()
    exc = call.excinfo.value if call.excinfo is not None else None
    if report.failed and isinstance(exc, sqlite3.OperationalError) and \
            ("locked" in str(exc) or "locking protocol" in str(exc)):
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        try:
            rest = _lock_diagnosis(tmp)
        except Exception as diag_exc:               # (a folder gone during the walk, …)
            rest = f"the rest could not be made: {diag_exc!r}"
        report.sections.append(("sqlite lock diagnosis", f"sqlite lock diagnosis: the call "
                                f"took {call.duration:.1f} s | {rest}"))


def _lock_diagnosis(tmp: Path | None) -> str:
    """One line: what holds the SQLite files under ``tmp`` (see pytest_runtest_makereport)."""
    parts = []
    try:
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        locks = []
    ours: dict[str, list[str]] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            ours.setdefault(os.readlink(f"/proc/self/fd/{fd}"), []).append(fd)
        except OSError:
            pass                                # closed meanwhile
    files = sorted(p for p in tmp.rglob("*") if p.name.endswith((".db", "-wal", "-shm"))) \
        if tmp is not None else []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        held = []
        for row in locks:
            cols = [c for c in row.split() if c != "->"]    # "->": a process waiting
            if len(cols) >= 8 and cols[5] == ident:
                pid = cols[4]
                who = "this process" if pid == str(os.getpid()) else _process(pid)
                held.append(f"{cols[1]} {cols[3]} {cols[6]}-{cols[7]} by {who}")
        parts.append(f"{path.relative_to(tmp)} (inode {st.st_ino}): fds here "
                     f"{ours.get(str(path), [])}, locks [{'; '.join(held)}]")
    parts.append("threads: " + ", ".join(sorted(t.name for t in threading.enumerate())))
    return " | ".join(parts)


def _process(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        cmd = "?"
    return f"pid {pid} ({cmd.strip()})"
