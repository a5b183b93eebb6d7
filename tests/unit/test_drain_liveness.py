"""The send path cannot stall silently. A producer with records out and nothing reported is
asked about through a new client (never itself): a cluster that does not answer is an outage;
one that answers while the producer stays silent past the stall bound — ``STALL_AFTER_S``, or
``RESUME_STALL_S`` once an outage has ended — gets the producer replaced, the slots in flight
sent again under their record numbers, status ``stalled`` and a metric; replacements in a row
with nothing acknowledged make the drain ``wedged`` (the service then starves systemd's
watchdog). The interleaving seen after a 30 s broker pause is replayed here step by step: the
producer that lived through the outage never answers again, while the cluster does."""

from __future__ import annotations

import base64
import json
import re
import time
from collections import Counter

import numpy as np
import pytest

from agent.drain.drain import (
    OUTAGE_AFTER_S,
    RESTART_AFTER_STALLS,
    RESUME_STALL_S,
    STALL_AFTER_S,
)
from docket_common.names import SEQ_HEADER
from tests.unit.fakeproducer import HOLD, NEVER, OK
from tests.unit.poolkit import fake_drain
from tests.unit.test_drain_denied import StoppedClock

# Each test runs with both send paths of the drain (Python, native).
pytestmark = pytest.mark.usefixtures("send_path")

RECORDS = 300


def _fake(tmp_path, clock):
    data = b"".join(b"event %d\n" % i for i in range(RECORDS))
    drain, pool, kafka = fake_drain(tmp_path, data, np.full(RECORDS, 1_795_000_000_000),
                                    clock=clock)
    return drain, pool, kafka, [b"event %d" % i for i in range(RECORDS)]


def _turn_until(drain, done, what: str, turns: int = 3000) -> None:
    """Pump until ``done()``, giving the probe's thread time to answer; the drain's clock does
    not move."""
    for _ in range(turns):
        if done():
            return
        drain.pump()
        time.sleep(0.001)
    raise AssertionError(f"not reached: {what} (state {drain.broker_state!r})")


def _replaced(drain, reason: str = "stalled") -> float:
    return drain.metrics.get("agent_drain_producer_replacements_total", reason=reason)


def _delivered_once_under_their_numbers(kafka, values) -> None:
    """Every value in Kafka once, with the record number it was sealed with (``event i`` is
    record i: the pool numbers from 0 in seal order)."""
    got = Counter(kafka.values())
    assert got == Counter(values), (len(got), sum(got.values()))
    for _topic, value, _key, _ts, headers in kafka.log:
        number = int.from_bytes(dict(headers)[SEQ_HEADER], "big")
        assert value == b"event %d" % number


def _through_an_outage(tmp_path, clock):
    """Every record in flight when the broker stops (held by the first producer; a second
    hand-over gets no answer); the outage found, and its end."""
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, HOLD, NEVER)
    drain.pump()
    kafka.reachable = False
    clock.now += OUTAGE_AFTER_S
    _turn_until(drain, lambda: drain.outage, "an outage")
    kafka.reachable = True
    _turn_until(drain, lambda: not drain.outage, "the outage's end")
    return drain, pool, kafka, values


def test_a_producer_silent_while_the_cluster_answers_is_waited_for_then_replaced(tmp_path):
    clock = StoppedClock()
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, NEVER)                # the first producer reports none of them
    drain.pump()
    assert kafka.log == [] and pool.sealed()

    clock.now += OUTAGE_AFTER_S               # asked: the cluster answers (a failover?)
    _turn_until(drain, lambda: kafka.probes == 1 and drain._stall_probe is None, "asked once")
    assert not drain.outage and drain.broker_state == "up"
    clock.now += STALL_AFTER_S - OUTAGE_AFTER_S - 1
    for _ in range(100):                      # still within the bound: waited for, not asked
        drain.pump()
    assert kafka.probes == 1 and _replaced(drain) == 0
    assert drain.unacknowledged_s() == pytest.approx(STALL_AFTER_S - 1)

    clock.now += 1                            # the bound: asked again, answered: replaced
    _turn_until(drain, lambda: drain.broker_state.startswith("stalled"), "stalled")
    assert drain.stall["replacements"] == 1 and drain.stalls_in_a_row == 1
    assert not drain.wedged()
    _turn_until(drain, lambda: not pool.sealed(), "the slot freed")
    assert _replaced(drain) == 1 and kafka.probes == 2
    _delivered_once_under_their_numbers(kafka, values)
    assert drain.broker_state == "up" and drain.stall is None and drain.stalls_in_a_row == 0
    assert drain.metrics.get("agent_drain_outages_total") == 0


