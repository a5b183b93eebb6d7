"""A file source routed by its lines' fields (``topic = "app.{service}"``): each line a JSON
object, its record sent to the topic and with the key its fields make, the real file source,
pool and state database driven turn by turn with a fake clock and a fake Kafka."""

from __future__ import annotations

import json
import socket
from collections import Counter

import pytest

from agent.config import ConfigError, parse
from agent.service import Agent, Seams
from tests.unit.fakeproducer import HOLD, FakeKafka
from tests.unit.tailkit import FakeClock, keep_state_db, put_back_state_db

SLOT = 4096
SERVICES = ["pay"] * 8 + ["ship"] * 3 + ["mail"]      # one topic fills faster than the others


def config(tmp_path, slots: int = 32, **source) -> dict:
    return {
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + slots * SLOT, "slot_size_bytes": SLOT,
                   "linger_ms": 50, "sync_on_seal": False, "seal_when_idle": False,
                   "seal_when_caught_up": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "paths": [str(tmp_path / "logs" / "app.log")],
                     "topic": "app.{service}", "fallback_topic": "app.other",
                     **source}],
    }


def agent_on(tmp_path, kafka: FakeKafka, slots: int = 32, **source) -> Agent:
    (tmp_path / "logs").mkdir(exist_ok=True)
    agent = Agent(parse(config(tmp_path, slots, **source)),
                  seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                              file_events=False))
    agent.begin()
    return agent


def line(i: int) -> bytes:
    return json.dumps({"id": i, "service": SERVICES[i % len(SERVICES)],
                       "user": f"u{i % 7}"}).encode() + b"\n"


def lines(a: int, b: int) -> bytes:
    return b"".join(line(i) for i in range(a, b))


def turns(agent: Agent, n: int, step_s: float = 0.3) -> None:
    for _ in range(n):
        agent.clock.advance(step_s)
        agent.turn()


