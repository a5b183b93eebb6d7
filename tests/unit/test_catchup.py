"""The Spark jobs' ``caught_up`` records, without Spark: progress events as PySpark hands them
to the listener (their offsets as JSON text), the audit topic's ranges read by a scripted
reader, and what is published. A mark is published only once proven: by a batch that read to
its snapshot (nothing behind), and for the land job once a counting batch that started after
the landing batch ended has ended too."""

from __future__ import annotations

import json
from types import SimpleNamespace

from audit.contract.record import AuditRecord, CaughtUp, Progress, Ranges, parse
from audit.jobs.catchup import CatchUp, Mark, audit_ranges, marks_of

AUDIT = "docket.audit"


def source(start, end, topic=AUDIT):
    """A Kafka source's offsets as PySpark gives them (``"None"`` before the first batch)."""
    return SimpleNamespace(
        startOffset="None" if start is None else json.dumps({topic: start, "app": {"0": 5}}),
        endOffset=json.dumps({topic: end, "app": {"0": 9}}))


def progress(name, batch, start, end, at="2026-11-24T10:00:00.000Z"):
    return SimpleNamespace(name=name, batchId=batch, timestamp=at,
                           sources=[source(start, end)])


def count(origin, seq, incarnation="a1", tier="producer", sealed=None):
    return AuditRecord(tier=tier, origin=origin, topic="app", window_start=0, window_ms=600000,
                       count=1, bytes=1, checksum=1, seq=seq, incarnation=incarnation,
                       emitter=f"{origin}/agent" if tier == "producer" else f"{tier}/count",
                       sealed_through=sealed)


def ranges(origin, seq, delivered, tier="producer"):
    return Ranges.of(tier=tier, origin=origin, origin_incarnation="a1",
                     emitter=f"{origin}/agent" if tier == "producer" else f"{tier}/count",
                     seq=seq, through=max(delivered, 0) + 10, delivered=delivered, missing=[],
                     incarnation="a1")


class Job:
    """A ``CatchUp`` whose audit topic is ``log`` (partition → records) and whose published
    records are kept."""

    def __init__(self, counting=None, fail_first=0, mirror_target=None):
        self.log: dict[int, list] = {0: [], 1: []}
        self.sent: list[CaughtUp] = []
        self.fail = fail_first
        self.catch_up = CatchUp(tier="kafka-local", emitter="kafka-local/count",
                                incarnation="j1", audit_topic=AUDIT, reading="read",
                                counting=counting, publish=self.publish, read=self.read,
                                mirror_target=mirror_target)

    def read(self, ranges):
        return [rec for p, (start, end) in ranges.items()
                for rec in self.log[p][start or 0:end]]

    def publish(self, encoded):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("not acknowledged")
        self.sent += [parse(value) for _key, value in encoded]

    def batch(self, name, batch, start, end, behind=0, at="2026-11-24T10:00:00.000Z"):
        self.catch_up.progressed(progress(name, batch, start, end, at), behind)
        assert self.catch_up.settle(name, batch, timeout_s=10)

    def marks(self):
        return {(c.source, c.source_incarnation): (c.source_seq, c.source_delivered)
                for c in self.sent}


def test_a_first_batch_has_no_start_and_reads_the_topic_from_its_beginning():
    assert audit_ranges([source(None, {"0": 4, "1": 0})], AUDIT) == {0: (None, 4), 1: (None, 0)}
    assert audit_ranges([source({"0": 4}, {"0": 9})], AUDIT) == {0: (4, 9)}
    assert audit_ranges([source({"0": 1}, {"0": 2}, topic="other")], AUDIT) == {}