def test_after_an_outage_a_producer_that_never_answers_again_is_replaced_within_the_resume_bound(
        tmp_path, send_path):
    """What a 30 s broker pause did: the outage is found and purged; the cluster answers
    again; the producer that lived through it sends nothing more. Its records in flight are
    held (requests that never come back), the cluster answers a new client at once: within
    ``RESUME_STALL_S`` of the outage's end the producer is replaced, and everything arrives
    once. On the native path every record goes through native producers, resends too."""
    clock = StoppedClock()
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, HOLD)                 # in flight when the broker stops, never answered
    drain.pump()
    kafka.reachable = False
    clock.now += OUTAGE_AFTER_S
    _turn_until(drain, lambda: drain.outage, "an outage")
    assert drain.broker_state == "unreachable"

    kafka.reachable = True                    # the broker is back: a new client is answered
    _turn_until(drain, lambda: not drain.outage, "the outage's end")
    assert drain.broker_state == "up"
    ended = clock.now
    for _ in range(100):                      # the old producer answers nothing
        drain.pump()
    assert pool.sealed() and kafka.log == []
    clock.now += RESUME_STALL_S
    _turn_until(drain, lambda: _replaced(drain) == 1, "replaced")
    assert clock.now - ended <= RESUME_STALL_S
    _turn_until(drain, lambda: not pool.sealed(), "the slot freed")
    _delivered_once_under_their_numbers(kafka, values)
    assert drain.broker_state == "up" and drain.metrics.get("agent_drain_outages_total") == 1
    roles = [p.role for p in kafka.producers]
    assert roles == (["native", "native"] if send_path == "native" else ["main", "main"])


def test_failure_reports_after_an_outage_do_not_lift_the_resume_bound(tmp_path):
    """What a 15 s broker pause did in the pause matrix: the cluster answers again, the
    producer that lived through the outage reports its requests in flight as failed, and then
    sends nothing more (its metadata was answered while the single node was fenced). Those
    failures are no acknowledgement: the producer is still held to ``RESUME_STALL_S`` from
    them, not to ``STALL_AFTER_S`` (45 s of nothing, before)."""
    from confluent_kafka import KafkaError

    clock = StoppedClock()
    drain, pool, kafka, values = _through_an_outage(tmp_path, clock)
    kafka.senders[-1].release(KafkaError(KafkaError.REQUEST_TIMED_OUT))
    _turn_until(drain, lambda: drain.metrics.get("agent_drain_retried_events_total",
                                                 reason="kafka_request_timed_out", topic="t") > 0,
                "the failures reported")
    reported = clock.now
    for _ in range(100):
        drain.pump()
    assert pool.sealed() and kafka.log == [] and _replaced(drain) == 0
    clock.now += RESUME_STALL_S
    _turn_until(drain, lambda: _replaced(drain) == 1, "replaced", turns=1000)
    assert clock.now - reported <= RESUME_STALL_S
    _turn_until(drain, lambda: not pool.sealed(), "the slot freed")
    _delivered_once_under_their_numbers(kafka, values)


