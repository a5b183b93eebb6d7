"""Locate, and fetch when missing, the Apache Kafka jars the local cluster runs on.

The jars come from Maven Central: ``pom.xml`` beside this file names ``kafka_2.13`` (and
MirrorMaker 2's ``connect-mirror`` and ``connect-runtime``) at one pinned version, and
``mvn dependency:copy-dependencies`` copies them with their runtime dependencies into the cache
directory. ``make setup`` calls :func:`ensure_kafka_libs`; ``docket-broker up`` calls it too,
so a user who skipped setup gets the fetch (and its errors) at that point instead of a Java trace.
"""

from __future__ import annotations

from pathlib import Path

from docket_common.dirs import jar_cache_dir
from docket_common.maven import fetch_with_maven

from .errors import KafkaLibsMissing

KAFKA_VERSION = "4.1.1"
POM = Path(__file__).with_name("pom.xml")
# The jars a complete download must contain; a half-copied cache (or one fetched before
# MirrorMaker 2 was in the pom) fails this check and is fetched again.
_MARKER_JARS = (f"kafka_2.13-{KAFKA_VERSION}.jar", f"connect-mirror-{KAFKA_VERSION}.jar")


def kafka_libs_dir() -> Path:
    """Where the jars live: ``$DOCKET_KAFKA_LIBS``, else a per-version folder in the user cache."""
    return jar_cache_dir("DOCKET_KAFKA_LIBS", f"kafka-{KAFKA_VERSION}")


def kafka_libs_present(libs: Path | None = None) -> bool:
    libs = libs or kafka_libs_dir()
    return all((libs / jar).is_file() for jar in _MARKER_JARS)


def ensure_kafka_libs(libs: Path | None = None, quiet: bool = True) -> Path:
    """Return the jar folder, running ``mvn`` first when the jars are not there yet."""
    libs = libs or kafka_libs_dir()
    if not kafka_libs_present(libs):
        fetch_with_maven(POM, libs, _MARKER_JARS[-1], f"Apache Kafka {KAFKA_VERSION}", quiet=quiet,
                         error=KafkaLibsMissing)
    return libs
