"""The journald source through the agent process and a real Kafka: a journal that
systemd-journal-remote keeps writing while the agent is SIGKILLed and started again (every
entry of the unit asked for arrives, counted by id, none of another unit, duplicates only where
a kill allows them, nothing journalled); and a real systemd-journald of the test's own,
vacuumed while the agent is stopped (the gap journalled with its count)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
import time
from collections import Counter

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, consume_counts, write_config
from tests.faults.test_agent_faults import in_flight_ids
from tests.integration.test_agent_end_to_end import parse_id
from tests.journalkit import Journald, entry, journal_tools, namespaces_work, write_journal

pytestmark = pytest.mark.skipif(not journal_tools(), reason="needs systemd-journal-remote and "
                                "journalctl (make setup installs them)")
# What a start reads again besides the slots in flight: entries a slot holds past the last
# cursor stored, and entries a rewind of the start's self-check reads again (a slot sealed while
# a batch was being handed over keeps its end below the batch: it does not count as covering
# them, so they are read again).
REREAD = re.compile(r"the entries (\d+)-(\d+) are in the pool but their cursor was not stored"
                    r"|bytes (\d+)-(\d+) were sealed but are neither acknowledged nor in the pool")


def test_a_journal_written_on_through_three_kills_arrives_whole(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=3)])
    journal = tmp_path / "journal"
    journal.mkdir()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "journald", "journal_directory": str(journal), "units": ["app.service"],
         "format": "message", "topic": topic_name}], buffer={"slot_size_bytes": 64 << 10})
    agent = AgentProcess(config, tmp_path / "agent.log")
    batches, per_batch = 60, 500
    total = batches * per_batch
    written = threading.Event()

    def write() -> None:
        """Batches of the app's entries, every fifth one another unit's; a few multi-line."""
        for b in range(batches):
            entries = []
            for i in range(b * per_batch, (b + 1) * per_batch):
                text = f"id-{i:09d} event" + ("\n  at frame one\n  at frame two" if i % 97 == 0
                                              else "")
                entries.append(entry(i, MESSAGE=text))
                if i % 5 == 0:
                    entries.append(entry(i, MESSAGE=f"other {i}", _SYSTEMD_UNIT="cron.service"))
            write_journal(journal / "remote.journal", entries)
            time.sleep(0.05)
        written.set()

    agent.start()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    rng = random.Random(7)
    allowance: Counter = Counter()
    kills = 0
    try:
        while kills < 3:
            time.sleep(rng.uniform(0.8, 1.6))
            agent.kill()
            kills += 1
            allowance.update(in_flight_ids(tmp_path / "state" / "buffer.pool"))
            agent.start()
        writer.join(timeout=300)
        assert written.is_set(), "the writer did not finish"
        values: dict[int, bytes] = {}
        strays: list[tuple] = []              # records that are no entry of the app's

        def keep(msg) -> None:
            if not msg.value().startswith(b"id-"):
                strays.append((msg.partition(), msg.offset(), msg.value()[:300],
                               dict(msg.headers() or [])))
            elif parse_id(msg.value()) % 97 == 0:
                values[parse_id(msg.value())] = msg.value()

        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 300,
                                lambda v: parse_id(v) if v.startswith(b"id-") else v,
                                on_msg=keep, wanted=set(range(total)))
        [listener] = agent.status()["listeners"]
        assert listener["type"] == "journald" and listener["reader"] == "running", listener
        text = subprocess.run([str(agent.binary), "status", "--url", f"http://{agent.listen}"],
                              capture_output=True, text=True, timeout=30).stdout
        assert f"journald  journald:{journal} -> {topic_name}" in text, text
    finally:
        assert agent.stop() == 0, agent.log_text()
    log = agent.whole_log()
    reread = [int(b or d) - int(a or c) for a, b, c, d in REREAD.findall(log)]
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    twice = sorted(k for k, c in counts.items() if isinstance(k, int) and c > 1)
    figures = {"entries": total, "kills": kills, "lost": len(missing), "duplicates": duplicates,
               "in_flight_bound": sum(allowance.values()), "read_again": sum(reread),
               "first_twice": twice[:5], "last_twice": twice[-5:]}
    print(figures)
    # What the agent said about the source (its resumes, what it read again, what it could not
    # make a record of), for a failure to be read without running it again.
    said = [line for line in log.splitlines() if "journald source" in line or "sealed but" in line]
    if missing:                           # and whether the journal holds them (its writer's part)
        read = subprocess.run(["journalctl", "--directory", str(journal), "--output=cat",
                               "--unit", "app.service", "--no-pager", "--merge"],
                              capture_output=True, timeout=120).stdout
        held = {parse_id(m) for m in read.split(b"\n") if m.startswith(b"id-")}
        figures["missing_but_in_the_journal"] = [i for i in missing[:10] if i in held]
    assert log.count("resumes after entry") >= kills, "the kills did not land on a running source"
    assert not missing and not strays, (f"{len(missing)} entries lost, first {missing[:10]}; "
                                        f"records that are none of the app's entries: "
                                        f"{strays[:3]}; {figures}; the agent said: {said[-30:]}")
    assert duplicates <= figures["in_flight_bound"] + figures["read_again"], figures
    assert not (tmp_path / "state" / "loss-journal.jsonl").exists() or \
        not (tmp_path / "state" / "loss-journal.jsonl").read_text().strip()
    # A message of several lines is one record, as the application wrote it.
    assert values and all(v == b"id-%09d event\n  at frame one\n  at frame two" % i
                          for i, v in values.items()), list(values.items())[:2]


@pytest.mark.skipif(not namespaces_work(), reason="needs root, unshare, nsenter and "
                    "systemd-journald")
def test_a_real_journald_vacuumed_while_the_agent_was_stopped_journals_the_gap(kafka, tmp_path,
                                                                               topic_name):
    """A systemd-journald of the test's own (its namespace, its journal): what the
    application logs through a stdout stream arrives once; entries logged while the agent is
    stopped and then rotated and vacuumed away are one loss-journal entry with their count
    (the journal's own numbering tells it), and what is logged after arrives."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    journald = Journald(tmp_path / "journald")
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "journald", "identifiers": ["app"], "format": "message", "topic": topic_name}])
    agent = AgentProcess(config, tmp_path / "agent.log", prefix=journald.prefix)

    def logged(a: int, b: int, written: bool = False) -> None:
        journald.log_lines("app", [f"id-{i:09d} event" for i in range(a, b)], written)

    try:
        agent.start()
        logged(0, 100)
        assert len(consume_counts(kafka.bootstrap_servers, topic_name, 100, 120, parse_id)) \
            == 100
        assert agent.stop() == 0
        logged(100, 150, written=True)               # never read: vacuumed before the start
        journald.run(["journalctl", "--rotate"])
        journald.run(["journalctl", "--vacuum-files=1"])
        left = [e["MESSAGE"] for e in journald.entries("--identifier", "app")]
        assert not any(m.startswith("id-0000001") for m in left), left[:3]   # the fault
        logged(150, 200)
        agent.start()
        counts = consume_counts(kafka.bootstrap_servers, topic_name, 150, 120, parse_id)
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()
        journald.close()
    assert sorted(counts) == [*range(100), *range(150, 200)], sorted(set(range(200)) - set(counts))
    assert max(counts.values()) == 1, counts.most_common(3)
    journal = tmp_path / "state" / "loss-journal.jsonl"
    [gone] = [json.loads(line) for line in journal.read_text().splitlines()]
    print(gone)
    # 50 of the app's, and whatever else the journal numbered meanwhile (journald's own lines
    # about the rotation): an upper bound, as the detail says when filters are set.
    assert gone["reason"] == "journal_entries_gone" and not gone["open_ended"], gone
    assert 50 <= gone["events"] <= 60 and "not only those matched" in gone["detail"], gone
