"""A cluster that refuses the agent — an ACL missing, a password wrong — is an outage with a
named cause, never a loss: the records wait in their slots, the state and one log line say
why, the refused topic is tried again every ``DENIED_RETRY_S`` (not in a loop), and delivery
resumes by itself once the cluster accepts (a granted ACL), or once a reload gives the drain
new credentials."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from confluent_kafka import KafkaError

import agent.drain.drain as drain_module
from agent.buffer.seams import Clock
from agent.drain.outcome import Outcome, classify
from tests.unit.poolkit import fake_drain

# Each test runs with both send paths of the drain (Python, native).
pytestmark = pytest.mark.usefixtures("send_path")

DENIED = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")


class StoppedClock(Clock):
    """The drain's clock, moved by the test alone (``now``, in seconds)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic_ns(self) -> int:
        return int(self.now * 1e9)


@pytest.fixture
def clock():
    return StoppedClock()


def _fake(tmp_path, clock: StoppedClock, records: int = 100):
    data = b"".join(b"event %d\n" % i for i in range(records))
    drain, pool, kafka = fake_drain(tmp_path, data, np.full(records, 1_795_000_000_000),
                                    clock=clock)
    return drain, pool, kafka, [b"event %d" % i for i in range(records)]


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                  KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                  KafkaError.SASL_AUTHENTICATION_FAILED,
                                  KafkaError._AUTHENTICATION])
def test_refusals_are_denied_never_dead(code):
    assert classify(KafkaError(code)) is Outcome.DENIED
    assert classify(KafkaError(code), alone=True) is Outcome.DENIED


def test_a_refused_topic_waits_in_its_slot_and_goes_by_itself_once_the_acl_is_granted(
        tmp_path, clock, caplog):
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, DENIED, DENIED)            # refused twice, then the ACL is granted
    caplog.set_level(logging.WARNING, logger="docket.agent.drain")
    drain.pump()
    assert drain.broker_state == "not authorised: TOPIC_AUTHORIZATION_FAILED on topic t"
    assert pool.sealed() and kafka.log == []
    handed = sum(len(p.produced) for p in kafka.producers)
    assert handed == len(values)
    for _ in range(50):                            # no time passes: nothing is sent again
        drain.pump()
    assert sum(len(p.produced) for p in kafka.producers) == handed

    clock.now += drain_module.DENIED_RETRY_S      # tried again: refused again
    for _ in range(5):
        drain.pump()
    assert sum(len(p.produced) for p in kafka.producers) == 2 * handed
    assert pool.sealed() and kafka.log == []

    clock.now += drain_module.DENIED_RETRY_S      # granted: every record goes, once
    for _ in range(5):
        drain.pump()
    assert not pool.sealed()
    assert Counter(kafka.values()) == Counter(values)
    assert drain.broker_state == "up"
    assert not (tmp_path / "dead").exists() and drain.journal.entries() == []
    assert drain.metrics.get("agent_drain_sent_events_total") == len(values)
    refusals = [r for r in caplog.records if "not authorised" in r.getMessage()]
    assert len(refusals) == 1                      # said once, not at every try
    assert "Grant the agent's principal Write on the topic" in refusals[0].getMessage()
    drain.close()
    pool.close()


def test_slots_of_a_refused_topic_are_held_not_sent_while_it_is_refused(tmp_path, clock):
    """The slots handed over before the refusal came back are all refused; then one slot
    tries the topic again every DENIED_RETRY_S and the others wait unsent: a refused topic
    costs one slot's records per try, not a loop over the pool."""
    drain, pool, kafka, values = _fake(tmp_path, clock, 3000)
    assert len(pool.sealed()) > 2
    first_slot = {b"event %d" % i for i in range(pool.sealed()[0].record_count)}
    for v in values:                               # the slot that tries is refused 3 times
        kafka.script(v, *([DENIED] * (3 if v in first_slot else 1)))
    drain.pump()
    assert drain.broker_state.startswith("not authorised")
    assert kafka.log == [] and len(drain.inflight) > 2
    per_try = drain.inflight[0].total

    def handed() -> int:
        return sum(len(p.produced) for p in kafka.producers)
    before = handed()
    for _ in range(20):
        drain.pump()
    assert handed() == before                      # held: nothing sent between tries
    for _ in range(2):                             # two tries: one slot each, refused
        clock.now += drain_module.DENIED_RETRY_S
        start = handed()
        for _ in range(3):
            drain.pump()
        assert 0 < handed() - start <= per_try
    assert kafka.log == [] and pool.sealed()
    for _ in range(2):                             # granted: the first slot goes, then all
        clock.now += drain_module.DENIED_RETRY_S
        for _ in range(5):
            drain.pump()
    assert not pool.sealed()
    assert Counter(kafka.values()) == Counter(values)
    assert drain.broker_state == "up"
    assert drain.journal.entries() == []
    drain.close()
    pool.close()


def test_an_authentication_failure_is_named_once_and_cleared_when_records_are_acknowledged(
        tmp_path, clock, caplog):
    drain, pool, kafka, values = _fake(tmp_path, clock)
    caplog.set_level(logging.WARNING, logger="docket.agent.drain")
    err = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication "
                     "failed during authentication due to invalid credentials")
    drain._on_error(err)
    drain._on_error(err)
    drain._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))  # does not hide the cause
    assert drain.broker_state == "authentication failed"
    assert drain.metrics.get("agent_drain_broker_up") == 0
    said = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(said) == 1 and "sasl_password_file" in said[0]
    for _ in range(5):
        drain.pump()
    assert Counter(kafka.values()) == Counter(values)
    assert drain.broker_state == "up"
    drain.close()
    pool.close()


def test_a_tls_failure_names_the_certificate_settings(tmp_path, clock, caplog):
    drain, pool, kafka, _values = _fake(tmp_path, clock)
    caplog.set_level(logging.WARNING, logger="docket.agent.drain")
    drain._on_error(KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify "
                               "failed"))
    assert drain.broker_state == "authentication failed (TLS)"
    assert any("ssl_ca_file" in r.getMessage() for r in caplog.records)
    drain.close()
    pool.close()


def test_a_client_certificate_the_brokers_refuse_is_an_authentication_failure(tmp_path, clock):
    """What a broker requiring client certificates answers one it does not trust (measured:
    librdkafka reports the transport error with the TLS alert's text)."""
    drain, pool, _kafka, _values = _fake(tmp_path, clock)
    drain._on_error(KafkaError(KafkaError._TRANSPORT, "ssl://127.0.0.1:9093/bootstrap: SSL "
                               "handshake failed: ssl/tls alert bad certificate"))
    assert drain.broker_state == "authentication failed (TLS)"
    drain._on_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    assert drain.broker_state == "authentication failed (TLS)"
    drain.close()
    pool.close()


def test_reconfigure_replaces_the_producer_and_the_records_go_once(tmp_path, clock):
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, DENIED)
    drain.pump()
    assert kafka.log == []
    drain.reconfigure({**drain.conf, "sasl.password": "the new one"})
    clock.now += drain_module.DENIED_RETRY_S
    for _ in range(5):
        drain.pump()
    assert len(kafka.senders) == 2
    assert kafka.senders[-1].conf["sasl.password"] == "the new one"
    assert Counter(kafka.values()) == Counter(values)
    assert not pool.sealed()
    drain.close()
    pool.close()
