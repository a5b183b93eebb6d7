"""The journald source on real journal files: written by systemd-journal-remote from
export-format input (no running journald needed), read by the real source through journalctl,
into a real pool, state database and loss journal."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from agent.buffer import BufferPool, Chunk
from agent.config import SourceConfig
from agent.state.checkpoints import Checkpoints
from agent.state.db import StateDB
from agent.state.journal import LossJournal
from agent.state.selfcheck import rewind_uncovered
from agent.tail import journald
from agent.tail.journald import KEPT, Cursors, JournaldSource, parse_cursor
from agent.telemetry import Metrics
from tests.agentkit import native_built
from tests.journalkit import BOOT, REMOTE, T0, entry, journal_tools, write_journal

pytestmark = pytest.mark.skipif(not journal_tools(), reason="needs systemd-journal-remote and "
                                "journalctl (make setup installs them)")


class Run:
    """The source, its pool, state database, loss journal and checkpoints, as the agent wires
    them; ``checkpoint()`` seals and writes as the agent's loop does each turn."""

    def __init__(self, tmp: Path, **cfg):
        self.tmp = tmp
        self.logs = tmp / "journal"
        self.logs.mkdir(exist_ok=True)
        self.cfg = SourceConfig(index=0, type="journald", journal_directory=str(self.logs),
                                **{"format": "json", "topic": "j", **cfg})
        self.delivered: list[bytes] = []
        self.open()

    def open(self) -> None:
        self.metrics = Metrics()
        self.db = StateDB(self.tmp / "state.db")
        self.checkpoints = Checkpoints(self.db, time.monotonic, 3_600_000,
                                       anchors=lambda ends: self.src.anchors(ends))
        self.pool = BufferPool(self.tmp / "pool", 16 << 20, 64 << 10, linger_ms=1e9,
                               sync_on_seal=False, on_seal=self.checkpoints.sealed)
        self.journal = LossJournal(self.tmp / "loss.jsonl", self.metrics)
        recovered = self.pool.recovered_positions()
        self.db.advance_sealed(recovered)
        recovered.update(rewind_uncovered(self.db, self.pool.sealed()))
        self.src = JournaldSource(self.cfg, self.pool, self.db, self.journal, self.metrics,
                                  recovered)

    def read(self, count: int, timeout_s: float = 30) -> None:
        """Wait until the source has handed ``count`` entries over since it started."""
        deadline = time.monotonic() + timeout_s
        while self.src.read_entries < count:
            assert time.monotonic() < deadline, (self.src.read_entries, count)
            time.sleep(0.02)
        time.sleep(0.3)                       # nothing more comes
        assert self.src.read_entries == count

    def checkpoint(self) -> None:
        self.pool.seal_all()
        self.checkpoints.flush(lambda: self.pool.next_record, lambda: None, False)

    def records(self) -> list[tuple[int, bytes | None, bytes]]:
        return [r for s in self.pool.sealed() for r in s.records()]

    def values(self) -> list[bytes]:
        self.checkpoint()
        return self.delivered + [v for s in self.pool.sealed() for _, _, v in s.records()]

    def messages(self) -> list[str]:
        return [json.loads(v)["MESSAGE"] for v in self.values()]

    def drain_all(self) -> None:
        """Kafka acknowledged everything sealed: freed, the acknowledged offsets written."""
        self.checkpoint()
        for s in self.pool.sealed():
            self.delivered += [v for _, _, v in s.records()]
            self.checkpoints.acknowledged(s, {})
            self.checkpoints.flush(lambda: self.pool.next_record, lambda: None, False)
            self.pool.free(s)

    def stop(self) -> None:
        self.src.close()
        self.checkpoint()
        self.pool.close()
        self.db.close()
        self.journal.close()

    def crash(self) -> None:
        """SIGKILL: the filling slot's records are gone, nothing written after them."""
        self.src.close()
        self.pool.abandon()
        self.db.close()
        self.journal.close()

    def restart(self, crash: bool = False) -> None:
        self.crash() if crash else self.stop()
        self.open()


@pytest.fixture
def run(tmp_path):
    runs = []

    def make(entries=(), **cfg) -> Run:
        journal = tmp_path / "journal"
        journal.mkdir(exist_ok=True)
        if entries:
            write_journal(journal / "remote.journal", list(entries))
        runs.append(Run(tmp_path, **cfg))
        return runs[-1]

    yield make
    for r in runs:
        r.src.close()


