"""Locate, and fetch when missing, the Apache Kafka jars the local cluster runs on.

The jars come from Maven Central: ``pom.xml`` beside this file names ``kafka_2.13`` at one pinned
version, and ``mvn dependency:copy-dependencies`` copies it with its runtime dependencies into the
cache directory. ``make setup`` calls :func:`ensure_kafka_libs`; ``docket-broker up`` calls it too,
so a user who skipped setup gets the fetch (and its errors) at that point instead of a Java trace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .errors import KafkaLibsMissing

KAFKA_VERSION = "4.1.1"
POM = Path(__file__).with_name("pom.xml")
# The class a complete download must contain; a half-copied cache fails this check.
_MARKER_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"


def jar_cache_dir(override_var: str, name: str) -> Path:
    """``$override_var`` when set, else ``<user cache>/docket/<name>/libs``."""
    override = os.environ.get(override_var)
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "docket" / name / "libs"


def kafka_libs_dir() -> Path:
    """Where the jars live: ``$DOCKET_KAFKA_LIBS``, else a per-version folder in the user cache."""
    return jar_cache_dir("DOCKET_KAFKA_LIBS", f"kafka-{KAFKA_VERSION}")


def kafka_libs_present(libs: Path | None = None) -> bool:
    libs = libs or kafka_libs_dir()
    return (libs / _MARKER_JAR).is_file()


def ensure_kafka_libs(libs: Path | None = None, quiet: bool = True) -> Path:
    """Return the jar folder, running ``mvn`` first when the jars are not there yet."""
    libs = libs or kafka_libs_dir()
    if not kafka_libs_present(libs):
        fetch_with_maven(POM, libs, _MARKER_JAR, f"Apache Kafka {KAFKA_VERSION}", quiet=quiet)
    return libs


def fetch_with_maven(pom: Path, libs: Path, marker: str, what: str, quiet: bool = True,
                     error: type[Exception] = KafkaLibsMissing) -> None:
    """Copy the dependencies ``pom`` names into ``libs`` (``-Dlibs=DIR`` in the pom), all or
    nothing: a half-finished copy stays in ``libs.partial`` and never passes for the real one."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(
            f"the {what} jars are not in {libs} and `mvn` is not installed",
            hint="install Maven (apt-get install maven) or point the environment variable "
            "for this folder at a copy of the jars",
        )
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies", f"-Dlibs={partial}"]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (partial / marker).is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise error(
            f"fetching {what} from Maven Central failed (mvn exit {proc.returncode}):\n{tail}",
            hint="check that Maven Central is reachable; the command was: " + " ".join(cmd),
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