def test_acknowledgements_of_requests_from_before_an_outage_do_not_lift_the_resume_bound(
        tmp_path):
    """The broker answers the requests it held as it wakes; the producer then sends nothing
    more of what came after. Those late acknowledgements prove nothing about it: it is
    replaced within ``RESUME_STALL_S`` of them, and every record arrives once."""
    from agent.buffer import Chunk

    clock = StoppedClock()
    drain, pool, kafka, values = _through_an_outage(tmp_path, clock)
    later = [b"later %d" % i for i in range(50)]
    for v in later:
        kafka.script(v, NEVER)                # sent after the outage: never answered
    pool.append("t", Chunk.from_lines(b"".join(v + b"\n" for v in later), 1_795_000_000_000))
    pool.seal_all()
    kafka.senders[-1].release(OK)             # what was in flight: acknowledged as it wakes
    _turn_until(drain, lambda: len(kafka.log) == RECORDS, "the held requests acknowledged")
    acknowledged = clock.now
    for _ in range(100):
        drain.pump()
    assert _replaced(drain) == 0
    clock.now += RESUME_STALL_S
    _turn_until(drain, lambda: _replaced(drain) == 1, "replaced", turns=1000)
    assert clock.now - acknowledged <= RESUME_STALL_S
    _turn_until(drain, lambda: not pool.sealed(), "every slot freed")
    assert Counter(kafka.values()) == Counter(values + later)


def test_a_producer_replaced_after_an_outage_is_held_to_the_long_bound(tmp_path):
    """The short bound is for the producer that lived through the outage; the one that
    replaced it gets ``STALL_AFTER_S``, as after any replacement (a broker still electing its
    leaders is not cut short every five seconds)."""
    clock = StoppedClock()
    drain, pool, kafka, values = _through_an_outage(tmp_path, clock)
    clock.now += RESUME_STALL_S
    _turn_until(drain, lambda: _replaced(drain) == 1, "replaced after the outage")
    clock.now += RESUME_STALL_S
    for _ in range(200):                       # the new producer: not replaced at 5 s
        drain.pump()
        time.sleep(0.001)
    assert _replaced(drain) == 1
    clock.now += STALL_AFTER_S - RESUME_STALL_S
    _turn_until(drain, lambda: _replaced(drain) == 2, "replaced at the long bound")
    _turn_until(drain, lambda: not pool.sealed(), "the slot freed")
    _delivered_once_under_their_numbers(kafka, values)


def test_replacements_in_a_row_with_nothing_acknowledged_make_the_drain_wedged(tmp_path):
    clock = StoppedClock()
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, *[NEVER] * RESTART_AFTER_STALLS)   # three producers in turn say nothing
    drain.pump()
    for n in range(1, RESTART_AFTER_STALLS + 1):
        clock.now += OUTAGE_AFTER_S
        _turn_until(drain, lambda: drain._next_probe > 0, "asked")
        clock.now += STALL_AFTER_S - OUTAGE_AFTER_S
        _turn_until(drain, lambda n=n: drain.stalls_in_a_row == n, f"stall {n}")
        assert drain.stall["replacements"] == n and drain.broker_state.startswith("stalled")
        assert drain.wedged() == (n >= RESTART_AFTER_STALLS)
        _turn_until(drain, lambda n=n: _replaced(drain) == n, f"replacement {n}")
    _turn_until(drain, lambda: not pool.sealed(), "the slot freed")   # the fourth one answers
    assert not drain.wedged() and drain.stall is None and drain.broker_state == "up"
    _delivered_once_under_their_numbers(kafka, values)


def test_a_cluster_that_does_not_answer_a_new_client_is_an_outage_never_a_stall(tmp_path):
    clock = StoppedClock()
    drain, pool, kafka, values = _fake(tmp_path, clock)
    for v in values:
        kafka.script(v, HOLD)
    drain.pump()
    kafka.reachable = False
    clock.now += STALL_AFTER_S               # however long: no answer, no replacement
    _turn_until(drain, lambda: drain.outage, "an outage")
    for _ in range(200):
        drain.pump()
        time.sleep(0.001)
    assert _replaced(drain) == 0 and drain.broker_state == "unreachable"
    assert drain.unacknowledged_s() >= STALL_AFTER_S