def test_marks_are_the_highest_seq_per_emitter_and_an_agents_highest_delivered():
    records = [count("web-1", 3), count("web-1", 5), count("web-1", 2, incarnation="a0"),
               ranges("web-1", 5, 900), ranges("web-1", 4, 950),
               count("web-2", 7, incarnation=None), ranges("kafka-local", 9, 40, "kafka-local"),
               count("x", 1, tier="kafka-local"),
               Progress(tier="warehouse", emitter="warehouse/land", batch_id=3,
                        input_rows_per_s=0.0, processed_rows_per_s=0.0, batch_duration_ms=1,
                        offsets_behind=0)]
    assert marks_of(records, own_emitter="kafka-local/count") == {
        ("web-1/agent", "a1"): Mark(5, 950), ("web-1/agent", "a0"): Mark(2),
        ("web-2/agent", "-"): Mark(7)}


def test_a_batch_behind_its_snapshot_proves_nothing_until_one_that_is_not():
    job = Job()
    job.log[0] += [count("web-1", 1, sealed=99), ranges("web-1", 1, 99)]
    job.batch("read", 0, None, {"0": 2, "1": 0}, behind=500)      # rate-limited: behind
    assert job.sent == []
    job.log[1] += [count("web-2", 4)]
    job.batch("read", 1, {"0": 2, "1": 0}, {"0": 2, "1": 1}, behind=0)
    assert job.marks() == {("web-1/agent", "a1"): (1, 99), ("web-2/agent", "a1"): (4, None)}
    assert {(c.tier, c.emitter, c.incarnation, c.seq) for c in job.sent} == \
        {("kafka-local", "kafka-local/count", "j1", 1)}
    job.catch_up.close()


def test_a_mark_is_published_again_only_when_it_grows_and_until_kafka_has_it():
    job = Job(fail_first=1)
    job.log[0] += [count("web-1", 1)]
    job.batch("read", 0, None, {"0": 1, "1": 0})                    # not acknowledged
    assert job.sent == []
    job.log[0] += [count("web-2", 1)]
    job.batch("read", 1, {"0": 1, "1": 0}, {"0": 2, "1": 0})
    assert job.marks() == {("web-2/agent", "a1"): (1, None)}         # web-1 was lost: it
    job.log[0] += [count("web-1", 2), count("web-2", 1)]            # comes with its next
    job.batch("read", 2, {"0": 2, "1": 0}, {"0": 4, "1": 0})
    assert [(c.source, c.source_seq) for c in job.sent] == [("web-2/agent", 1),
                                                            ("web-1/agent", 2)]
    job.catch_up.close()


def test_the_land_job_publishes_once_a_count_started_after_the_landing_ended():
    job = Job(counting="count")
    job.log[0] += [count("web-1", 1)]
    job.batch("read", 0, None, {"0": 1, "1": 0})
    assert job.sent == []                                  # landed, not yet counted
    job.batch("count", 0, None, {}, at="2000-01-01T00:00:00.000Z")   # started before
    assert job.sent == []
    job.batch("count", 1, None, {}, at="2099-01-01T00:00:00.000Z")   # started after
    assert job.marks() == {("web-1/agent", "a1"): (1, None)}
    job.catch_up.close()


def test_a_range_that_cannot_be_read_gives_no_marks_and_the_worker_goes_on():
    job = Job()
    job.catch_up._reader = lambda ranges: None
    job.batch("read", 0, None, {"0": 1, "1": 0})
    job.catch_up._reader = job.read
    job.log[0] += [count("web-1", 1), count("web-1", 2)]
    job.batch("read", 1, {"0": 0, "1": 0}, {"0": 2, "1": 0})
    assert job.marks() == {("web-1/agent", "a1"): (2, None)}
    job.catch_up.close()


def test_a_job_announces_itself_before_it_counts():
    job = Job()
    job.catch_up.announce()
    [announced] = job.sent
    assert isinstance(announced, Progress)
    assert (announced.tier, announced.emitter, announced.incarnation, announced.batch_id,
            announced.publishes_caught_up) == ("kafka-local", "kafka-local/count", "j1", -1,
                                               True)
    job.catch_up.close()


