"""The audit jobs' Java, beside this file: ``SeqNumber.java`` (``docket_seq``: a record's
8-byte number read as a long), ``SeqRuns.java`` (``docket_seq_runs``: the aggregation that
turns a group's record numbers into runs) and ``PartitionRuns.java`` (a micro-batch compacted
within each partition, no shuffle, where each partition's numbers are runs), run in the JVM,
per record.

They are compiled once per source and Spark version with the JDK's ``javac`` against the venv's
PySpark jars (the classes they run with, so no download), into the user cache; ``make setup``
(through ``docket-audit fetch``) builds them ahead. Where they cannot be built (no ``javac``: a
host with a Java runtime only; a build that fails) or loaded, a job logs why and uses Spark SQL
built-ins instead: the same numbers, groups and runs, slower (``docs/performance.md``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from docket_common.dirs import jar_cache_dir

from ..contract.errors import AuditError

SOURCES = tuple(Path(__file__).with_name(f"{name}.java")
                for name in ("SeqNumber", "SeqRuns", "PartitionRuns"))
NUMBER_CLASS, RUNS_CLASS = "dev.docket.audit.SeqNumber", "dev.docket.audit.SeqRuns"
COMPACT_CLASS = "dev.docket.audit.PartitionRuns"
NUMBER_FUNCTION, RUNS_FUNCTION = "docket_seq", "docket_seq_runs"

log = logging.getLogger("docket.audit.jvm")


class JvmBuildFailed(AuditError):
    """The jobs' Java could not be built: no ``javac``, a compile that failed, a cache folder
    that could not be written."""


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def jar_path() -> Path:
    """Where the jar of these sources for this PySpark is (or goes): the name carries a digest
    of them all, so an edited source or another Spark builds anew."""
    import pyspark

    digest = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES)
                            + pyspark.__version__.encode()).hexdigest()[:16]
    return jar_cache_dir("DOCKET_AUDIT_JVM_LIBS", "audit-jvm") / f"docket-audit-{digest}.jar"


def ensure_jar(required: bool = False) -> Path | None:
    """The jobs' Java as a jar, compiled first when missing. None where it cannot be built (no
    ``javac``, or a build that fails: logged, and the jobs use Spark SQL built-ins); with
    ``required`` (``docket-audit fetch``: ``make setup``, the package build) an error instead."""
    jar = jar_path()
    if jar.is_file():
        return jar
    try:
        return _build(jar)
    except JvmBuildFailed as e:
        if required:
            raise
        log.warning("%s; the audit jobs read and compact record numbers with Spark SQL "
                    "built-ins, which is slower", e)
        return None


def _build(jar: Path) -> Path:
    javac = _javac()
    if javac is None:
        raise JvmBuildFailed("no javac (a JDK 17 or later) on this host to build "
                             + " and ".join(s.name for s in SOURCES),
                             hint="install a JDK (apt-get install openjdk-17-jdk-headless)")
    try:
        jar.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
            classes = Path(tmp) / "classes"
            cmd = [javac, "--release", "17", "-nowarn", "-cp", f"{pyspark_jars()}/*",
                   "-d", str(classes), *map(str, SOURCES)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise JvmBuildFailed(
                    f"building the audit jobs' Java failed (javac exit {proc.returncode}):\n"
                    + (proc.stdout + proc.stderr).strip()[-2000:],
                    hint="the command was: " + " ".join(cmd))
            partial = Path(tmp) / jar.name
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:   # a jar is a zip
                for f in sorted(classes.rglob("*.class")):
                    z.write(f, f.relative_to(classes).as_posix())
            os.replace(partial, jar)  # whole or not at all: a reader never sees half a jar
    except OSError as e:              # a folder not writable, javac not runnable
        raise JvmBuildFailed(f"building the audit jobs' Java into {jar.parent} failed: {e}",
                             hint="set DOCKET_AUDIT_JVM_LIBS to a writable folder") from e
    log.info("built %s", jar)
    return jar


def java_class(spark, name: str):
    """The class ``name`` of the session's JVM, through py4j (a ``JavaPackage`` where the JVM
    has no such class: calling it raises)."""
    cls = spark._jvm
    for part in name.split("."):
        cls = getattr(cls, part)
    return cls


def register(spark) -> bool:
    """Register ``docket_seq`` and ``docket_seq_runs`` in ``spark`` (its JVM started with the
    jar in ``spark.jars``, as ``audit.jobs.spark.spark_session`` starts it) and check that
    ``PartitionRuns`` loads; False, with a warning, where the classes are not there.
    Registering again replaces them, harmlessly."""
    found = []
    for name in (NUMBER_CLASS, RUNS_CLASS, COMPACT_CLASS):
        try:
            found.append(java_class(spark, name)())
        except Exception as e:  # TypeError: py4j's JavaPackage, no such class on the driver's
            log.warning(        # classpath; Py4JJavaError: a class this JVM cannot load
                "%s cannot be loaded in this Spark (%s): record numbers are read and "
                "compacted with Spark SQL built-ins", name, type(e).__name__)
            return False
    spark.udf.registerJavaFunction(NUMBER_FUNCTION, NUMBER_CLASS, "bigint")
    sql = spark._jvm.org.apache.spark.sql
    spark._jsparkSession.udf().register(RUNS_FUNCTION,
                                        sql.functions.udaf(found[1], sql.Encoders.LONG()))
    log.info("record numbers read (%s), each batch compacted within its partitions "
             "(PartitionRuns) or, where a partition's numbers are no runs, cut into runs (%s) "
             "in the JVM", NUMBER_FUNCTION, RUNS_FUNCTION)
    return True