class _Notes:
    """systemd's notify socket, as the agent's ``Notifier`` speaks to it: what was sent."""

    watchdog_interval_s = 0.5

    def __init__(self):
        self.sent: list[str] = []

    def __getattr__(self, name):                 # ready, status, stopping, reloading
        return lambda *args: self.sent.append(name)

    def watchdog(self) -> None:
        self.sent.append("WATCHDOG=1")


def test_the_agent_says_stalled_and_starves_the_watchdog_only_while_wedged(tmp_path, send_path):
    """The running agent over a cluster whose producers say nothing while a new client is
    answered: status ``stalled`` with since when, the metric, and no WATCHDOG=1 once the
    replacements in a row reach ``RESTART_AFTER_STALLS``; the first acknowledgement brings
    ``up`` and the watchdog back."""
    from agent.config import parse
    from agent.service import Agent, Seams
    from tests.unit.fakenative import FakeSlotProducer
    from tests.unit.fakeproducer import FakeKafka
    from tests.unit.tailkit import FakeClock

    log = tmp_path / "app.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(50)))
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": send_path},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(log)]}],
    })
    kafka, clock, notes = FakeKafka(), FakeClock(), _Notes()
    for i in range(50):                       # one producer more than the wedge takes
        kafka.script(b"line %d" % i, *[NEVER] * (RESTART_AFTER_STALLS + 1))
    native = (lambda conf: FakeSlotProducer(conf, kafka)) if send_path == "native" else None
    agent = Agent(cfg, notifier=notes, seams=Seams(
        clock=clock, file_events=False, producer_factory=kafka.producer,
        native_factory=native, probe_factory=kafka.admin))

    def turns(until, what: str) -> None:
        for _ in range(3000):
            if until():
                return
            agent.turn()
            time.sleep(0.001)
        raise AssertionError(f"not reached: {what}: {agent.status()['broker']}")

    def fed() -> int:
        return notes.sent.count("WATCHDOG=1")

    try:
        agent.begin()
        turns(lambda: agent.drain.inflight, "a slot in flight")
        for n in range(1, RESTART_AFTER_STALLS + 2):
            clock.advance(OUTAGE_AFTER_S)
            turns(lambda: agent.drain._next_probe > 0, "asked")
            clock.advance(STALL_AFTER_S - OUTAGE_AFTER_S)
            turns(lambda n=n: agent.drain.stalls_in_a_row == n, f"stall {n}")
            broker = agent.status()["broker"]
            assert re.match(r"stalled: nothing acknowledged for \d+ s while the cluster answers",
                            broker["state"]), broker["state"]
            assert broker["stall"]["replacements"] == n
            assert broker["stall"]["since"].endswith("Z")       # RFC 3339, UTC
            if n > RESTART_AFTER_STALLS:
                break                         # the next producer answers
            before = fed()
            for _ in range(5):                # the new producer says nothing either
                clock.advance(1)
                agent.turn()
            assert (fed() > before) == (n < RESTART_AFTER_STALLS), (n, notes.sent[-5:])
            assert agent.metrics.get("agent_drain_producer_replacements_total",
                                     reason="stalled") == n
        turns(lambda: not agent.pool.sealed(), "the backlog sent")      # the fifth answers
        assert agent.status()["broker"]["state"] == "up"
        assert agent.status()["broker"]["stall"] is None
        before = fed()
        clock.advance(1)
        agent.turn()
        assert fed() == before + 1
        assert sorted(kafka.values()) == sorted(b"line %d" % i for i in range(50))
    finally:
        agent.abandon()


