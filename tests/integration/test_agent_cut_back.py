"""A file cut back below the agent's checkpoint while the agent was stopped, as a power loss
leaves an application's log (its unsynced tail gone, its head unchanged), and written on from
the cut past the old checkpoint before the agent starts again: every new line arrives
(``agent/tail/anchors.py``), against the real local Kafka."""

from __future__ import annotations

import time

from tests.agentkit import consume_counts
from tests.integration.test_agent_end_to_end import parse_id, setup_agent

BATCHES, PER_BATCH = 10, 1000          # read a little more than a second apart: anchors
CUT_AT_LINE = 5_300                    # the file keeps this many lines (a line's end)
NEW = range(100_000, 110_000)          # written after the cut


def _line(i: int) -> bytes:
    return b"id-%09d %s\n" % (i, b"x" * 48)


def test_new_lines_written_below_an_old_checkpoint_all_arrive(kafka, tmp_path, topic_name):
    bootstrap = kafka.bootstrap_servers
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1)
    app = logs / "app.log"
    app.touch()
    agent.start()
    try:
        for b in range(BATCHES):
            with open(app, "ab") as f:
                f.write(b"".join(_line(i) for i in range(b * PER_BATCH, (b + 1) * PER_BATCH)))
            time.sleep(1.1)
        first = consume_counts(bootstrap, topic_name, BATCHES * PER_BATCH, 60, parse_id)
        assert len(first) == BATCHES * PER_BATCH
    finally:
        assert agent.stop() == 0
    old_end = app.stat().st_size
    with open(app, "r+b") as f:                      # the power cut: the unsynced tail gone
        f.truncate(CUT_AT_LINE * len(_line(0)))
    with open(app, "ab") as f:                       # the application writes on, past the
        f.write(b"".join(_line(i) for i in NEW))     # old checkpoint
    assert app.stat().st_size > old_end
    agent.start()
    try:
        counts = consume_counts(bootstrap, topic_name, BATCHES * PER_BATCH + len(NEW), 60,
                                parse_id)
    finally:
        assert agent.stop() == 0
    missing = [i for i in NEW if counts[i] == 0]
    assert not missing, f"{len(missing)} new line(s) never arrived, first {missing[:5]}"
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert all(n <= 2 for n in counts.values())
    # Read again: only the old lines between the newest anchor the file still holds and the
    # cut (an anchor is kept at most every second: at most about two batches).
    assert twice and twice[-1] < CUT_AT_LINE and len(twice) <= 2 * PER_BATCH, twice[:5]
    log_text = agent.whole_log()
    assert "no longer holds what was read before offset" in log_text
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == "", "nothing was lost"