@pytest.fixture(params=["native", "python"])
def both(request, run, monkeypatch):
    """``run``, with the records made by the native extension, or by the Python code alone."""
    if request.param == "python":
        monkeypatch.setattr(JournaldSource, "_native_maker", lambda self: None)
    elif not native_built():
        pytest.skip("the native extension is not built (make native)")
    return run


def test_a_first_start_reads_every_boot_of_the_journal(run):
    other = "fedcba9876543210fedcba9876543210"
    r = run([entry(i) for i in range(3)]
            + [entry(i, _BOOT_ID=other, __MONOTONIC_TIMESTAMP=i) for i in range(3, 6)])
    r.read(6)
    assert r.messages() == [f"event {i}" for i in range(6)]


def test_each_entry_is_one_record_with_its_fields_and_its_time(both):
    run = both
    r = run([entry(i) for i in range(50)])
    r.read(50)
    records = r.records() or (r.checkpoint() or r.records())
    assert [json.loads(v)["MESSAGE"] for _, _, v in records] == [f"event {i}" for i in range(50)]
    first = json.loads(records[0][2])
    assert first["_SYSTEMD_UNIT"] == "app.service" and first["PRIORITY"] == "6"
    assert [ts for ts, _, _ in records] == [(T0 + i * 1000) // 1000 for i in range(50)]


def test_json_records_decode_fields_journalctl_gives_as_bytes_and_lists(both):
    run = both
    r = run([entry(0), entry(1, MESSAGE=b"caf\xe9"), entry(2, TAG="[x]")])
    r.read(3)
    values = [json.loads(v) for v in r.values()]
    assert [v["MESSAGE"] for v in values] == ["event 0", "caf\ufffd", "event 2"]
    assert values[2]["TAG"] == "[x]"
    assert r.metrics.get("agent_source_bad_input_total", kind="invalid_utf8", topic="j") == 1


def test_message_format_ships_the_message_as_written_bytes_and_lines_too(both):
    run = both
    odd = b"caf\xe9 \xff"                             # not UTF-8: journalctl gives its bytes
    r = run([entry(0), entry(1, MESSAGE="line one\nline two"), entry(2, MESSAGE=odd)],
            **{"format": "message"})
    r.read(3)
    assert r.values() == [b"event 0", b"line one\nline two", odd]


def test_an_entry_without_a_message_is_shipped_as_its_fields_and_counted(both):
    run = both
    no_message = {k: v for k, v in entry(1, CODE_LINE="12").items() if k != "MESSAGE"}
    r = run([entry(0), no_message], **{"format": "message"})
    r.read(2)
    values = r.values()
    assert values[0] == b"event 0" and json.loads(values[1])["SYSLOG_IDENTIFIER"] == "app"
    # The message form's fields, whether journalctl printed only them or every field (a
    # journalctl of systemd 254 or later also prints __SEQNUM and __SEQNUM_ID)
    assert {k for k in json.loads(values[1]) if not k.startswith("__")} == {
        "_BOOT_ID", "SYSLOG_IDENTIFIER", "PRIORITY", "_SYSTEMD_UNIT"}
    assert r.metrics.get("agent_source_bad_input_total", kind="journal_no_message",
                         topic="j") == 1


def test_an_entry_read_as_it_was_written_without_its_message_is_read_again_whole(
        both, tmp_path, monkeypatch):
    """journalctl skips a field whose data the journal's writer is still linking, and the
    entry comes without its message (what systemd's reader does for an instant): read again
    by its cursor, it ships whole. An entry that has no message still ships as its fields,
    counted. A journalctl whose follow output loses one entry's message line stands for the
    race; read again, it prints the journal as it is."""
    wrapper = tmp_path / "journalctl"
    wrapper.write_text('#!/bin/sh\ncase " $* " in\n'
                       '  *" --follow "*) setpriv --pdeathsig KILL journalctl "$@" | '
                       "sed -u '/^MESSAGE=event 3$/d' ;;\n"
                       '  *) exec journalctl "$@" ;;\nesac\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(journald, "JOURNALCTL", str(wrapper))
    no_message = {k: v for k, v in entry(5).items() if k != "MESSAGE"}
    r = both([*(entry(i) for i in range(5)), no_message, entry(6)], **{"format": "message"})
    r.read(7)
    values = r.values()
    assert values[:5] + values[6:] == [b"event %d" % i for i in (0, 1, 2, 3, 4, 6)], values
    assert json.loads(values[5])["SYSLOG_IDENTIFIER"] == "app"
    again = {o: r.metrics.get("agent_source_journal_read_again_total", outcome=o, topic="j")
             for o in ("whole", "none", "unread")}
    assert again == {"whole": 1, "none": 1, "unread": 0}, again
    assert r.metrics.get("agent_source_bad_input_total", kind="journal_no_message",
                         topic="j") == 1


def test_a_message_given_twice_ships_the_message_forms_fields_as_a_list(both):
    run = both
    r = run([entry(0)], **{"format": "message"})
    r.read(1)
    twice = b"".join(b"%s=%s\n" % (k, v) for k, v in [
        (b"__REALTIME_TIMESTAMP", b"%d" % (T0 + 5000)), (b"__MONOTONIC_TIMESTAMP", b"6"),
        (b"_BOOT_ID", BOOT.encode()), (b"MESSAGE", b"one"), (b"MESSAGE", b"two"),
        (b"SYSLOG_IDENTIFIER", b"app"), (b"CODE_LINE", b"12")]) + b"\n"
    subprocess.run([str(REMOTE), "-o", str(r.logs / "remote.journal"), "-"], input=twice,
                   check=True, capture_output=True)
    r.read(2)
    value = json.loads(r.values()[1])
    assert value["MESSAGE"] == ["one", "two"] and value["SYSLOG_IDENTIFIER"] == "app"
    assert "CODE_LINE" not in value                 # not one of the message form's fields


def test_a_key_field_keys_each_record_and_an_entry_without_it_is_counted(both):
    run = both
    r = run([entry(0, HOST_ROLE="edge"), entry(1)], key_field="HOST_ROLE")
    r.read(2)
    r.checkpoint()
    assert [k for _, k, _ in r.records()] == [b"edge", None]
    assert r.metrics.get("agent_source_bad_input_total", kind="key_field_missing",
                         topic="j") == 1


def test_filters_reach_journalctl(run):
    entries = [entry(i, SYSLOG_IDENTIFIER="app" if i % 2 else "other", PRIORITY=i % 8)
               for i in range(40)]
    r = run(entries, identifiers=["app"], priority="warning")
    wanted = [i for i in range(40) if i % 2 and i % 8 <= 4]
    r.read(len(wanted))
    assert r.messages() == [f"event {i}" for i in wanted]


def test_a_restart_reads_on_after_the_cursor_of_what_was_sealed(run, tmp_path):
    r = run([entry(i) for i in range(100)])
    r.read(100)
    r.drain_all()
    r.restart()
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(100, 130)])
    r.read(30)
    assert r.messages() == [f"event {i}" for i in range(130)]      # each once, in order


