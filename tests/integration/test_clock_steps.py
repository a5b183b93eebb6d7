"""The wall clock stepped under a running agent, ten minutes each way, during traffic.

One real ``docket-agent`` whose wall clock the test steps (``tests/clockshift.c`` with
``CLOCK_SHIFT_FILE``: ``agentkit.clock_step_env``) +10 min, back, −10 min and back, 6 s apart,
while a writer appends 500 lines/s for 30 s. Lingers, outage timers and retries run on the monotonic
clock, so delivery never stalls; event times (and so the audit's windows) follow the stepped
clock; the audit rounds go on after each step — a step back does not hold the next round ten
minutes — and their ``seq`` only grows. Every id arrives once; the Spark count job and the
reconciler (its clock three hours ahead, so the windows ten minutes ahead are judged too) judge
every window of the topic complete (the windows are the audit's 10 minutes, the count job's
too), and raise no loss alert."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
import uuid

import pytest
from confluent_kafka import Consumer

from broker.admin import ensure_audit_topic
from tests.agentkit import AgentProcess, clock_step_env, consume_counts, stop_with_writer
from tests.auditkit import judged_windows
from tests.faults.test_agent_faults import cluster_tier
from tests.integration.test_agent_end_to_end import parse_id, setup_agent, start_writer

# 90 s of one agent whose clock is stepped four times: `make soak`. CI keeps the fleet of agents
# whose clocks are off (test_clock_skew.py) and the caught-up rule's unit tests.
pytestmark = [pytest.mark.soak,
              pytest.mark.skipif(shutil.which("cc") is None,
                                 reason="needs a C compiler for tests/clockshift.c")]

TOTAL, RATE = 15_000, 500
STEPS = [(5, 600), (11, 0), (17, -600), (23, 0)]       # (s after the start, clock offset s)
WINDOW_MS = 600_000                 # the audit's default, the count job's too


def audit_rounds(bootstrap: str, audit_topic: str, emitter: str) -> list[tuple[int, int, int]]:
    """(broker append time ms, partition, seq) of every audit record ``emitter`` wrote, in
    each partition's order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.subscribe([audit_topic])
    out, idle = [], 0
    try:
        while idle < 5:
            msgs = c.consume(1000, timeout=1)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                if m.error():
                    continue
                rec = json.loads(m.value())
                if rec.get("emitter") == emitter:
                    out.append((m.timestamp()[1], m.partition(), rec["seq"]))
    finally:
        c.close()
    return out


def test_clock_steps_of_ten_minutes_each_way_stall_nothing_and_raise_no_false_loss(
        kafka, tmp_path, topic_name):
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              audit={"topic": audit_topic, "interval_ms": 2000})
    shift = tmp_path / "clock-shift"
    agent = AgentProcess(agent.config, agent.log,
                         env=clock_step_env(shift, tmp_path / "build"))
    agent.start()
    writer = start_writer(logs, TOTAL, 10**9, RATE)
    began = time.monotonic()
    stepped_at, sent_by_second = [], []
    try:
        for at, offset in STEPS:
            while time.monotonic() - began < at:
                sent_by_second.append(agent.metric("agent_drain_sent_events_total"))
                time.sleep(1)
            shift.write_text(str(offset))
            stepped_at.append((time.time() * 1000, time.monotonic()))   # the broker's time
        assert writer.wait(timeout=120) == 0
        counts = consume_counts(kafka.bootstrap_servers, topic_name, TOTAL, 120, parse_id)
        time.sleep(5)                                         # two more audit rounds
        steps_seen = agent.metric("agent_clock_steps_total")
        retried = agent.metric("agent_drain_retried_events_total")
    finally:
        rc = stop_with_writer(agent, writer)
    assert rc == 0, agent.log_text()
    # The shim's steps, each seen once (a step of the machine's own clock would be counted too).
    shim_steps = [float(s) for s in re.findall(r"the wall clock stepped ([-+][\d.]+) s",
                                                 agent.whole_log()) if abs(float(s)) > 300]
    assert len(shim_steps) == len(STEPS) <= steps_seen, (shim_steps, steps_seen)

    # Delivery never stalled: every 3 s while the writer wrote, more was acknowledged.
    stalls = [i for i in range(3, len(sent_by_second))
              if sent_by_second[i] == sent_by_second[i - 3]]
    assert not stalls, (stalls, sent_by_second)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    assert len(counts) == TOTAL and set(counts) == set(range(TOTAL))
    assert duplicates <= retried

    # The audit rounds went on after every step (within 3 intervals of the true time) and
    # their seq never went back in any partition.
    # (The window widened by however far the machine's own wall clock moved since the step.)
    rounds = audit_rounds(kafka.bootstrap_servers, audit_topic, "test-agent/agent")
    for step_ms, step_mono in stepped_at:
        moved_ms = (time.time() * 1000 - step_ms) - (time.monotonic() - step_mono) * 1000
        low, high = step_ms + min(0, moved_ms), step_ms + 6000 + max(0, moved_ms)
        assert any(low < t <= high for t, _, _ in rounds), \
            (step_ms, moved_ms, sorted(t for t, _, _ in rounds))
    for partition in {p for _, p, _ in rounds}:
        seqs = [s for _, p, s in rounds if p == partition]
        assert seqs == sorted(seqs), (partition, seqs)

    cluster = cluster_tier(kafka, tmp_path, topic_name, audit_topic)
    assert cluster["records"] == cluster["distinct"] == TOTAL and cluster["missing"] == []
    verdicts = judged_windows(kafka.bootstrap_servers, audit_topic, topic_name,
                              tmp_path / "r.db")
    with sqlite3.connect(tmp_path / "r.db") as db:
        alerts = [row for row in db.execute("SELECT kind, summary FROM alerts")
                  if row[0] == "loss"]
    # Events were stamped with the stepped clock: those read 10 min ahead and 10 min behind
    # lie 20 min apart, in windows of their own.
    starts = sorted(int(w) for w in verdicts)
    print(json.dumps({"fault": "clock_steps", "events": TOTAL, "lost": TOTAL - len(counts),
                      "duplicates": duplicates, "windows": len(starts),
                      "window_span_min": (starts[-1] - starts[0]) // WINDOW_MS,
                      "audit_rounds": len({s for _, _, s in rounds}), "loss_alerts": alerts}))
    assert verdicts and set(verdicts.values()) == {"complete"}, verdicts
    assert len(starts) >= 2 and starts[-1] - starts[0] >= WINDOW_MS, starts
    assert not alerts, alerts
