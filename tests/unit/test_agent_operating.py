"""What an operator reads: exact /metrics values, slot states that add up, a backlog that counts
the filling slots, repeated log lines held back, options that weaken delivery refused."""

from __future__ import annotations

import logging

import pytest

from agent.buffer import BufferPool
from agent.config import ConfigError, parse
from agent.logs import Quieter
from agent.telemetry import Metrics, sample
from tests.unit.poolkit import SIZE, SLOT, chunk_of


def _series(text: str, name: str) -> str:
    [line] = [x for x in text.splitlines() if x.startswith(name + " ") or
              x.startswith(name + "{")]
    return line.rsplit(" ", 1)[1]


def test_metrics_print_integers_exactly_and_floats_with_every_digit():
    m = Metrics()
    m.inc("agent_source_read_bytes_total", 2_265_270, topic="t")
    m.set("agent_audit_last_emission_timestamp_seconds", 1_795_343_780.123)
    m.set("agent_buffer_oldest_unacked_age_seconds", 0.5)
    text = m.prometheus()
    assert _series(text, "agent_source_read_bytes_total") == "2265270"
    assert _series(text, "agent_audit_last_emission_timestamp_seconds") == "1795343780.123"
    assert _series(text, "agent_buffer_oldest_unacked_age_seconds") == "0.5"
    assert [sample(v) for v in (2**53, 1e21, float("inf"), float("nan"))] == \
        ["9007199254740992", "1000000000000000000000", "+Inf", "NaN"]
    for value in (2_265_270, 1_795_343_780.123, 123_456_789_012.25):
        assert float(sample(value)) == value          # what a scraper parses is the value


def test_slot_states_add_up_to_the_pool_and_the_backlog_counts_filling_slots(tmp_path):
    pool = BufferPool(tmp_path / "buffer.pool", SIZE, SLOT, linger_ms=1e9, sync_on_seal=False)
    pool.append("t", chunk_of(range(0, 150)))                 # fills more than one slot
    pool.seal_all()
    pool.append("t", chunk_of(range(150, 160)))               # still filling
    [leased, *_] = pool.take(limit=1)
    st = pool.stats()
    states = [st[k] for k in ("free_slots", "filling_slots", "waiting_slots", "sending_slots")]
    assert sum(states) == st["slot_count"], st
    assert st["sending_slots"] == 1 and st["filling_slots"] == 1
    assert st["filling_records"] == 10
    assert st["sealed_records"] + st["filling_records"] == 160
    assert leased.record_count > 0


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, level=logging.ERROR, name="docket.agent.librdkafka") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "%s [%s] %s",
                             ("FAIL", "rdkafka#producer-1", msg), None)


def test_a_line_repeating_in_an_outage_is_logged_once_then_once_a_minute_with_a_count():
    clock = _Clock()
    quiet = Quieter(every_s=60, clock=clock)
    passed = []
    for i in range(1900):                   # ~21 lines/s for 90 s, as librdkafka logs them
        clock.now = i / 21
        rec = _record(f"127.0.0.1:{9092 + i % 3}/1: Connect to ipv4#127.0.0.1:{9092 + i % 3} "
                      f"failed: Connection refused (after {i % 7}ms in state CONNECT)")
        if quiet.filter(rec):
            passed.append(rec.getMessage())
    assert len(passed) == 2, passed
    assert "more like it held back since the last one shown" in passed[1]
    held = int(passed[1].rsplit("(", 1)[1].split()[0])
    assert held == 60 * 21 - 1                # every line of the first minute but the first
    other = _record("another failure")
    assert quiet.filter(other)                # another kind of line is not held
    # The burst ended (at 90 s): what was held since the second line is still counted.
    assert quiet.held_due() == []             # not before its quiet time is over
    clock.now = 121
    [(name, level, text)] = quiet.held_due()
    assert name == "docket.agent.librdkafka" and level == logging.ERROR
    assert text.startswith(f"{1900 - 60 * 21 - 1} more like this held back: ")
    assert quiet.held_due() == []


def test_the_same_message_with_another_exception_is_another_kind():
    quiet = Quieter(every_s=60, clock=_Clock())
    records = []
    for error in (ValueError, ValueError, KeyError):
        try:
            raise error("x")
        except Exception:
            import sys
            rec = logging.LogRecord("docket.agent.audit", logging.ERROR, __file__, 1,
                                    "audit emission failed", (), sys.exc_info())
        records.append(quiet.filter(rec))
    assert records == [True, False, True]


def test_expected_startup_noise_is_info_not_warning():
    rec = _record("Coordinator load in progress", level=logging.WARNING)
    assert Quieter().filter(rec) and rec.levelno == logging.INFO and rec.levelname == "INFO"


BASE = {"agent": {"state_dir": "/tmp/x"}, "sources": [{"type": "socket", "path": "/tmp/s",
                                                      "topic": "t"}]}


@pytest.mark.parametrize("key,value", [("acks", "1"), ("acks", 0), ("request.required.acks", 1),
                                       ("enable.idempotence", False),
                                       ("enable.idempotence", "false"),
                                       ("enable.idempotence", "F")])
def test_options_that_weaken_delivery_are_refused_unless_accepted(key, value):
    raw = {**BASE, "broker": {"librdkafka_options": {key: value}}}
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert err.value.path == f"broker.librdkafka_options.{key}"
    assert "unsafe_weaker_delivery = true" in err.value.hint
    raw["broker"]["unsafe_weaker_delivery"] = True
    cfg = parse(raw)
    assert [w for w, _ in cfg.warnings] == [f"broker.librdkafka_options.{key}"]


@pytest.mark.parametrize("key,value", [("acks", "all"), ("acks", -1), ("enable.idempotence", True)])
def test_the_agents_own_delivery_settings_given_again_are_fine(key, value):
    cfg = parse({**BASE, "broker": {"librdkafka_options": {key: value}}})
    assert cfg.warnings == []


def test_the_stop_fits_in_the_units_stop_timeout_with_room_to_spare():
    """A clean stop (drain, then the last audit round) ends well before systemd's SIGKILL."""
    import re
    from pathlib import Path

    from agent import audit_emitter, config

    unit = (Path(__file__).parents[2] / "systemd/docket-agent.service").read_text()
    stop_s = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    assert config.UNIT_STOP_TIMEOUT_MS == stop_s * 1000
    assert config.AUDIT_LAST_ROUND_MS == audit_emitter.STOP_BUDGET_S * 1000
    default = next(s.default for s in config.SETTINGS if s.key == "agent.shutdown_timeout_ms")
    assert default + config.AUDIT_LAST_ROUND_MS <= config.UNIT_STOP_TIMEOUT_MS - 10_000
    cfg = parse({**BASE, "agent": {"state_dir": "/tmp/x", "shutdown_timeout_ms": 40_000}})
    assert [w for w, _ in cfg.warnings] == ["agent.shutdown_timeout_ms"]


def test_json_logs_are_one_object_per_line():
    import json

    from agent.logs import JsonFormatter

    rec = logging.LogRecord("docket.agent", logging.WARNING, __file__, 1, "topic %s\nmissing",
                            ("a\"b",), None)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert out["level"] == "WARNING" and out["logger"] == "docket.agent"
    assert out["message"] == 'topic a"b\nmissing' and out["ts"].endswith("Z")
