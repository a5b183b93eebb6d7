"""A JVM application logging exceptions through Logback (from Maven Central), its
RollingFileAppender rolling the file every 128 KB while the agent tails it with
``multiline = { preset = "java" }``: every event the library wrote arrives as one record whose
value is what the library wrote for it (its stack trace, causes and suppressed exceptions
included), each exactly once — and the cluster tier's count job (Spark) counts each event once.

``tests/jvm/LogbackApp.java`` logs the events; beside the rolling file, an appender of its own
writes what the same layout made of each event into a reference file, framed by length: the
test's expectation comes from the logging library, not from a split of the file."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from audit.contract.collect import read_audit_topic
from broker.admin import ensure_audit_topic
from docket_common.dirs import jar_cache_dir
from docket_common.maven import fetch_with_maven
from tests.agentkit import consume_counts
from tests.auditkit import AuditJob, all_done
from tests.integration.test_agent_end_to_end import setup_agent

JVM = Path(__file__).resolve().parents[1] / "jvm"
LOGBACK = "1.5.38"
EVENTS = 6_000
PATTERN = "%d{yyyy-MM-dd HH:mm:ss.SSS} [%thread] %-5level %logger{36} - %msg%n"

LOGBACK_XML = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>{logs}/app.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>{logs}/app.log.%i</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>20</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>128KB</maxFileSize>
      <checkIncrement>1 milliseconds</checkIncrement>
    </triggeringPolicy>
    <encoder><pattern>{pattern}</pattern></encoder>
  </appender>
  <appender name="REFERENCE" class="LogbackApp$Reference">
    <pattern>{pattern}</pattern>
    <file>{reference}</file>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
    <appender-ref ref="REFERENCE"/>
  </root>
</configuration>
"""


class LogbackMissing(Exception):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(f"{message} ({hint})" if hint else message)


@pytest.fixture(scope="module")
def logback_app(tmp_path_factory) -> str:
    """The class path of LogbackApp compiled against Logback's jars (fetched by Maven once)."""
    if shutil.which("javac") is None:
        pytest.fail("javac (a JDK) is needed: the project's broker runs on it too")
    libs = jar_cache_dir("DOCKET_LOGBACK_LIBS", f"logback-{LOGBACK}")
    if not (libs / f"logback-classic-{LOGBACK}.jar").is_file():
        fetch_with_maven(JVM / "pom.xml", libs, f"logback-classic-{LOGBACK}.jar",
                         f"Logback {LOGBACK}", error=LogbackMissing)
    classes = tmp_path_factory.mktemp("logback-classes")
    subprocess.run(["javac", "-d", str(classes), "-cp", f"{libs}/*",
                    str(JVM / "LogbackApp.java")], check=True)
    return f"{libs}/*:{classes}"


def reference_events(path: Path) -> list[bytes]:
    """What the layout made of each event (``LogbackApp.Reference``: length, newline, bytes)."""
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        nl = data.index(b"\n", at)
        n = int(data[at:nl])
        out.append(data[nl + 1:nl + 1 + n])
        at = nl + 1 + n
    return out


@pytest.mark.slow
def test_logback_events_with_stack_traces_arrive_whole_one_record_each(
        kafka, tmp_path, topic_name, logback_app):
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              source={"multiline": {"preset": "java"}})
    reference = tmp_path / "reference"
    xml = tmp_path / "logback.xml"
    xml.write_text(LOGBACK_XML.format(logs=logs, reference=reference, pattern=PATTERN))
    agent.start()
    try:
        app = subprocess.run(["java", f"-Dlogback.configurationFile={xml}", "-cp", logback_app,
                              "LogbackApp", str(EVENTS)], capture_output=True, text=True,
                             timeout=300)
        assert app.returncode == 0, app.stderr[-3000:]
        written = reference_events(reference)
        assert len(written) == EVENTS
        rolled = sorted(p.name for p in logs.iterdir())
        assert len(rolled) >= 5, rolled            # the appender did roll, several times
        expected = Counter(e[:-1] for e in written)    # each without its last newline
        assert sum(e.count(b"\n") for e in written) > 5 * EVENTS   # traces, not lines
        values: list[bytes] = []
        counts = consume_counts(kafka.bootstrap_servers, topic_name, EVENTS, 300,
                                on_msg=lambda m: values.append(m.value()))
        status = agent.status()
    finally:
        agent.stop()
    got = Counter(values)
    missing = expected - got
    extra = got - expected
    assert not missing, f"{sum(missing.values())} events not arrived whole, e.g. " \
        f"{list(missing)[:1]}; arrived that were not events: {list(extra)[:2]}"
    assert not extra, f"{sum(extra.values())} records that are not one event once: " \
        f"{list(extra)[:2]}"
    assert len(counts) == EVENTS
    assert status["dropped_events"] == 0
    # The cluster tier: the count job over the topic once, each record counted by its identity.
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    count = AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers",
                      kafka.bootstrap_servers, "--audit-topic", audit_topic,
                      "--topics", re.escape(topic_name), "--once",
                      "--checkpoint-dir", str(tmp_path / "ckpt-count")],
                     tmp_path / "count.log").start()
    all_done(count, timeout_s=600)
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    rows = [r for k, r in state.by_tier().get("kafka-local", {}).items() if k[0] == topic_name]
    assert not state.malformed and rows, count.log_text()
    tier = {"count": sum(r.count for r in rows), "distinct": sum(r.distinct for r in rows),
            "duplicates": sum(r.duplicates for r in rows)}
    print(f"kafka-local tier: {tier} over {len(rows)} window(s)")
    assert tier == {"count": EVENTS, "distinct": EVENTS, "duplicates": 0}, tier
