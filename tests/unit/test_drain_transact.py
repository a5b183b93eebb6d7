"""The exactly-once mode's pieces that need no cluster (the cluster's part is in
tests/faults/test_exactly_once.py): the progress marker written and read back, the settings
the mode refuses, and the ACLs ``acl grant --exactly-once`` adds."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from agent.config import ConfigError, to_toml
from agent.drain.transact import marker_value, parse_marker, transactional_id
from broker.security import Scope, role_acls


@dataclass
class Slot:                                  # what the marker reads of a sealed slot
    first_record: int
    record_count: int
    seq: int


def test_the_marker_names_each_slot_of_the_transaction_for_its_incarnation():
    slots = [Slot(0, 10_000, 7), Slot(10_000, 9_998, 8), Slot(19_998, 1, 9)]
    text = marker_value("1763766000000-a1b2", slots)
    assert parse_marker(text, "1763766000000-a1b2") == {(0, 10_000), (10_000, 9_998),
                                                        (19_998, 1)}
    # Another incarnation's numbers mean other records: its marker names nothing of ours.
    assert parse_marker(text, "1763766999999-ffff") == set()
    assert parse_marker(None, "x") == parse_marker("", "x") == set()


def test_a_full_transactions_marker_fits_kafkas_offset_metadata_limit():
    """``offset.metadata.max.bytes`` is 4096 by default; 64 slots (the most a transaction may
    hold) with large numbers stay under it."""
    big = 10 ** 15
    slots = [Slot(big + k * 10_000, 10_000, 2 ** 31 + k) for k in range(64)]
    assert len(marker_value("1763766000000-" + "f" * 16, slots).encode()) < 4096


@pytest.mark.parametrize("text", ["{", "[]", json.dumps({"v": 1, "incarnation": "i",
                                                         "slots": [["a", 1]]}),
                                  json.dumps({"v": 1, "incarnation": "i"})])
def test_an_unreadable_marker_names_nothing_and_says_so(text, caplog):
    """Every slot is then sent again: duplicates possible, never a loss."""
    with caplog.at_level(logging.ERROR):
        assert parse_marker(text, "i") == set()
    assert "progress marker unreadable" in caplog.text


def test_a_marker_of_another_version_names_nothing():
    assert parse_marker(json.dumps({"v": 2, "incarnation": "i", "slots": [[0, 1, 0]]}),
                        "i") == set()


def test_the_transactional_id_is_the_agents():
    assert transactional_id("web-42") == "docket-agent-web-42"


@pytest.mark.parametrize("values, where", [
    ({"broker.delivery": "exactly-once"}, "broker.delivery"),
    ({"broker.transaction_max_slots": 65}, "broker.transaction_max_slots"),
    ({"broker.transaction_timeout_ms": 500}, "broker.transaction_timeout_ms"),
])
def test_settings_the_mode_cannot_run_with_are_refused(values, where, tmp_path):
    with pytest.raises(ConfigError) as err:
        to_toml(values, [{"type": "file", "topic": "t", "paths": [str(tmp_path / "*.log")]}])
    assert where in str(err.value)


def test_exactly_once_acls_are_the_transactional_id_the_group_and_the_progress_topic():
    plain = Scope(topics=("app.events",))
    eos = Scope(topics=("app.events",), progress_topic="docket.progress")
    added = set(role_acls("agent", "User:agent", eos)) - set(role_acls("agent", "User:agent",
                                                                        plain))
    assert {(a.resource, a.name, a.pattern, a.operation) for a in added} == {
        ("transactional-id", "docket-agent-", "prefixed", "Write"),
        ("group", "docket-agent-", "prefixed", "Read"),
        ("topic", "docket.progress", "literal", "Read")}
    # Only the agent's role takes them.
    assert role_acls("reconcile", "User:r", eos) == role_acls("reconcile", "User:r", plain)