def test_a_kill_loses_no_entry_the_filling_slot_held(run, tmp_path):
    r = run([entry(i) for i in range(100)])
    r.read(100)
    r.checkpoint()                       # 0-99 sealed, their cursor stored
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(100, 160)])
    r.read(160)                          # 100-159 in a filling slot: gone with the kill
    r.restart(crash=True)
    r.read(60)
    assert r.messages() == [f"event {i}" for i in range(160)]


def test_slots_the_pool_kept_past_the_stored_cursor_are_read_again_not_skipped(run, tmp_path):
    """The pool sealed a slot the state database never heard of (killed before its write):
    the start resumes after the newest cursor stored, so the slot's entries come twice."""
    r = run([entry(i) for i in range(40)])
    r.read(40)
    r.checkpoint()
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(40, 70)])
    r.read(70)
    r.pool.seal_all()                    # sealed, never written to the state database
    r.restart(crash=True)
    r.read(30)
    got = r.messages()
    assert sorted(set(got)) == sorted(f"event {i}" for i in range(70))
    assert len(got) == 100               # 40-69 twice


def test_a_rewind_of_the_self_check_finds_a_cursor_at_or_below_it(run, tmp_path):
    """The pool lost a slot the state database had sealed (a power cut): the start's self-check
    rewinds the sealed offset, and the source reads again from a cursor at or below it."""
    r = run([entry(i) for i in range(30)])
    r.read(30)
    r.drain_all()                        # 0-29 acknowledged
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(30, 60)])
    r.read(60)
    r.checkpoint()                       # 30-59 sealed and written
    r.stop()
    (tmp_path / "pool").unlink()         # the pool's slots are gone
    r.open()
    r.read(30)
    assert r.messages() == [f"event {i}" for i in range(60)]