def test_each_line_goes_to_the_topic_and_with_the_key_its_fields_make(tmp_path):
    """Three services interleaved, a line that is no JSON, one without the field, one whose
    field makes no topic name: each record in its topic (the last three in the fallback),
    keyed by the user, counted by kind; the file's checkpoints reach its end."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka, key="{user}/{hostname}")
    odd = [b"not json at all\n", b'{"user": "u9"}\n', b'{"service": "a b", "user": "u8"}\n']
    content = lines(0, 300) + b"".join(odd) + lines(300, 320)
    (tmp_path / "logs" / "app.log").write_bytes(content)
    turns(agent, 10)
    try:
        host = socket.gethostname()
        got = {(topic, value, key) for topic, value, key, _ts, _h in kafka.log}
        want = {(f"app.{SERVICES[i % len(SERVICES)]}", line(i)[:-1],
                 f"u{i % 7}/{host}".encode()) for i in range(320)}
        want |= {("app.other", odd[0][:-1], None),
                 ("app.other", odd[1][:-1], f"u9/{host}".encode()),
                 ("app.other", odd[2][:-1], f"u8/{host}".encode())}
        assert got == want
        assert len(kafka.log) == 323
        bad = {k: agent.metrics.get("agent_source_bad_input_total", kind=k, topic="app.other")
               for k in ("routed_to_fallback", "key_template_unmatched", "line_not_json")}
        assert bad == {"routed_to_fallback": 3, "key_template_unmatched": 1, "line_not_json": 1}
        [row] = agent.db.all_files()
        assert row["sealed_offset"] == row["acked_offset"] == len(content)
    finally:
        agent.abandon()


@pytest.mark.parametrize("kill_after", range(1, 13))
def test_a_crash_while_one_topic_is_sealed_and_another_still_filling_loses_no_line(
        tmp_path, kill_after):
    """Batches of 40 lines written one turn apart (less than the linger: the busy topic's
    slots seal as they fill, the quiet topics' stay filling), Kafka holding the first record
    (so every slot sealed stays in the pool, and the acknowledged offset at the file's start),
    the agent killed after ``kill_after`` turns: a slot of the quiet topic that was filling is
    gone, while the busy topic's sealed slots, which span its lines, survive. Reading must
    resume below those lines (the pool keeps a sealed end below what another topic's slot
    still fills; without it, the start took the surviving slots' ends and lost them). After a
    start on the same state folder, every line arrives, in its topic; each at most three
    times (sent, sent again from its slot, read again)."""
    first = FakeKafka()
    first.script(line(0)[:-1], HOLD)         # its slot, and every later one, stays in the pool
    agent = agent_on(tmp_path, first)
    log_file = tmp_path / "logs" / "app.log"
    total = 480
    ends: list[int] = []                 # where each slot sealed so far read its file to
    on_seal = agent.pool._on_seal
    agent.pool._on_seal = lambda slot: (ends.extend(e for *_r, e in slot.segments),
                                        on_seal(slot))
    for k in range(kill_after):
        with open(log_file, "ab") as f:
            f.write(lines(k * 40, (k + 1) * 40))
        agent.clock.advance(0.01)
        agent.turn()
    starts = [fill.positions[src][0] for fill in agent.pool._current.values()
              for src in fill.positions]
    # the case that matters: a line in a slot still filling lies below one sealed
    sealed_while_filling = bool(ends and starts) and min(starts) < max(ends)
    agent.abandon()                                             # the crash
    with open(log_file, "ab") as f:
        f.write(lines(kill_after * 40, total))
    second = FakeKafka()
    agent = agent_on(tmp_path, second)
    turns(agent, 15)
    try:
        delivered = Counter()
        for topic, value, _key, _ts, _h in first.log + second.log:
            obj = json.loads(value)
            assert topic == f"app.{obj['service']}", (topic, obj)
            delivered[obj["id"]] += 1
        missing = [i for i in range(total) if not delivered[i]]
        assert not missing, f"{len(missing)} line(s) lost, first {missing[:5]}"
        assert max(delivered.values()) <= 3
        assert sealed_while_filling or kill_after < 3, (starts, ends[-3:])
        [row] = agent.db.all_files()
        assert row["acked_offset"] == log_file.stat().st_size
    finally:
        agent.abandon()


def test_a_plain_file_template_names_its_lines_fields_but_not_with_multiline_or_encoding(
        tmp_path):
    raw = config(tmp_path)
    assert parse(raw).sources[0].topic == "app.{service}"
    del raw["sources"][0]["fallback_topic"]
    with pytest.raises(ConfigError, match="fallback topic"):
        parse(raw)
    raw = config(tmp_path, multiline={"start": "^\\{"})
    with pytest.raises(ConfigError, match="multiline event is no line to route by"):
        parse(raw)
    raw = config(tmp_path, encoding="latin-1")
    with pytest.raises(ConfigError, match="reads UTF-8"):
        parse(raw)
    raw = config(tmp_path, format="cri")
    with pytest.raises(ConfigError, match=r"\{service\} is not a field of the file"):
        parse(raw)


@pytest.mark.parametrize("cut", [False, True])
def test_a_start_after_the_pool_read_past_the_database_reads_a_routed_file_from_its_anchor(
        tmp_path, cut):
    """The pool (synced at each seal) holds slots read past the checkpoint the state database
    last made durable (its commits are synced at most every 0.2 s). A routed file's slots each
    hold one topic's lines among the others', so what they read cannot be matched to the
    file's bytes: the file is read again from the newest anchor, every line at most twice,
    nothing journalled, no cut back counted. ``cut``: the power cut also took the file back to
    line 130 and the application wrote on, past the old end, only ``pay`` lines — a check of
    the quiet topics' slots against their own lines found nothing to compare and took the file
    for whole: the new lines below the old end were skipped (the reviewer's case)."""
    first = FakeKafka()
    agent = agent_on(tmp_path, first)
    log_file = tmp_path / "logs" / "app.log"
    log_file.write_bytes(lines(0, 120))
    turns(agent, 5)
    saved = tmp_path / "durable"
    keep_state_db(tmp_path / "state", saved)   # its last durable commit
    first.script(line(120)[:-1], HOLD)                          # the later slots stay
    with open(log_file, "ab") as f:
        f.write(lines(120, 240))
    turns(agent, 5)
    assert agent.pool.sealed(), "slots read past the saved database wait for Kafka"
    agent.abandon()
    put_back_state_db(tmp_path / "state", saved)
    new = [json.dumps({"id": 1000 + k, "service": "pay"}).encode() + b"\n" for k in range(200)]
    if cut:
        with open(log_file, "r+b") as f:
            f.truncate(len(lines(0, 130)))
        with open(log_file, "ab") as f:
            f.write(b"".join(new))
    second = FakeKafka()
    agent = agent_on(tmp_path, second)
    turns(agent, 10)
    try:
        if not cut:
            assert agent.metrics.get("agent_source_rotations_total", kind="cut_back",
                                     topic="app.other") == 0
        assert agent.journal.entries() == []
        values = [v for _t, v, *_r in first.log + second.log]
        fragments = [v for v in values if not v.startswith(b'{"id": ')]
        assert not fragments, f"records that are no line of the file: {fragments[:2]}"
        delivered = Counter(json.loads(v)["id"] for v in values)
        want = list(range(130 if cut else 240)) + ([1000 + k for k in range(200)] if cut else [])
        missing = [i for i in want if not delivered[i]]
        assert not missing, f"{len(missing)} line(s) lost, first {missing[:5]}"
        assert max(delivered.values()) <= 3
    finally:
        agent.abandon()


def test_a_read_cut_short_by_a_full_pool_lets_no_slot_seal_past_its_lines_left_out(tmp_path):
    """Kafka holds the first record, so no slot is freed: a pool of four slots, three sealed
    and one filling with ``pay`` lines. A read of pay, mail, pay: the pay lines go into the
    filling slot, the mail line finds no slot (the read is cut short there, to be read again
    later), yet the filling slot now spans it. Sealed by its linger, that slot must not end
    past the mail line (the source's pending position stays until a hand-over has all its
    lines in: before, it ended past it, and after a kill the mail line was never read again)."""
    def jl(i: int, service: str) -> bytes:
        return json.dumps({"id": i, "service": service}).encode() + b"\n"

    first = FakeKafka()
    first.script(jl(0, "pay")[:-1], HOLD)
    agent = agent_on(tmp_path, first, slots=4)
    log_file = tmp_path / "logs" / "app.log"
    n = 0
    while agent.pool.stats()["free_slots"] > 0 or not agent.pool._current:
        with open(log_file, "ab") as f:
            f.write(jl(n, "pay"))
        n += 1
        agent.clock.advance(0.001)
        agent.turn()
        assert n < 1000, agent.pool.stats()
    with open(log_file, "ab") as f:
        f.write(jl(n, "pay") + jl(n + 1, "mail") + jl(n + 2, "pay"))
    total = n + 3
    agent.clock.advance(0.001)
    agent.turn()
    assert agent.pool.stats()["free_slots"] == 0
    turns(agent, 2)                            # the pay slot's linger: sealed
    agent.abandon()                                             # the crash
    second = FakeKafka()
    agent = agent_on(tmp_path, second, slots=4)
    turns(agent, 30)
    try:
        delivered = Counter(json.loads(v)["id"] for _t, v, *_r in first.log + second.log)
        missing = [i for i in range(total) if not delivered[i]]
        assert not missing, f"{len(missing)} line(s) lost, first {missing[:5]}"
    finally:
        agent.abandon()


def test_a_line_nested_deeper_than_json_parses_goes_to_the_fallback(tmp_path):
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    deep = b"[" * 2_500 + b"\n"                       # fits a slot; too deep for json
    (tmp_path / "logs" / "app.log").write_bytes(lines(0, 5) + deep + lines(5, 10))
    turns(agent, 6)
    try:
        assert [t for t, v, *_r in kafka.log if v == deep[:-1]] == ["app.other"]
        assert len(kafka.log) == 11
        assert agent.metrics.get("agent_source_bad_input_total", kind="line_not_json",
                                 topic="app.other") == 1
    finally:
        agent.abandon()
