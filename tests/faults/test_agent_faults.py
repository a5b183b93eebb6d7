"""The agent under faults, against the real local Kafka: SIGKILLed five times while a writer
rotates its file, and the broker paused for 30 s under a steady 20,000 lines/s."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agent.buffer.inspect import inspect_pool
from agent.drain.drain import MAX_INFLIGHT_SLOTS
from audit.contract.collect import read_audit_topic
from broker.admin import ensure_audit_topic
from tests.agentkit import consume_counts, native_built
from tests.auditkit import AuditJob
from tests.integration.test_agent_end_to_end import (
    file_decisions,
    parse_id,
    setup_agent,
    start_writer,
)


def in_flight_ids(pool_path: Path) -> list[int]:
    """The ids a killed agent may have handed to Kafka without seeing them acknowledged: the
    drain takes sealed slots in sequence order, at most MAX_INFLIGHT_SLOTS at a time, so those
    are in the oldest that many sealed slots of its pool. Read without opening the pool (no
    recovery, no lock, nothing written): only these ids may arrive once more per kill."""
    view = inspect_pool(pool_path)
    assert not view.damaged, f"slots failing their CRC after a SIGKILL: {view.damaged}"
    return [parse_id(v) for s in view.sealed[:MAX_INFLIGHT_SLOTS] for _, _, v in s.records()]


# CI runs the path an agent runs by default (`broker.send_path = "auto"`): the native one where
# the extension is built, the Python one under `make soak` then (its run would cost a minute of
# CI's 45; the soak runs each path's 30 times: test_soak_sigkill_with_rotation...); where it is
# not built, CI runs the Python one.
BOTH_PATHS_PYTHON_IN_SOAK = pytest.mark.parametrize(
    "agent_send_path",
    [pytest.param("python", marks=[pytest.mark.soak] if native_built() else []), "native"],
    indirect=True)


@pytest.mark.slow
@BOTH_PATHS_PYTHON_IN_SOAK
def test_sigkill_five_times_loses_nothing_and_duplicates_only_in_flight_slots(
        kafka, tmp_path, topic_name, agent_send_path):
    figures = sigkill_run(kafka, tmp_path, topic_name, kills=5, total=1_000_000, rate=100_000,
                          send_path=agent_send_path)
    # The cluster tier (the Spark count job over the same topic) says the same by record
    # number: its duplicates are the duplicates counted by id, and nothing is missing.
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    cluster = cluster_tier(kafka, tmp_path, topic_name, audit_topic)
    assert cluster == {"records": 1_000_000 + figures["duplicates"], "distinct": 1_000_000,
                       "duplicates": figures["duplicates"],
                       "through": figures["numbers"] - 1, "missing": []}, (cluster, figures)


def cluster_tier(kafka, tmp_path, topic_name: str, audit_topic: str) -> dict:
    """The Spark count job (``--once``) over ``topic_name``, writing to ``audit_topic``: the
    kafka-local tier's records, distinct records, duplicates, highest record number and
    missing numbers, as the audit topic then says (printed as a JSON line)."""
    job = AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers",
                    kafka.bootstrap_servers, "--audit-topic", audit_topic,
                    "--topics", re.escape(topic_name), "--once",
                    "--checkpoint-dir", str(tmp_path / "ckpt")], tmp_path / "count.log").start()
    assert job.wait(600) == 0, job.log_text()
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    counts = [r for r in state.counts.values() if r.tier == "kafka-local"]
    [numbers] = [r for r in state.ranges.values() if r.tier == "kafka-local"]
    cluster = {"records": sum(r.count for r in counts),
               "distinct": sum(r.distinct for r in counts),
               "duplicates": sum(r.duplicates for r in counts),
               "through": numbers.through, "missing": numbers.missing}
    print(json.dumps({"cluster_tier": cluster}))
    return cluster


@pytest.mark.soak
def test_soak_sigkill_up_to_forty_times_while_four_million_lines_are_written(
        kafka, tmp_path, topic_name):
    sigkill_run(kafka, tmp_path, topic_name, kills=40, total=4_000_000, rate=80_000)


def cpu_hog(cpu: int) -> subprocess.Popen:
    """A busy loop on one core, so the agent, the broker and the writer share the other."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