def test_read_from_end_skips_what_the_journal_held_at_the_first_start(run, tmp_path):
    r = run([entry(i) for i in range(20)], read_from="end")
    time.sleep(1)
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(20, 25)])
    r.read(5)
    r.stop()
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(25, 30)])
    r.open()                             # a later start reads on from its cursor, not the end
    r.read(5)
    assert r.messages() == [f"event {i}" for i in range(20, 30)]


def test_a_sealed_end_is_stored_with_its_own_cursor_not_the_newest_read(run, tmp_path):
    """The state database writes a seal's offset while the source has read further: the
    cursor stored is the sealed end's, so a kill reads the entries after it again."""
    r = run([entry(i) for i in range(50)])
    r.read(50)
    r.pool.seal_all()                    # 0-49 sealed, not yet written
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(50, 80)])
    r.read(80)                           # 50-79 in the filling slot
    r.checkpoints.flush(lambda: r.pool.next_record, lambda: None, False)
    r.restart(crash=True)
    r.read(30)
    assert r.messages() == [f"event {i}" for i in range(80)]


def test_slots_filled_within_a_batch_cover_their_own_entries(run, tmp_path):
    """Entries of one topic fill several slots per batch: each slot sealed as it fills covers
    its own entries, so Kafka acknowledging those and a kill before the rest is sealed reads
    again only what the filling slot held. (Held at its batch's start, a slot acknowledged
    and freed had its entries read again, unsaid: 26 duplicates no bound allowed in a CI run
    of the three-kills test.)"""
    r = run([entry(i, MESSAGE=f"event {i} " + "x" * 600) for i in range(400)])
    r.read(400)
    full = r.pool.sealed()
    assert len(full) >= 2, "no slot filled within a batch"
    for s in full:
        r.delivered += [v for _, _, v in s.records()]
        r.checkpoints.acknowledged(s, {})
        r.checkpoints.flush(lambda: r.pool.next_record, lambda: None, False)
        r.pool.free(s)
    delivered = len(r.delivered)
    r.restart(crash=True)
    r.read(400 - delivered)
    got = [m.split()[1] for m in r.messages()]
    assert sorted(got, key=int) == [str(i) for i in range(400)]


def test_a_field_given_twice_as_the_key_keys_by_its_first_value(both):
    run = both
    r = run([entry(0, ROLE="edge"), entry(1), entry(2, ROLE="core")], key_field="ROLE")
    r.read(3)
    r.checkpoint()
    assert [k for _, k, _ in r.records()] == [b"edge", None, b"core"]


def test_a_second_source_on_one_journal_starts_where_read_from_says_not_at_the_first(
        run, tmp_path):
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.drain_all()
    r.stop()
    r.cfg = SourceConfig(index=1, type="journald", topic="k", format="json",
                         journal_directory=str(tmp_path / "journal"))
    r.open()
    r.read(10)                           # its own numbering, from the journal's start
    assert [json.loads(v)["MESSAGE"] for v in r.values()][-10:] == \
        [f"event {i}" for i in range(10)]
    rows = [row for row in r.db.all_files() if row["state"] == "journal"]
    assert len(rows) == 2


def test_a_journalctl_started_again_after_a_vacuum_journals_the_gap(run, tmp_path, monkeypatch):
    monkeypatch.setattr(journald, "RESTART_S", 5.0)
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.src._proc.kill()                   # down for 5 s, while the journal is replaced
    path = tmp_path / "journal" / "remote.journal"
    path.unlink()
    write_journal(path, [entry(i) for i in range(10, 15)])
    r.read(15, timeout_s=60)
    [gone] = r.journal.entries()
    assert gone["reason"] == "journal_entries_gone" and gone["open_ended"], gone
    assert r.messages() == [f"event {i}" for i in range(15)]


