"""The jars of Spark's Kafka connector, fetched once from Maven Central into the user cache.

``pom.xml`` beside this file names ``spark-sql-kafka-0-10_2.13`` for the installed PySpark;
``make setup`` (through ``docket-audit fetch``) copies it and the three jars it needs that PySpark
does not ship. The jobs hand the folder's jars to Spark with ``spark.jars``: no ``--packages``,
so nothing is resolved or downloaded when a job starts.
"""

from __future__ import annotations

from pathlib import Path

from docket_common.dirs import jar_cache_dir
from docket_common.maven import fetch_with_maven

from ..contract.errors import AuditError

SPARK_VERSION = "4.0.1"
POM = Path(__file__).with_name("pom.xml")
_MARKER_JAR = f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar"


class SparkLibsMissing(AuditError):
    """The connector jars are not in the cache and could not be fetched."""


def spark_kafka_libs_dir() -> Path:
    """``$DOCKET_SPARK_KAFKA_LIBS``, else a per-version folder in the user cache."""
    return jar_cache_dir("DOCKET_SPARK_KAFKA_LIBS", f"spark-kafka-{SPARK_VERSION}")


def ensure_spark_kafka_libs(libs: Path | None = None, quiet: bool = True) -> list[Path]:
    """The connector jars, fetching them first when they are missing."""
    libs = libs or spark_kafka_libs_dir()
    if not (libs / _MARKER_JAR).is_file():
        fetch_with_maven(POM, libs, _MARKER_JAR, f"Spark {SPARK_VERSION} Kafka connector",
                         quiet=quiet, error=SparkLibsMissing)
    return sorted(libs.glob("*.jar"))
