"""The Debian packages as a user installs them (as root, on this machine): ``make deb`` builds
``docket-agent`` and ``docket-audit``; ``dpkg -i`` installs them; their files, users, folders
and units are checked; the installed agent runs its ``--version`` and validates the shipped
configuration, its virtualenv holds no PySpark and the bytecode of every module the agent
imports; every installed unit passes ``systemd-analyze verify`` with nothing on stderr and the
agent's unit scores "OK" or better in ``systemd-analyze security --offline=true`` (printed);
the installed agent speaks the notify protocol to a socket this test listens on; ``dpkg
--purge`` leaves nothing behind.

PID 1 here is not systemd: the services are not started, the agent is run by hand. Skipped
when not root or without dh-virtualenv; marked ``packages`` (``make test-packages`` runs them
alone). A build takes about 1.5 minutes with pip's and Maven's caches warm.
``DOCKET_DEB_DIR=DIR`` takes the packages ``make deb`` already put in DIR instead."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, consume_counts, write_config
from tests.integration.test_agent_service import NotifyListener

REPO = Path(__file__).resolve().parents[2]
AGENT_VENV = Path("/opt/venvs/docket-agent")
AUDIT_VENV = Path("/opt/venvs/docket-audit")
UNITS = {"docket-agent": ["docket-agent.service"],
         "docket-audit": ["docket-audit-count@.service", "docket-audit-land.service",
                          "docket-audit-reconcile.service", "docket-dashboard.service"]}
LEFT_BEHIND = [AGENT_VENV, AUDIT_VENV, Path("/etc/docket"), Path("/var/lib/docket"),
               Path("/var/lib/docket-audit"), Path("/usr/bin/docket-agent"),
               Path("/usr/bin/docket-audit"), Path("/etc/default/docket-agent"),
               Path("/lib/systemd/system/docket-agent.service"),
               Path("/usr/lib/sysusers.d/docket-agent.conf"),
               Path("/usr/lib/tmpfiles.d/docket-agent.conf"),
               Path("/etc/systemd/system/multi-user.target.wants/docket-agent.service")]

# Printed by the installed interpreter: how many modules of the virtualenv importing the agent
# loaded (the standard library's bytecode is Debian's python3's), then each without bytecode.
UNCOMPILED = """
import importlib.util, os, sys
import agent.service, agent.cli
assert agent.service.__file__.startswith(sys.prefix + "/"), agent.service.__file__
sources = [m.__file__ for m in list(sys.modules.values())
           if getattr(m, "__file__", None) and m.__file__.endswith(".py")
           and m.__file__.startswith(sys.prefix + "/")]
print("modules", len(sources))
for path in sources:
    if not os.path.exists(importlib.util.cache_from_source(path)):
        print(path)