def test_entries_gone_from_the_journal_before_they_were_read_are_journalled(run, tmp_path):
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.drain_all()
    r.stop()
    journal = tmp_path / "journal" / "remote.journal"
    journal.unlink()                     # vacuumed while the agent was stopped
    write_journal(journal, [entry(i) for i in range(10, 15)])
    r.open()
    r.read(5)
    [gone] = r.journal.entries()
    assert gone["reason"] == "journal_entries_gone" and gone["open_ended"], gone
    assert r.messages() == [f"event {i}" for i in range(15)]


def test_a_cursor_still_in_the_journal_journals_nothing(run):
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.drain_all()
    r.restart()
    r.read(0)
    assert r.journal.entries() == []


def test_a_journalctl_that_ends_is_started_again_from_the_last_entry_read(run, tmp_path):
    r = run([entry(i) for i in range(20)])
    r.read(20)
    first = r.src._proc
    first.kill()                                # ended from outside
    deadline = time.monotonic() + 10
    while r.src._proc in (None, first):
        assert time.monotonic() < deadline, "journalctl was not started again"
        time.sleep(0.05)
    write_journal(tmp_path / "journal" / "remote.journal", [entry(i) for i in range(20, 30)])
    r.read(30)
    assert r.messages() == [f"event {i}" for i in range(30)]


def test_new_filters_number_anew_from_the_last_entry_read(run, tmp_path):
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.drain_all()
    r.stop()
    r.cfg.units = ["app.service"]                # another numbering: a row of its own
    write_journal(tmp_path / "journal" / "remote.journal",
                  [entry(i, _SYSTEMD_UNIT="app.service" if i % 2 else "cron.service")
                   for i in range(10, 20)])
    r.open()
    r.read(5)
    assert r.messages() == [f"event {i}" for i in list(range(10)) + list(range(11, 20, 2))]
    rows = [row for row in r.db.all_files() if row["state"] == "journal"]
    assert len(rows) == 2 and r.src.sid == rows[-1]["source_id"]


def test_entries_routed_by_a_field_each_once_in_its_topic_with_a_fallback_and_a_key(run):
    units = ["app.service", "cron.service", None]
    entries = [entry(i, _SYSTEMD_UNIT=units[i % 3]) if units[i % 3] else
               {k: v for k, v in entry(i).items() if k != "_SYSTEMD_UNIT"} for i in range(30)]
    r = run(entries, topic="j.{_SYSTEMD_UNIT}", fallback_topic="j.other", key="{_HOSTNAME}",
            format="message")
    r.read(30)
    r.checkpoint()
    by_topic: dict[str, list[bytes]] = {}
    for s in r.pool.sealed():
        by_topic.setdefault(s.topic, []).extend(v for _, _, v in s.records())
    assert by_topic == {"j.app.service": [b"event %d" % i for i in range(0, 30, 3)],
                        "j.cron.service": [b"event %d" % i for i in range(1, 30, 3)],
                        "j.other": [b"event %d" % i for i in range(2, 30, 3)]}
    assert r.metrics.get("agent_source_bad_input_total", kind="routed_to_fallback",
                         topic="j.other") == 10
    assert r.metrics.get("agent_source_bad_input_total", kind="key_template_unmatched",
                         topic="j.other") == 30                    # no _HOSTNAME written


def test_a_kill_after_one_routed_topics_slot_sealed_loses_none_of_the_others(run, tmp_path):
    """Entries of two units go to two topics, so to two filling slots; one is sealed and its
    cursor written, the other is lost with the kill: its entries are read again (those of
    the sealed slot past the first one lost come twice), none is skipped."""
    r = run([entry(i, _SYSTEMD_UNIT="b.service" if i % 2 else "a.service") for i in range(40)],
            topic="j.{_SYSTEMD_UNIT}", fallback_topic="j.other")
    r.read(40)
    r.pool.seal("j.a.service")           # a's records (0, 2, ..., 38) sealed, b's filling
    r.checkpoints.flush(lambda: r.pool.next_record, lambda: None, False)
    r.restart(crash=True)
    r.read(39)                           # again from b's first record (1)
    got = r.messages()
    assert sorted(set(got)) == sorted(f"event {i}" for i in range(40))
    assert len(got) == 20 + 39