def test_probes_with_oauthbearer_share_one_token_asked_again_late_in_its_life(monkeypatch):
    """Each probe is a new client; with OIDC each would ask the token endpoint at once. The
    probe's settings carry a shared token instead (``oauth_cb``), asked for with the client
    credentials and asked again once four fifths of its life are over."""
    from agent.drain import probe

    class Answer:
        def __init__(self, n):
            self.n = n

        def raise_for_status(self):
            pass

        def json(self):
            return {"access_token": f"token-{self.n}", "expires_in": 100}

    class Endpoint:
        def __init__(self):
            self.calls = []

        def post(self, url, data, auth, verify, timeout):
            self.calls.append((url, data, auth, verify))
            return Answer(len(self.calls))

    now = [1_000.0]
    monkeypatch.setattr(probe.time, "time", lambda: now[0])
    monkeypatch.setattr(probe, "_tokens", {})
    conf = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.test/token",
            "sasl.oauthbearer.client.id": "agent", "sasl.oauthbearer.client.secret": "s",
            "sasl.oauthbearer.scope": "kafka", "https.ca.location": "/ca.pem",
            "linger.ms": 5}
    first = probe.probe_conf(conf)
    assert not any(k.startswith("sasl.oauthbearer.") for k in first) and "linger.ms" not in first
    assert first["sasl.mechanism"] == "OAUTHBEARER"
    endpoint = Endpoint()
    cache = first["oauth_cb"].__self__
    cache._session = endpoint
    assert first["oauth_cb"]("") == ("token-1", 1_100.0)
    assert probe.probe_conf(conf)["oauth_cb"]("") == ("token-1", 1_100.0)    # shared
    now[0] = 1_079.0
    assert probe.probe_conf(conf)["oauth_cb"]("")[0] == "token-1"
    now[0] = 1_081.0                                                        # 4/5 of its life
    assert probe.probe_conf(conf)["oauth_cb"]("") == ("token-2", 1_181.0)
    assert endpoint.calls[0] == ("https://idp.test/token", {"grant_type": "client_credentials",
                                                            "scope": "kafka"},
                                 ("agent", "s"), "/ca.pem")
    assert len(endpoint.calls) == 2
    plain = {k: v for k, v in conf.items() if not k.startswith("sasl.oauthbearer")}
    assert "oauth_cb" not in probe.probe_conf(plain)

    # A refusing endpoint (a wrong secret) is not asked again for a while: the probe fails
    # at once meanwhile, and asks again later.
    class Refusing(Endpoint):
        def post(self, *args, **kwargs):
            super().post(*args, **kwargs)
            raise OSError("401 invalid_client")

    refusing = Refusing()
    cache._session, cache._token = refusing, None
    for _ in range(3):
        with pytest.raises(RuntimeError, match="invalid_client"):
            cache.token("")
    assert len(refusing.calls) == 1
    now[0] += probe.REFUSED_RETRY_S
    with pytest.raises(RuntimeError):
        cache.token("")
    assert len(refusing.calls) == 2
    cache._session = endpoint                                   # fixed: a token again
    now[0] += probe.REFUSED_RETRY_S
    assert cache.token("")[0] == "token-3"


def _jwt(claims: dict) -> str:
    def part(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


def test_the_probes_token_lives_no_longer_than_its_exp_and_goes_when_refused(monkeypatch):
    """A token whose own ``exp`` comes before the endpoint's ``expires_in`` is asked again
    before its ``exp`` (an endpoint whose clock is behind); one the cluster refused (a probe's
    authentication error) is asked again at the next probe, not kept until its renewal."""
    from confluent_kafka import KafkaError

    from agent.drain import probe

    now = [1_000.0]
    monkeypatch.setattr(probe.time, "time", lambda: now[0])
    monkeypatch.setattr(probe, "_tokens", {})
    issued: list = []

    class Endpoint:
        def post(self, url, data, auth, verify, timeout):
            issued.append(_jwt({"sub": "agent", "exp": int(now[0]) + 10}))

            class Answer:
                def raise_for_status(self):
                    pass

                def json(self):
                    return {"access_token": issued[-1], "expires_in": 3600}
            return Answer()

    conf = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.test/token",
            "sasl.oauthbearer.client.id": "agent", "sasl.oauthbearer.client.secret": "s"}
    settings = probe.probe_conf(conf)
    settings["oauth_cb"].__self__._session = Endpoint()
    assert settings["oauth_cb"]("") == (issued[0], 1_010.0)         # its exp, not an hour
    now[0] = 1_007.0
    assert settings["oauth_cb"]("")[0] == issued[0]
    now[0] = 1_008.5                                                  # 4/5 of its 10 s
    assert settings["oauth_cb"]("")[0] == issued[1]
    settings["error_cb"](KafkaError(KafkaError._TRANSPORT))           # unreachable: kept
    assert settings["oauth_cb"]("")[0] == issued[1]
    settings["error_cb"](KafkaError(KafkaError._AUTHENTICATION))      # refused: asked again
    assert settings["oauth_cb"]("")[0] == issued[2] and len(issued) == 3
    # A token that is no JWT keeps the endpoint's expires_in.
    assert probe._claimed_expiry("opaque-token") is None