SOAK_RUNS = int(os.environ.get("DOCKET_SOAK_RUNS", "30"))


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_soak_sigkill_with_rotation_at_three_rates_some_runs_with_a_cpu_hog(kafka,
                                                                           tmp_path_factory,
                                                                           agent_send_path):
    """``make soak``: the five-SIGKILL rotation run, SOAK_RUNS times, at 30,000 and 100,000
    lines/s and as fast as the writer can, every other run with a busy loop on one core. Each
    run's folder is kept when it fails (the agent log, state database and pool). One JSON line
    of figures at the end; any loss or excess duplicate fails the soak."""
    plans = [(rate, hog) for hog in (False, True) for rate in (30_000, 100_000, 0)]
    runs = []
    for i in range(SOAK_RUNS):
        rate, hog = plans[i % len(plans)]
        folder = tmp_path_factory.mktemp(f"soak-{i}")
        hogging = cpu_hog(0) if hog else None
        try:
            figures = sigkill_run(kafka, folder, f"soak.{i}.{os.getpid()}", kills=5,
                                  total=1_000_000, rate=rate, seed=i, check=False,
                                  send_path=agent_send_path)
        finally:
            if hogging is not None:
                hogging.kill()
                hogging.wait()
        figures.update(rate=rate or "max", cpu_hog=hog, folder=str(folder))
        runs.append(figures)
        figures["numbering_ok"] = (figures["number_holes"] == figures["number_clashes"] == 0
                                   and figures["duplicates_by_number"] == figures["duplicates"])
        if not figures["lost"] and not figures["over_bound"] and figures["numbering_ok"]:
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    summary = {"send_path": agent_send_path, "runs": len(runs),
               "kills": sum(r["kills"] for r in runs),
               "lost": sum(r["lost"] for r in runs),
               "duplicates": sum(r["duplicates"] for r in runs),
               "bound": sum(r["bound"] for r in runs),
               "over_bound": sum(r["over_bound"] for r in runs),
               "max_over_bound": max(r["max_over_bound"] for r in runs),
               "runs_with_loss": [r for r in runs if r["lost"]],
               "by_rate": {str(rate or "max"): sum(1 for r in runs if r["rate"] == (rate or "max"))
                           for rate in (30_000, 100_000, 0)},
               "with_cpu_hog": sum(1 for r in runs if r["cpu_hog"]),
               "duplicates_by_number": sum(r["duplicates_by_number"] for r in runs),
               "runs_with_numbering_broken": [r for r in runs if not r["numbering_ok"]]}
    print(json.dumps(summary))
    assert summary["lost"] == 0 and summary["over_bound"] == 0, summary
    assert not summary["runs_with_numbering_broken"], summary


def sigkill_run(kafka, tmp_path, topic_name, kills: int, total: int, rate: int,
                seed: int = 4, check: bool = True, send_path: str = "python",
                broker: dict | None = None, sections: dict | None = None) -> dict:
    """Kill the agent ``kills`` times at 0.8-1.6 s intervals while a writer rotates its file
    (rename-and-create and copytruncate alternately, every 50,000 lines); then every id must
    have arrived, and each id at most once more than the number of kills at which it was in a
    slot that could have been in flight. Returns the figures; ``check=False`` leaves judging
    them (but not the run's own sanity) to the caller. ``broker``: further settings of the
    agent's ``[broker]``; ``sections``: of its other sections."""
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              broker={"send_path": send_path, **(broker or {})},
                              **(sections or {}))
    pool_path = tmp_path / "state" / "buffer.pool"
    agent.start()
    writer = start_writer(logs, total, 50_000, rate)
    rng = random.Random(seed)
    allowance: Counter = Counter()
    done = 0
    try:
        while done < kills:
            time.sleep(rng.uniform(0.8, 1.6))
            agent.kill()
            done += 1
            ids = in_flight_ids(pool_path)
            allowance.update(ids)
            print(f"kill {done}: {len(ids)} records in slots that may have been in flight")
            agent.start()
        assert writer.wait(timeout=600) == 0
        numbers = RecordNumbers()
        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 600, parse_id,
                                on_msg=numbers.see)
        status = agent.status()
    finally:
        rc = agent.stop()
        writer.kill()
    assert rc == 0
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    over = {i: (c, allowance[i]) for i, c in counts.items() if c - 1 > allowance[i]}
    figures = {"kills": done, "written": total, "lost": len(missing),
               "duplicates": duplicates, "bound": sum(allowance.values()),
               "over_bound": len(over),
               "max_over_bound": max((c - 1 - a for c, a in over.values()), default=0),
               **numbers.figures()}
    print(json.dumps(figures))
    if missing or over:                    # the agent's file decisions, to tell what happened
        print(file_decisions(tmp_path / "agent.log"))
    journal = tmp_path / "state" / "loss-journal.jsonl"
    entries = journal.read_text().splitlines() if journal.exists() else []
    figures["journaled"] = len(entries)
    assert done == kills
    assert set(counts) <= set(range(total))
    if not check:
        return figures
    assert not missing, f"{len(missing)} missing, first {missing[:10]}"
    assert not over, f"{len(over)} ids arrived more often than the kills allow: " \
        f"{sorted(over.items())[:10]}"
    # Every rotation's copy is under the glob: nothing may be lost, so nothing journaled.
    assert entries == [] and status["dropped_events"] == 0, entries[:5]
    numbers.check(duplicates)
    return figures