def test_an_idle_count_after_the_landing_counts_as_a_count_that_found_nothing_new():
    """The landing query keeps landing the audit topic's batches, which make no files: the
    counting query then runs no batch, and says it is idle. A trigger that started after the
    landing batch ended and found no new file has counted all it landed."""
    job = Job(counting="count")
    job.log[0] += [count("web-1", 1)]
    job.batch("read", 0, None, {"0": 1, "1": 0})
    job.catch_up.idle("read", "2099-01-01T00:00:00.000Z")          # not the counting query
    job.catch_up.idle("count", "2000-01-01T00:00:00.000Z")         # started before
    job.batch("read", 1, {"0": 1, "1": 0}, {"0": 1, "1": 0})        # (the worker is done)
    assert job.sent == []
    job.catch_up.idle("count", "2099-01-01T00:00:00.000Z")
    job.batch("read", 2, {"0": 1, "1": 0}, {"0": 1, "1": 0})
    assert job.marks() == {("web-1/agent", "a1"): (1, None)}
    job.catch_up.close()


def vouched(source, target, origin, seq, delivered=None, round_=1):
    """A mirror watcher's record: ``source`` → ``target`` has copied what ``origin``'s agent
    counted up to ``seq`` (``delivered``)."""
    return CaughtUp(tier="mirror", emitter=f"mirror/{source}->{target}", incarnation="w1",
                    seq=round_, source=f"{origin}/agent", source_incarnation="a1",
                    source_seq=seq, source_delivered=delivered)


def test_on_a_mirrored_cluster_marks_go_only_as_far_as_the_mirror_has_copied():
    """The agent's report came through the mirror before its data: the job has read the
    report, yet no mark until the mirror's watcher says the data is copied, and then only as
    far as it says; another target's watcher (a mirror of a mirror) vouches for nothing here."""
    job = Job(mirror_target="aggregate")
    job.log[0] += [count("web-1", 5, sealed=99), ranges("web-1", 5, 99)]
    job.batch("read", 0, None, {"0": 2, "1": 0})
    assert job.sent == []                                          # nothing vouched for yet
    job.log[1] += [vouched("local", "global", "web-1", 5, 99)]     # not this cluster's mirror
    job.batch("read", 1, {"0": 2, "1": 0}, {"0": 2, "1": 1})
    assert job.sent == []
    job.log[1] += [vouched("local", "aggregate", "web-1", 4, 80)]
    job.batch("read", 2, {"0": 2, "1": 1}, {"0": 2, "1": 2}, behind=7)
    assert job.sent == []                                          # behind: proves nothing
    job.batch("read", 3, {"0": 2, "1": 2}, {"0": 2, "1": 2})
    assert job.marks() == {("web-1/agent", "a1"): (4, 80)}        # the mirror's, not the job's
    job.log[1] += [vouched("local", "aggregate", "web-1", 9, 150, round_=2)]
    job.batch("read", 4, {"0": 2, "1": 2}, {"0": 2, "1": 3})
    assert job.marks() == {("web-1/agent", "a1"): (5, 99)}        # now the job's own
    job.catch_up.close()


def test_a_cluster_not_mirrored_ignores_mirror_records():
    job = Job()
    job.log[0] += [count("web-1", 5, sealed=99), ranges("web-1", 5, 99),
                   vouched("local", "kafka-local", "web-1", 1, 1)]
    job.batch("read", 0, None, {"0": 3, "1": 0})
    assert job.marks()[("web-1/agent", "a1")] == (5, 99)
    job.catch_up.close()


def test_the_mirror_watcher_reads_what_mirrormaker_committed_and_nothing_else():
    from audit.jobs.mirrored import _copied
    key = b'["MirrorSourceConnector",{"cluster":"local","partition":1,"topic":"app.events"}]'
    assert _copied(key, b'{"offset":32}', "local") == (("app.events", 1), 32)
    assert _copied(key, b'{"offset":32}', "dc2") is None                 # another flow's
    assert _copied(b'["MirrorHeartbeatConnector",{"sourceClusterAlias":"local"}]',
                   b'{"offset":0}', "local") is None
    for bad in ((key, None), (key, b"{"), (b"[1]", b"{}"), (None, None), (key, b'{"o":1}')):
        assert _copied(*bad, "local") is None
