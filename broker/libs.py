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


def kafka_libs_dir() -> Path:
    """Where the jars live: ``$DOCKET_KAFKA_LIBS``, else a per-version folder in the user cache."""
    override = os.environ.get("DOCKET_KAFKA_LIBS")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "docket" / f"kafka-{KAFKA_VERSION}" / "libs"


def kafka_libs_present(libs: Path | None = None) -> bool:
    libs = libs or kafka_libs_dir()
    return (libs / _MARKER_JAR).is_file()


def ensure_kafka_libs(libs: Path | None = None, quiet: bool = True) -> Path:
    """Return the jar folder, running ``mvn`` first when the jars are not there yet."""
    libs = libs or kafka_libs_dir()
    if kafka_libs_present(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLibsMissing(
            f"the Apache Kafka {KAFKA_VERSION} jars are not in {libs} and `mvn` is not installed",
            hint="install Maven (apt-get install maven) or set DOCKET_KAFKA_LIBS to a folder "
            "holding the Kafka jars",
        )
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [mvn, "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dkafka.libs={partial}"]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not kafka_libs_present(partial):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise KafkaLibsMissing(
            f"fetching Apache Kafka {KAFKA_VERSION} from Maven Central failed "
            f"(mvn exit {proc.returncode}):\n{tail}",
            hint="check that Maven Central is reachable; the command was: " + " ".join(cmd),
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    return libs