class RecordNumbers:
    """What the ``docket-seq`` headers say of a stream: a duplicate is the same record sent
    again, so counted by record number the duplicates are the ones counted by id, every id has
    one number, no number stands for two ids, and with nothing journalled the numbers run from 0
    without a hole."""

    def __init__(self):
        self.id_of: dict[int, int] = {}
        self.number_of: dict[int, int] = {}
        self.records = 0
        self.clashes: list[tuple] = []
        self.unnumbered = 0
        self.incarnations: set[bytes] = set()

    def see(self, msg) -> None:
        h = dict(msg.headers() or ())
        if "docket-seq" not in h:
            self.unnumbered += 1
            return
        self.records += 1
        self.incarnations.add(h.get("docket-incarnation"))
        n, i = int.from_bytes(h["docket-seq"], "big"), parse_id(msg.value())
        if self.id_of.setdefault(n, i) != i or self.number_of.setdefault(i, n) != n:
            self.clashes.append((n, i, self.id_of[n], self.number_of.get(i)))

    def figures(self) -> dict:
        top = max(self.id_of, default=-1)
        return {"numbers": len(self.id_of), "number_holes": top + 1 - len(self.id_of),
                "duplicates_by_number": self.records - len(self.id_of),
                "number_clashes": len(self.clashes), "unnumbered": self.unnumbered,
                "incarnations": len(self.incarnations)}

    def check(self, duplicates_by_id: int) -> None:
        f = self.figures()
        assert f["unnumbered"] == 0 and f["incarnations"] == 1, f
        assert not self.clashes, f"(number, id, id before, number before): {self.clashes[:5]}"
        assert f["number_holes"] == 0, f
        assert f["duplicates_by_number"] == duplicates_by_id, f


@pytest.mark.slow
@BOTH_PATHS_PYTHON_IN_SOAK
def test_broker_paused_30s_under_20k_lines_per_s_the_pool_absorbs_it(kafka, tmp_path,
                                                                      topic_name,
                                                                      agent_send_path):
    broker_pause_run(kafka, tmp_path, topic_name, {"send_path": agent_send_path})


def broker_pause_run(kafka, tmp_path, topic_name, broker: dict) -> Counter:
    """The broker SIGSTOPped for 30 s under 20,000 lines/s: the agent keeps reading into its
    pool without burning a core, says the cluster is unreachable, catches up after; every id
    arrives with its event time and origin. Returns the counts by id (read_committed)."""
    cluster = kafka.controlled()
    rate, seconds = 20_000, 40
    total = rate * seconds
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name, broker=broker)
    agent.start()
    writer = start_writer(logs, total, 200_000, rate)
    began = time.monotonic()
    try:
        time.sleep(5)
        read_before = agent.metric("agent_source_read_events_total")
        cpu_before = agent.cpu_seconds()
        cluster.pause_node(1)
        paused = time.monotonic()
        print(f"paused {paused - began:.1f} s after the writer started, {read_before:.0f} read")
        try:
            time.sleep(30)
            cpu_outage = agent.cpu_seconds() - cpu_before
            during = agent.status()
            read_during = agent.metric("agent_source_read_events_total") - read_before
        finally:
            cluster.resume_node(1)
            pause_s = time.monotonic() - paused
        resumed = time.monotonic()
        deadline = resumed + 300
        while True:
            st = agent.status()
            if st["backlog"]["events"] == 0 and st["pool"]["filling_slots"] <= 1 \
                    and all(f["lag_bytes"] < 200_000 for f in st["files"].values()):
                break
            assert time.monotonic() < deadline, f"no catch-up within 300 s: {st}"
            time.sleep(0.2)
        catch_up = time.monotonic() - resumed
        assert writer.wait(timeout=600) == 0
        # Records sent again after the outage keep their event time and their origin header
        # (librdkafka's failed reports carry neither; the drain takes them from the slot).
        stamps, origins = [], Counter()
        ended_ms = int(time.time() * 1000) + 1000

        def inspect(msg):
            stamps.append(msg.timestamp()[1])
            origins[dict(msg.headers() or []).get("docket-origin")] += 1

        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 600, parse_id,
                                on_msg=inspect)
        outages = agent.metric("agent_drain_outages_total")
    finally:
        rc = agent.stop()
        writer.kill()
    print(f"{pause_s:.1f} s broker pause at {rate} lines/s: read {read_during:.0f} events "
          f"during it, "
          f"backlog {during['backlog']['events']} events at its end, agent CPU "
          f"{cpu_outage:.2f} s during it, catch-up {catch_up:.1f} s after SIGCONT")
    assert rc == 0
    assert read_during >= rate * 20, "the agent should keep reading while the broker is paused"
    # Not a timing claim: a spinning librdkafka burns one CPU-second per second of outage; the
    # agent, reading 20k lines/s into its pool, must stay far below that.
    assert cpu_outage < 0.5 * pause_s
    # Out of reach either way: the drain's probe unanswered, or librdkafka having closed every
    # connection after its 10 s request timeout ("all brokers down").
    assert during["backlog"]["events"] > 0 \
        and during["broker"]["state"] in ("unreachable", "all brokers down"), during["broker"]
    assert outages >= 1
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    assert not missing, f"{len(missing)} missing, first {missing[:10]}"
    assert set(counts) <= set(range(total))
    began_ms = int((time.time() - (time.monotonic() - began)) * 1000) - 1000
    wrong = [t for t in stamps if not began_ms <= t <= ended_ms]
    assert not wrong, f"{len(wrong)} records with a timestamp outside the run: {wrong[:5]}"
    assert list(origins) == [b"test-agent"], origins
    return counts