def test_a_probe_with_oidc_settings_incomplete_is_librdkafkas_to_refuse(monkeypatch):
    """``sasl.oauthbearer.method = oidc`` set through librdkafka options without its endpoint
    (validate takes it: librdkafka says what lacks) reaches the probe's client as it is; the
    probe neither takes the token over nor fails on its own."""
    from agent.drain import probe

    monkeypatch.setattr(probe, "_tokens", {})
    conf = {"bootstrap.servers": "127.0.0.1:1", "sasl.oauthbearer.method": "oidc"}
    assert probe.probe_conf(conf) == conf


def test_the_probes_token_request_is_the_standard_librarys_against_a_real_endpoint():
    """The request itself (no HTTP client beside the agent's): a client credentials form with
    HTTP Basic credentials (as librdkafka sends them, unescaped) to a real server on 127.0.0.1;
    a refusal is an error naming the status."""
    import http.server
    import threading
    import urllib.parse

    from agent.drain import probe

    seen: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers["Authorization"], urllib.parse.parse_qs(body.decode())))
            ok = seen[-1][0] == "Basic " + base64.b64encode(b"agent:s&cret").decode()
            answer = json.dumps({"access_token": "t", "expires_in": 60} if ok
                                else {"error": "invalid_client"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/token"
    try:
        cache = probe.TokenCache({"sasl.oauthbearer.token.endpoint.url": url,
                                  "sasl.oauthbearer.client.id": "agent",
                                  "sasl.oauthbearer.client.secret": "s&cret",
                                  "sasl.oauthbearer.scope": "kafka"})
        assert cache.token("")[0] == "t"
        assert seen[0][1] == {"grant_type": ["client_credentials"], "scope": ["kafka"]}
        wrong = probe.TokenCache({"sasl.oauthbearer.token.endpoint.url": url,
                                  "sasl.oauthbearer.client.id": "agent",
                                  "sasl.oauthbearer.client.secret": "wrong"})
        with pytest.raises(RuntimeError, match="HTTP 401.*invalid_client"):
            wrong.token("")
    finally:
        server.shutdown()
        server.server_close()


def test_with_kerberos_one_probe_in_ten_seconds_runs_kinit_the_others_use_the_ticket_cached(
        monkeypatch):
    """Each new librdkafka client with GSSAPI runs kinit, asking the KDC: the probes of an
    outage (one a second) would ask once a second each. Per principal, one probe in
    ``KINIT_EVERY_S`` does; the others have librdkafka's refresh off."""
    from agent.drain import probe
    monkeypatch.setattr(probe, "_kinit_at", {})
    conf = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "GSSAPI", "sasl.kerberos.principal": "agent@EXAMPLE.COM",
            "sasl.kerberos.keytab": "/etc/docket/agent.keytab", "linger.ms": 5}
    other = {**conf, "sasl.kerberos.principal": "count@EXAMPLE.COM"}
    relogin = "sasl.kerberos.min.time.before.relogin"
    runs = [relogin not in probe.probe_conf(conf, now=t) for t in range(0, 25)]
    assert [t for t, ran in enumerate(runs) if ran] == [0, 10, 20]
    assert probe.probe_conf(conf, now=25)[relogin] == 0
    assert relogin not in probe.probe_conf(other, now=25)      # its own principal, its own
    assert "linger.ms" not in probe.probe_conf(conf, now=26)
    assert probe.probe_conf(conf, now=26)["sasl.kerberos.keytab"] == "/etc/docket/agent.keytab"