"""

pytestmark = [
    pytest.mark.packages,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs packages: needs root"),
    pytest.mark.skipif(shutil.which("dh_virtualenv") is None or shutil.which("dpkg") is None,
                       reason="dh-virtualenv / dpkg not installed (make setup as root)"),
]


def _run(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600),
                          **kw)


def _purge() -> subprocess.CompletedProcess:
    return _run("dpkg", "--purge", "docket-agent", "docket-audit")


@pytest.fixture(scope="module")
def installed():
    given = os.environ.get("DOCKET_DEB_DIR")
    if given:
        debs = Path(given)
    else:
        build = _run("make", "--no-print-directory", "deb", cwd=REPO, timeout=2400)
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        debs = REPO / "dist"
    packages = {name: next(debs.glob(f"{name}_*.deb")) for name in UNITS}
    assert not Path("/etc/docket").exists(), "docket is installed already: purge it first"
    res = _run("dpkg", "-i", *map(str, packages.values()))
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield res.stdout + res.stderr
    finally:
        purge = _purge()
        assert purge.returncode == 0, purge.stdout + purge.stderr
        left = [str(p) for p in LEFT_BEHIND if p.exists() or p.is_symlink()]
        users = [u for u in ("docket", "docket-audit") if _exists(pwd.getpwnam, u)]
        groups = [g for g in ("docket", "docket-audit") if _exists(grp.getgrnam, g)]
        assert not left and not users and not groups, \
            f"after dpkg --purge: files {left}, users {users}, groups {groups}"


def _exists(lookup, name: str) -> bool:
    try:
        lookup(name)
        return True
    except KeyError:
        return False


def test_the_packages_install_their_files_users_and_a_working_agent(installed):
    assert "docket-agent: edit /etc/docket/agent.toml" in installed
    for path in ("/opt/venvs/docket-agent/bin/docket-agent", "/usr/bin/docket-agent",
                 "/etc/docket/agent.toml", "/etc/default/docket-agent",
                 "/lib/systemd/system/docket-agent.service",
                 "/usr/lib/sysusers.d/docket-agent.conf", "/usr/lib/tmpfiles.d/docket-agent.conf",
                 "/etc/docket/audit.env", "/etc/docket/reconcile.toml",
                 "/usr/bin/docket-audit", "/usr/bin/docket-dashboard",
                 "/usr/share/doc/docket-agent/install.md"):
        assert Path(path).exists(), path
    conffiles = _run("dpkg-query", "-W", "-f=${Conffiles}", "docket-agent").stdout
    assert "/etc/docket/agent.toml" in conffiles and "/etc/default/docket-agent" in conffiles
    user = pwd.getpwnam("docket")
    assert "docket" in grp.getgrnam("adm").gr_mem
    state = Path("/var/lib/docket").stat()
    assert (state.st_uid, state.st_mode & 0o777) == (user.pw_uid, 0o750)
    assert Path("/etc/systemd/system/multi-user.target.wants/docket-agent.service").is_symlink()
    # Configurations that may hold credentials: readable by their service's group only.
    for path, group in (("/etc/docket/agent.toml", "docket"),
                        ("/etc/docket/audit.env", "docket-audit"),
                        ("/etc/docket/reconcile.toml", "docket-audit")):
        st = Path(path).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == \
            (0, grp.getgrnam(group).gr_gid, 0o640), (path, oct(st.st_mode), st.st_gid)
    # An upgrade restarts running units and leaves stopped ones stopped; a removal stops them.
    # (PID 1 is not systemd here: the maintainer scripts are read, not seen acting.)
    for package, units in UNITS.items():
        postinst = Path(f"/var/lib/dpkg/info/{package}.postinst").read_text()
        prerm = Path(f"/var/lib/dpkg/info/{package}.prerm").read_text()
        preinst = Path(f"/var/lib/dpkg/info/{package}.preinst")
        restarted = " ".join(re.findall(r"try-restart ([^>]*)>", postinst)).replace("'", "")
        stopped = " ".join(re.findall(r"systemctl stop ([^>]*)>", prerm)).replace("'", "")
        for unit in units:
            name = unit.replace("@.", "@*.")
            assert name in restarted.split(), (package, unit, postinst)
            assert name in stopped.split(), (package, unit, prerm)
        assert not preinst.exists() or "stop" not in preinst.read_text(), preinst.read_text()

    version = _run(str(AGENT_VENV / "bin/docket-agent"), "--version")
    assert version.returncode == 0 and re.fullmatch(r"docket-agent \d+\.\d+\.\d+\n",
                                                    version.stdout), version
    valid = _run(str(AGENT_VENV / "bin/docket-agent"), "validate", "--config",
                 "/etc/docket/agent.toml")
    assert valid.returncode == 0, valid.stderr
    assert "does not exist yet; watched until it appears" in valid.stderr
    audit_valid = _run(str(AUDIT_VENV / "bin/docket-audit"), "validate", "--config",
                       "/etc/docket/reconcile.toml")
    assert audit_valid.returncode == 0, audit_valid.stderr

    # Bytecode for every module the agent imports (postinst compiles it): the agent's user may
    # not write the virtualenv, and a start without it compiles every module again. -B: this
    # check, run as root, writes none itself.
    uncompiled = _run(str(AGENT_VENV / "bin/python"), "-B", "-c", UNCOMPILED, cwd="/")
    assert uncompiled.returncode == 0 and uncompiled.stdout.startswith("modules "), uncompiled
    assert uncompiled.stdout.split("\n", 1)[1] == "", uncompiled.stdout
    verify = _run("dpkg", "--verify", "docket-agent")          # and no file of the package
    assert verify.returncode == 0 and verify.stdout == "", verify.stdout[:3000]  # rewritten

    assert not list(AGENT_VENV.glob("lib/python3*/site-packages/pyspark*"))
    no_spark = _run(str(AGENT_VENV / "bin/python"), "-c", "import pyspark")
    assert no_spark.returncode != 0 and "No module named 'pyspark'" in no_spark.stderr
    assert not (AGENT_VENV / "bin/docket-audit").exists()
    assert list(AUDIT_VENV.glob("lib/python3*/site-packages/pyspark"))
    assert list(AUDIT_VENV.glob("share/docket/spark-kafka-jars/spark-sql-kafka-*.jar"))
    # the audit jobs' Java, built with the package: the jar the installed jobs look for, in
    # the folder the units name (no JDK on the audit host)
    jvm_libs = AUDIT_VENV / "share/docket/audit-jvm-jars"
    wanted = _run(str(AUDIT_VENV / "bin/python"), "-c",
                  "from audit.jobs.jvm import jar_path; print(jar_path())",
                  env={**os.environ, "DOCKET_AUDIT_JVM_LIBS": str(jvm_libs)})
    assert wanted.returncode == 0, wanted.stderr
    assert Path(wanted.stdout.strip()).parent == jvm_libs, wanted.stdout
    assert Path(wanted.stdout.strip()).is_file(), sorted(jvm_libs.iterdir())
    for unit in ("docket-audit-land.service", "docket-audit-count@.service"):
        assert f"Environment=DOCKET_AUDIT_JVM_LIBS={jvm_libs}\n" in (
            Path("/lib/systemd/system") / unit).read_text()


def test_every_unit_verifies_cleanly_and_the_agent_unit_is_hardened(installed):
    for units in UNITS.values():
        for unit in units:
            name = unit.replace("@.", "@kafka-local.")      # a template needs an instance
            res = _run("systemd-analyze", "verify", name)
            assert res.returncode == 0 and not res.stderr.strip(), f"{name}: {res.stderr}"
    res = _run("systemd-analyze", "security", "--offline=true",
               "/lib/systemd/system/docket-agent.service")
    score = re.search(r"Overall exposure level for docket-agent\.service: ([\d.]+) (\w+)",
                      res.stdout)
    assert score, res.stdout[-2000:] + res.stderr
    print(f"systemd-analyze security docket-agent.service: {score.group(1)} {score.group(2)}")
    assert score.group(2) in ("OK", "SAFE", "PERFECT"), score.group(0)


def test_the_installed_agent_speaks_the_notify_protocol(installed, kafka, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_bytes(b"one\ntwo\n")
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")],
                            "topic": "pkg.notify"}])
    notify = NotifyListener(tmp_path / "notify.sock")
    agent = AgentProcess(config, tmp_path / "agent.log", binary=AGENT_VENV / "bin/docket-agent",
                         env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                              "WATCHDOG_USEC": "400000"})
    agent.start()
    try:
        notify.wait_for("READY=1")
        first = notify.messages[0]
        assert "READY=1" in first and "STATUS=recovered 0 sealed slot(s)" in first, first
        assert "agent test-agent ready" in agent.whole_log()      # logged after the recovery
        deadline = time.monotonic() + 60
        while sum("WATCHDOG=1" in m for m in notify.messages) < 3:
            assert time.monotonic() < deadline, notify.messages
            time.sleep(0.05)
        agent.proc.send_signal(signal.SIGHUP)
        notify.wait_for("STATUS=reloaded 1 source(s)")
        reload_at = next(i for i, m in enumerate(notify.messages) if "RELOADING=1" in m)
        ready = [i for i, m in enumerate(notify.messages) if "READY=1" in m]
        assert ready[0] < reload_at < ready[1], notify.messages
    finally:
        rc = agent.stop()
    assert rc == 0
    notify.wait_for("STOPPING=1")


def test_the_installed_agent_ships_with_its_native_send_path(installed, kafka, tmp_path):
    """The package's virtualenv holds the native extension make setup built; the installed
    agent, its send path left to the default (``auto``), runs it and ships every line, each
    once. It loads the librdkafka of the package's confluent-kafka (one version for both
    paths), found beside it in the package's ``site-packages``."""
    ext = _run(str(AGENT_VENV / "bin/python"), "-c",
               "import docket_native, confluent_kafka; "
               "print(docket_native.LIBRDKAFKA_VERSION, confluent_kafka.libversion()[0]); "
               "print(*{l.split()[-1] for l in open('/proc/self/maps') if 'librdkafka' in l})")
    assert ext.returncode == 0, ext.stderr
    versions, mapped = ext.stdout.splitlines()
    native, python = versions.split()
    assert native == python, versions
    assert mapped.startswith(str(AGENT_VENV)) and " " not in mapped, mapped
    ensure_topics(kafka.bootstrap_servers, [TopicSpec("pkg.native", partitions=3)])
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = 5000
    (logs / "a.log").write_bytes(b"".join(b"pkg-%06d\n" % i for i in range(lines)))
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")],
                            "topic": "pkg.native"}])
    agent = AgentProcess(config, tmp_path / "agent.log", binary=AGENT_VENV / "bin/docket-agent")
    agent.start()
    try:
        counts = consume_counts(kafka.bootstrap_servers, "pkg.native", lines, timeout_s=120)
    finally:
        rc = agent.stop()
    assert rc == 0
    assert f"send path native (docket_native, librdkafka {native}) (auto: the " \
        "native extension is installed)" in agent.whole_log()
    assert set(counts) == {b"pkg-%06d" % i for i in range(lines)}
    assert max(counts.values()) == 1
