"""``broker.delivery = "exactly_once"`` against the real local Kafka: the agent SIGKILLed five
times while a writer rotates its file at 100 k lines/s (on each send path), and killed at
each step of a transaction (deterministically, by ``txn_crashing_agent.py``; on the path
``auto`` runs, the native one where it is built). A read_committed consumer must
see every id exactly once; a read_uncommitted one shows that the faults really happened (the
aborted copies of the transactions the kills cut short)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from broker.admin import ensure_audit_topic
from tests.agentkit import AgentProcess, consume_counts
from tests.auditkit import judged_windows
from tests.faults.test_agent_faults import broker_pause_run, cluster_tier, sigkill_run
from tests.integration.test_agent_end_to_end import parse_id, setup_agent, start_writer

CRASHING_AGENT = Path(__file__).with_name("txn_crashing_agent.py")
EXACTLY_ONCE = {"delivery": "exactly_once"}


@pytest.mark.slow
@pytest.mark.parametrize("agent_send_path", ["python", "native"], indirect=True)
def test_sigkill_five_times_with_rotation_a_read_committed_reader_sees_each_id_once(
        kafka, tmp_path, topic_name, agent_send_path):
    total = 1_000_000
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    # Five kills at random moments may all land between transactions (a fresh-clone run saw
    # that: 0 aborted copies); one more death, right after the first kill's restart, comes
    # inside a transaction whose records the broker holds, so some records surely are aborted.
    cut = "txn:produced"

    def cut_a_transaction(kill: int, agent: AgentProcess) -> bool:
        if kill != 1:
            return False
        crashing = AgentProcess(agent.config, tmp_path / "crashing.log",
                                prefix=[sys.executable], binary=CRASHING_AGENT,
                                env={"DOCKET_TEST_CRASH_AT": f"{cut}:1"})
        crashing.start(awaited=False)
        assert crashing.proc.wait(timeout=120) == -9, crashing.log_text()
        assert f"crash point {cut} reached" in crashing.whole_log()
        return True

    figures = sigkill_run(kafka, tmp_path, topic_name, kills=5, total=total, rate=100_000,
                          broker=EXACTLY_ONCE, sections={"audit": {"topic": audit_topic}},
                          check=False, between=cut_a_transaction, send_path=agent_send_path)
    uncommitted = consume_counts(kafka.bootstrap_servers, topic_name, total, 300, parse_id,
                                 isolation="read_uncommitted")
    figures["aborted_copies"] = sum(uncommitted.values()) - total
    print(json.dumps(figures))
    assert figures["lost"] == 0 and figures["duplicates"] == 0, figures
    assert figures["journaled"] == 0, figures
    assert figures["duplicates_by_number"] == 0 and figures["number_clashes"] == 0, figures
    assert figures["number_holes"] == 0 and figures["incarnations"] == 1, figures
    # The deaths cut transactions short: their records are in the log, aborted.
    assert figures["aborted_copies"] > 0, figures

    # The audit: the cluster tier (the Spark count job, read_committed) counts every record
    # once, and the reconciler judges every window of the topic complete at that tier.
    cluster = cluster_tier(kafka, tmp_path, topic_name, audit_topic)
    assert cluster == {"records": total, "distinct": total, "duplicates": 0,
                       "through": figures["numbers"] - 1, "missing": []}, (cluster, figures)
    verdicts = judged_windows(kafka.bootstrap_servers, audit_topic, topic_name, tmp_path / "r.db")
    print(json.dumps({"windows": verdicts}))
    assert verdicts and set(verdicts.values()) == {"complete"}, verdicts


# Under `make soak` (the pause matrix's harness, transactions on); CI keeps the at-least-once
# pause test and the exactly-once three-broker, crash-step and SIGKILL tests.
@pytest.mark.soak
def test_broker_paused_30s_exactly_once_no_loss_no_duplicate(kafka, tmp_path, topic_name):
    counts = broker_pause_run(kafka, tmp_path, topic_name, EXACTLY_ONCE)
    duplicates = {i: c for i, c in counts.items() if c > 1}
    assert not duplicates, f"{len(duplicates)} ids twice, e.g. {list(duplicates.items())[:5]}"


def _written(logs: Path, total: int) -> None:
    """``total`` lines in one file, written before the agent starts: it reads them at once,
    so its transactions are full and each crash step is reached with slots behind it."""
    writer = start_writer(logs, total, total + 1, 0)
    assert writer.wait(timeout=120) == 0


STEPS = {
    # step: (crash at the n-th time it is reached, what the next start must find)
    "txn:produced": "aborted",          # records written, marker not sent
    "txn:before_commit": "aborted",     # records and marker sent, no commit asked
    "txn:committed": "committed",       # commit answered, no slot freed
    "txn:freed": "committed",           # commit answered, one slot of it freed
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_kill_at_each_step_of_a_transaction_gives_neither_loss_nor_a_duplicate(
        kafka, tmp_path, topic_name, step):
    run = crash_run(kafka, tmp_path, topic_name, step)
    expected = STEPS[step]
    if expected == "aborted":            # the cut transaction's records: written, aborted
        assert run["aborted_copies"] > 0 and run["found_committed"] == 0, run
    else:                                # nothing sent twice: the marker named its slots
        assert run["aborted_copies"] == 0 and run["found_committed"] > 0, run


def test_a_kill_while_the_commit_is_on_its_way_gives_neither_loss_nor_a_duplicate(
        kafka, tmp_path, topic_name):
    """The commit request is written to a broker that does not answer (paused), and the agent
    dies before it could hear the answer; the broker then resumes and finds the request."""
    cluster = kafka.controlled()
    handshake = tmp_path / "handshake"
    handshake.mkdir()

    def pause_then_go():
        deadline = time.monotonic() + 120
        while not (handshake / "at-step").exists():
            assert time.monotonic() < deadline, "the crash step was never reached"
            time.sleep(0.01)
        cluster.pause_node(1)
        (handshake / "go").write_text("")

    run = crash_run(kafka, tmp_path, topic_name, "txn:before_commit",
                    env={"DOCKET_TEST_CRASH_HANDSHAKE": str(handshake),
                         "DOCKET_TEST_CRASH_DELAY_S": "1"},
                    during=pause_then_go, after_death=lambda: cluster.resume_node(1))
    # The broker, resumed, reads the request of the dead connection and commits; the next
    # start's init_transactions finds the transaction committed (or completes it), and the
    # marker then names its slots: none is sent again. (Had the coordinator not decided, the
    # start would abort it: aborted copies, and still every id once.)
    assert run["aborted_copies"] == 0 and run["found_committed"] > 0, run


def crash_run(kafka, tmp_path, topic_name, step: str, nth: int = 2, total: int = 60_000,
              env: dict | None = None, during=None, after_death=None) -> dict:
    """Write ``total`` lines; run the crashing agent until it dies at the ``nth`` time it
    reaches ``step``; start the real agent on the same state; then read the topic both ways.
    Asserts every id once for a read_committed reader; returns the figures."""
    agent_id = f"eos-{topic_name}"
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              agent={"id": agent_id}, broker=EXACTLY_ONCE,
                              buffer={"slot_size_bytes": 64 << 10})
    _written(logs, total)
    crashing = AgentProcess(agent.config, tmp_path / "crashing.log", prefix=[sys.executable],
                            binary=CRASHING_AGENT,
                            env={"DOCKET_TEST_CRASH_AT": f"{step}:{nth}", **(env or {})})
    crashing.start()
    try:
        if during is not None:
            during()
        assert crashing.proc.wait(timeout=120) == -9, crashing.log_text()
    finally:
        if crashing.alive():
            crashing.kill()
        if after_death is not None:
            after_death()
    assert f"crash point {step} reached" in crashing.whole_log()
    agent.start()
    try:
        committed = consume_counts(kafka.bootstrap_servers, topic_name, total, 120, parse_id)
    finally:
        assert agent.stop() == 0
    uncommitted = consume_counts(kafka.bootstrap_servers, topic_name, total, 60, parse_id,
                                 isolation="read_uncommitted")
    log = agent.whole_log()
    found = sum(int(line.split(" slot(s) found committed")[0].rsplit(" ", 1)[1])
                for line in log.splitlines() if "found committed by the last transaction" in line)
    run = {"step": step, "written": total, "distinct": len(committed),
           "duplicates": sum(c - 1 for c in committed.values()),
           "aborted_copies": sum(uncommitted.values()) - total, "found_committed": found}
    print(json.dumps(run))
    missing = [i for i in range(total) if committed.get(i, 0) == 0]
    assert not missing, f"{len(missing)} missing, first {missing[:10]}"
    assert set(committed) <= set(range(total))
    assert run["duplicates"] == 0, run
    return run