def test_a_stop_with_the_pool_full_seals_no_routed_slot_past_what_was_handed_over(tmp_path):
    """One batch of entries routed to two topics: the first topic's records take the pool's
    last free slot, the second's find none, and the source stops while it waits. The first
    topic's slot spans the second's entries, which are in no slot: it must not seal an end
    past the entries handed over whole (sealed, then acknowledged, it would make them count
    as delivered)."""
    journal = tmp_path / "journal"
    journal.mkdir()
    write_journal(journal / "remote.journal",
                  [entry(i, _SYSTEMD_UNIT="a.service" if i % 2 == 0 else "b.service")
                   for i in range(6)])
    cfg = SourceConfig(index=0, type="journald", topic="j.{_SYSTEMD_UNIT}",
                       fallback_topic="j.other", format="message",
                       journal_directory=str(journal))
    db = StateDB(tmp_path / "state.db")
    pool = BufferPool(tmp_path / "pool", 8192 + 4 * 4096, 4096, linger_ms=1e9,
                      sync_on_seal=False)
    for topic in ("z1", "z2", "z3"):     # every slot but one taken by another source
        pool.append(topic, Chunk.of_values([b"z"], 1))
    metrics = Metrics()
    src = JournaldSource(cfg, pool, db, LossJournal(tmp_path / "loss.jsonl", metrics), metrics,
                         {})
    deadline = time.monotonic() + 30
    while pool.stats()["free_slots"]:
        assert time.monotonic() < deadline, pool.stats()
        time.sleep(0.05)
    time.sleep(1)                        # b's records wait for room
    src.close()
    assert src.offset == 1, src.offset   # a's first entry, then b's first never handed over
    pool.seal_all()
    spans = [p for s in pool.sealed() if s.topic.startswith("j.") for p in s.meta.positions]
    assert spans and max(e for _s, _a, e in spans) <= src.offset, spans
    pool.close()
    db.close()


def test_entries_of_an_earlier_boot_are_read_at_the_start_and_after_a_cursor(run, tmp_path):
    """journalctl --follow shows the newest boot only, from a cursor too: the entries of the
    boot before a reboot that were not read yet must not be skipped."""
    other = "fedcba9876543210fedcba9876543210"
    r = run([entry(i) for i in range(5)])
    r.read(5)
    r.drain_all()
    r.stop()
    write_journal(tmp_path / "journal" / "remote.journal",
                  [entry(i) for i in range(5, 8)]            # the old boot's tail, unread
                  + [entry(i, _BOOT_ID=other, __MONOTONIC_TIMESTAMP=i) for i in range(8, 12)])
    r.open()
    r.read(7)
    assert r.messages() == [f"event {i}" for i in range(12)]


def test_the_kept_cursors_always_reach_back_to_the_acknowledged_offset():
    pairs = Cursors([(0, None)])
    for n in range(1, 1000):
        pairs.add(n * 10, f"c{n}", acked=5_000)
    assert len(pairs.pairs) <= KEPT + 1
    assert pairs.at_or_below(5_000) == (5_000, "c500")
    assert pairs.pairs[-1] == (9_990, "c999")
    for at in (5_000, 5_001, 7_777, 9_990):
        offset, _ = pairs.at_or_below(at)
        assert 5_000 <= offset <= at


def test_a_cursor_names_its_journals_numbering():
    assert parse_cursor("s=95ef;i=1f;b=01;m=1;t=66;x=d2") == ("95ef", 31)
    assert parse_cursor("garbage") is None


def test_a_gap_in_the_journals_own_numbering_is_journalled_with_its_count(run, monkeypatch):
    """The entry read last is gone and the next one the journal holds is of the same numbering:
    the entries between are counted (the journal files themselves cannot be cut that way here:
    the next entry is what journalctl would answer)."""
    r = run([entry(i) for i in range(10)])
    r.read(10)
    r.drain_all()
    r.stop()
    db = StateDB(r.tmp / "state.db")
    stored = Cursors.load(db.get(r.src.sid)["anchors"]).pairs[-1][1]
    db.close()
    seqnum_id, seqnum = parse_cursor(stored)
    later = f"s={seqnum_id};i={seqnum + 8:x};b={BOOT};m=1;t=1;x=1"
    real = journald._first_entry
    monkeypatch.setattr(journald, "_first_entry", lambda args, timeout_s=30: ({
        "__CURSOR": later}, True) if any(a == "--cursor" for a in args) else real(args, timeout_s))
    r.open()
    [gone] = r.journal.entries()
    assert gone["reason"] == "journal_entries_gone" and not gone["open_ended"], gone
    assert gone["events"] == 7, gone
