"""The audit jobs' Java build (``audit.jobs.jvm``) where it cannot be built: no ``javac``, a
``javac`` that fails, a folder that cannot be made. A job goes on with Spark SQL built-ins
(``ensure_jar`` gives None and says why in the log); ``docket-audit fetch`` (``make setup``,
the package build) stops with the reason. The build that works is run by
``tests/integration/test_count_sql.py`` and ``test_packages.py``."""

from __future__ import annotations

import logging
import stat

import pytest

from audit.jobs import jvm
from audit.jobs.jvm import JvmBuildFailed, ensure_jar


@pytest.fixture
def libs(tmp_path, monkeypatch):
    folder = tmp_path / "libs"
    monkeypatch.setenv("DOCKET_AUDIT_JVM_LIBS", str(folder))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    return folder


def fake_javac(tmp_path, monkeypatch, body: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    javac = bin_dir / "javac"
    javac.write_text("#!/bin/sh\n" + body + "\n")
    javac.chmod(javac.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    return javac


def test_no_javac_means_the_sql_built_ins_and_fetch_says_what_to_install(libs, tmp_path,
                                                                          monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level(logging.WARNING, logger="docket.audit.jvm"):
        assert ensure_jar() is None
    assert "no javac" in caplog.text and "Spark SQL built-ins" in caplog.text
    with pytest.raises(JvmBuildFailed, match="no javac") as e:
        ensure_jar(required=True)
    assert "openjdk" in e.value.hint
    assert not libs.exists() or not list(libs.iterdir())


def test_a_javac_that_fails_leaves_no_jar_and_its_output_is_in_the_error(libs, tmp_path,
                                                                          monkeypatch, caplog):
    fake_javac(tmp_path, monkeypatch, 'echo "error: invalid target release: 17" >&2; exit 2')
    with caplog.at_level(logging.WARNING, logger="docket.audit.jvm"):
        assert ensure_jar() is None
    assert "invalid target release" in caplog.text
    with pytest.raises(JvmBuildFailed, match="javac exit 2"):
        ensure_jar(required=True)
    assert list(libs.iterdir()) == []              # no jar, no half-built folder left


def test_javac_from_java_home_comes_first(libs, tmp_path, monkeypatch):
    fake_javac(tmp_path, monkeypatch, "exit 3")             # the one on PATH
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    javac = home / "bin" / "javac"
    javac.write_text("#!/bin/sh\nexit 4\n")
    javac.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    with pytest.raises(JvmBuildFailed, match="javac exit 4"):
        ensure_jar(required=True)


def test_a_folder_that_is_a_file_is_a_build_failure_not_a_crash(libs, tmp_path, monkeypatch):
    fake_javac(tmp_path, monkeypatch, "exit 0")
    libs.parent.mkdir(exist_ok=True)
    libs.write_text("not a folder")
    assert ensure_jar() is None
    with pytest.raises(JvmBuildFailed) as e:
        ensure_jar(required=True)
    assert "DOCKET_AUDIT_JVM_LIBS" in e.value.hint


def test_the_jar_name_follows_the_sources(libs, monkeypatch, tmp_path):
    first = jvm.jar_path()
    assert first.parent == libs and first.name.startswith("docket-audit-")
    edited = tmp_path / "SeqRuns.java"
    edited.write_bytes(jvm.SOURCES[1].read_bytes() + b"\n")
    monkeypatch.setattr(jvm, "SOURCES", (jvm.SOURCES[0], edited))
    assert jvm.jar_path() != first
