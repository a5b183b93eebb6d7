"""The syslog source against a real sender nobody here wrote (util-linux ``logger``) and a real
Kafka: RFC 5424 and RFC 3164, newline-ended and octet-counted frames over TCP, datagrams over
UDP, TLS; every message once, its fields parsed; a UDP flood's drops counted exactly (what
arrived plus what the kernel dropped is what was sent); a full pool holding a TCP sender back;
a SIGKILL losing no message the agent had read."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, free_port, native_built, wait_until, write_config
from tests.kafkautil import read_all

pytestmark = pytest.mark.skipif(shutil.which("logger") is None,
                                reason="needs util-linux logger")
RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

# rsyslog as a relay: a file it tails (imfile) forwarded to the agent three ways (omfwd):
# RFC 5424 octet-counted over TCP, its forward format (RFC 3164 with an RFC 3339 time) ended
# by newlines over TCP, and its traditional format over UDP.
RELAY_CONF = """\
global(workDirectory="{work}")
module(load="imfile" mode="inotify")
ruleset(name="fwd") {{
    action(type="omfwd" target="127.0.0.1" port="{counted}" protocol="tcp"
           TCP_Framing="octet-counted" template="RSYSLOG_SyslogProtocol23Format")
    action(type="omfwd" target="127.0.0.1" port="{lines}" protocol="tcp"
           template="RSYSLOG_ForwardFormat")
    action(type="omfwd" target="127.0.0.1" port="{udp}" protocol="udp")
}}
input(type="imfile" File="{file}" Tag="relayed" ruleset="fwd" freshStartTail="off")
"""


def _logger(port: int, lines: list[str], *args: str) -> None:
    """``logger`` sending each of ``lines`` as one message to 127.0.0.1:``port``."""
    subprocess.run(["logger", "-n", "127.0.0.1", "-P", str(port), *args],
                   input="".join(f"{line}\n" for line in lines).encode(), check=True,
                   timeout=60)


def _ids(records, pattern=rb"id-(\d{6})") -> Counter:
    return Counter(int(m.group(1)) for r in records for m in [re.search(pattern, r.value())]
                   if m)


def test_logger_over_tcp_and_udp_every_message_once_with_its_fields(kafka, tmp_path,
                                                                     topic_name):
    tcp, raw, udp = (f"{topic_name}.{k}" for k in ("tcp", "raw", "udp"))
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=2) for t in (tcp, raw, udp)])
    ports = {k: free_port() for k in ("tcp", "raw", "udp")}
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "syslog", "listen": f"127.0.0.1:{ports['tcp']}", "topic": tcp,
         "key_field": "app"},
        {"type": "syslog", "listen": f"127.0.0.1:{ports['raw']}", "topic": raw,
         "format": "raw"},
        {"type": "syslog", "listen": f"127.0.0.1:{ports['udp']}", "protocol": "udp",
         "topic": udp, "receive_buffer_bytes": 4 << 20},
    ])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    n = 2_000
    try:
        # RFC 5424, newline-ended frames; RFC 3164 octet-counted; both on TCP
        _logger(ports["tcp"], [f"id-{i:06d} five" for i in range(n)], "-T", "-t", "billing",
                "--msgid", "PAY", "--sd-id", "zoo@123", "--sd-param", 'tiger="hungry"',
                "-p", "local3.err")
        _logger(ports["tcp"], [f"id-{i:06d} three" for i in range(n, 2 * n)], "-T",
                "--octet-count", "--rfc3164", "-t", "cron", "-i")
        _logger(ports["raw"], [f"id-{i:06d} raw" for i in range(n)], "-T", "--octet-count")
        # UDP, a pause every 200 datagrams so a loaded host's buffer keeps up (drops are
        # counted either way: what arrived plus what was dropped must be what was sent)
        for k in range(0, n, 200):
            _logger(ports["udp"], [f"id-{i:06d} udp" for i in range(k, k + 200)], "-d")
            time.sleep(0.05)
        sent = lambda: agent.metric("agent_drain_sent_events_total")       # noqa: E731
        udp_dropped = lambda: agent.metric("agent_source_udp_dropped_total")  # noqa: E731
        wait_until("every message sent", lambda: sent() + udp_dropped() >= 4 * n, 60,
                   agent)
        bad = agent.metric("agent_source_bad_input_total", kind="syslog_unparsable")
        dropped = udp_dropped()
        listeners = agent.status()["listeners"]
        text = subprocess.run([str(agent.binary), "status", "--url", f"http://{agent.listen}"],
                              capture_output=True, text=True, timeout=30).stdout
    finally:
        assert agent.stop() == 0
    records = read_all(kafka.bootstrap_servers, tcp)
    assert _ids(records) == Counter(range(2 * n)), "every TCP message exactly once"
    fields = [json.loads(r.value()) for r in records]
    five = next(f for f in fields if f["message"].endswith("five"))
    three = next(f for f in fields if f["message"].endswith("three"))
    assert (five["protocol"], five["facility"], five["severity"], five["app"], five["msgid"],
            five["peer"]) == ("rfc5424", "local3", "err", "billing", "PAY", "127.0.0.1")
    assert five["structured_data"]["zoo@123"] == {"tiger": "hungry"}
    assert (three["protocol"], three["app"], three["severity"]) == ("rfc3164", "cron", "notice")
    assert three["procid"].isdigit() and three["host"] == socket.gethostname().split(".")[0]
    assert {r.key() for r in records} == {b"billing", b"cron"}          # key_field = "app"
    raws = read_all(kafka.bootstrap_servers, raw)
    assert _ids(raws) == Counter(range(n))
    assert all(r.value().startswith(b"<13>1 ") and r.value().endswith(b" raw") for r in raws)
    got = _ids(read_all(kafka.bootstrap_servers, udp))
    assert max(got.values()) == 1 and set(got) <= set(range(n))
    assert len(got) + dropped == n, "what arrived and what was dropped: all that was sent"
    assert bad == 0
    assert [(x["protocol"], x["listen"], x["topic"]) for x in listeners] == [
        ("tcp", f"127.0.0.1:{ports['tcp']}", tcp), ("tcp", f"127.0.0.1:{ports['raw']}", raw),
        ("udp", f"127.0.0.1:{ports['udp']}", udp)]
    assert listeners[2]["udp_dropped"] == dropped and listeners[0]["connections"] == 0
    made = "native" if native_built() else "python"      # the JSON objects: same bytes either way
    assert [x.get("json") for x in listeners] == [made, None, made]
    assert f"syslog    udp 127.0.0.1:{ports['udp']} -> {udp}: {dropped:.0f} datagram(s)" in text


@pytest.mark.skipif(not os.path.exists(RSYSLOGD), reason="needs Debian's rsyslog")
def test_rsyslog_relaying_over_tcp_both_framings_and_udp(kafka, tmp_path, topic_name):
    topics = {k: f"{topic_name}.{k}" for k in ("counted", "lines", "udp")}
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=1) for t in topics.values()])
    ports = {k: free_port() for k in topics}
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "syslog", "listen": f"127.0.0.1:{ports[k]}", "topic": topics[k],
         "protocol": "udp" if k == "udp" else "tcp", "receive_buffer_bytes": 4 << 20}
        for k in topics])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    n = 3_000
    source = tmp_path / "app.log"
    source.write_text("".join(f"id-{i:06d} relayed by rsyslog\n" for i in range(n)))
    work = tmp_path / "relay"
    work.mkdir()
    (work / "rsyslog.conf").write_text(RELAY_CONF.format(work=work, file=source, **ports))
    relay = subprocess.Popen([RSYSLOGD, "-n", "-f", str(work / "rsyslog.conf"), "-i",
                              str(work / "rsyslogd.pid")], stdout=subprocess.DEVNULL,
                             stderr=open(work / "rsyslogd.out", "wb"))
    try:
        sent = lambda: agent.metric("agent_drain_sent_events_total")       # noqa: E731
        dropped = lambda: agent.metric("agent_source_udp_dropped_total")    # noqa: E731
        wait_until("every relayed message sent", lambda: sent() + dropped() >= 3 * n, 90,
                   agent)
        udp_dropped = dropped()
        bad = agent.metric("agent_source_bad_input_total", kind="syslog_unparsable")
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        assert agent.stop() == 0
    for k in ("counted", "lines"):
        records = read_all(kafka.bootstrap_servers, topics[k])
        assert _ids(records) == Counter(range(n)), f"{k}: every message once"
        fields = json.loads(records[0].value())
        assert fields["app"] == "relayed" and fields["message"].startswith("id-")
        assert fields["protocol"] == ("rfc5424" if k == "counted" else "rfc3164")
        assert fields["timestamp"] is not None
    got = _ids(read_all(kafka.bootstrap_servers, topics["udp"]))
    assert max(got.values()) == 1 and len(got) + udp_dropped == n
    assert bad == 0


def test_udp_at_a_low_rate_is_appended_at_once_not_held_for_a_batch(kafka, tmp_path,
                                                                    topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}", "protocol": "udp",
                            "topic": topic_name, "format": "raw"}])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(30):                          # 10 a second for 3 s
                s.sendto(b"<13>1 - h slow - - - id-%06d" % i, ("127.0.0.1", port))
                time.sleep(0.1)
                if i == 19:                              # mid-stream: no pause yet to end a
                    mid = agent.metric("agent_source_read_events_total")      # batch on
        assert mid >= 10, f"{mid} of 20 datagrams appended while they kept coming"
        read_soon = wait_until("30 datagrams appended", lambda: agent.metric(
            "agent_source_read_events_total") >= 30, 5, agent)
    finally:
        assert agent.stop() == 0
    assert read_soon
    assert _ids(read_all(kafka.bootstrap_servers, topic_name)) == Counter(range(30))


def test_a_udp_flood_drops_are_counted_exactly_and_journalled(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}", "protocol": "udp",
                            "topic": topic_name, "format": "raw",
                            "receive_buffer_bytes": 4096}])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    n = 20_000
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(n):                           # as fast as Python sends
                s.sendto(b"<13>1 - h flood - - - id-%06d " % i + b"x" * 150,
                         ("127.0.0.1", port))
            time.sleep(1)
            # A last datagram into an empty buffer carries the kernel's whole drop count.
            s.sendto(b"<13>1 - h flood - - - id-999999 last", ("127.0.0.1", port))
        wait_until("the last datagram sent", lambda: agent.metric(
            "agent_drain_sent_events_total") + agent.metric("agent_source_udp_dropped_total")
            >= n + 1, 60, agent)
        dropped = int(agent.metric("agent_source_udp_dropped_total"))
    finally:
        assert agent.stop() == 0
    got = _ids(read_all(kafka.bootstrap_servers, topic_name))
    assert got.pop(999999) == 1
    assert max(got.values()) == 1
    assert dropped > 0, "the flood should overrun a 4 KiB receive buffer"
    assert len(got) + dropped == n, f"arrived {len(got)} + dropped {dropped} != sent {n}"
    journal = [json.loads(line) for line in
               (tmp_path / "state" / "loss-journal.jsonl").read_text().splitlines()]
    assert sum(e["events"] for e in journal if e["reason"] == "udp_dropped") == dropped
    print(f"UDP flood: {n} sent, {len(got)} arrived, {dropped} dropped and counted")


def test_tls_listener_with_client_certificates(kafka, tmp_path, topic_name):
    """TLS with mutual authentication: a client with a certificate of the CA is read; one
    without is refused at the handshake and counted, and the listener goes on."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    pki = tmp_path / "pki"
    pki.mkdir()

    def run(*args):
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=test-ca")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-copy_extensions", "copy")
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}",
                            "topic": topic_name, "ssl_certificate_file": str(pki / "server.pem"),
                            "ssl_key_file": str(pki / "server.key"),
                            "ssl_ca_file": str(pki / "ca.pem")}])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    n = 500
    try:
        anonymous = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", port)) as raw_sock, \
                    anonymous.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
                s.sendall(b"<13>1 - h a - - - id-999999 anonymous\n")
                s.recv(1)                                # the refusal arrives here in TLS 1.3
        # openssl's own client, as a sender with a certificate
        wire = "".join(f"<14>1 - h tls - - - id-{i:06d} over tls\n" for i in range(n))
        subprocess.run(["openssl", "s_client", "-quiet", "-no_ign_eof",
                        "-connect", f"127.0.0.1:{port}", "-CAfile", str(pki / "ca.pem"),
                        "-cert", str(pki / "client.pem"), "-key", str(pki / "client.key")],
                       input=wire.encode(), check=False, capture_output=True, timeout=60)
        wait_until("the TLS messages sent",
                   lambda: agent.metric("agent_drain_sent_events_total") >= n, 60, agent)
        refused = agent.metric("agent_source_bad_input_total", kind="tls_refused")
    finally:
        assert agent.stop() == 0
    got = _ids(read_all(kafka.bootstrap_servers, topic_name))
    assert got == Counter(range(n)), "every message of the client with a certificate, once"
    assert refused == 1


@pytest.mark.slow
def test_a_full_pool_holds_a_tcp_sender_back_and_loses_nothing(kafka, tmp_path, topic_name):
    cluster = kafka.controlled()
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}", "format": "raw",
                            "topic": topic_name, "receive_buffer_bytes": 65536}],
                          buffer={"size_bytes": 4096 + 8192 + 4 * 65536,
                                  "slot_size_bytes": 65536})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    total = 40_000                                   # ~4.8 MB: far more than the 4 slots hold
    payload = b"".join(b"<13>1 - h a - - - id-%06d " % i + b"y" * 90 + b"\n"
                       for i in range(total))
    sent = {"bytes": 0}

    def client():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # small kernel buffers (loopback's grow to megabytes), so holding back shows
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
            s.connect(("127.0.0.1", port))
            for k in range(0, len(payload), 4096):
                s.sendall(payload[k:k + 4096])
                sent["bytes"] = k + 4096

    cluster.pause_node(1)
    try:
        t = threading.Thread(target=client, daemon=True)
        t.start()
        time.sleep(8)                                 # the pool fills; the sender must wait
        stuck_at = sent["bytes"]
        assert t.is_alive() and stuck_at < len(payload), "the sender should be held back"
        assert agent.status()["pool"]["free_slots"] == 0
    finally:
        cluster.resume_node(1)
    t.join(timeout=120)
    assert not t.is_alive()
    wait_until("every message sent",
               lambda: agent.metric("agent_drain_sent_events_total") >= total, 120, agent)
    assert agent.stop() == 0
    got = _ids(read_all(kafka.bootstrap_servers, topic_name))
    assert set(got) == set(range(total))
    print(f"syslog TCP sender held at {stuck_at} of {len(payload)} bytes while the pool was "
          f"full; {sum(got.values()) - total} duplicates after the outage")


@pytest.mark.slow
def test_sigkill_loses_nothing_the_agent_read(kafka, tmp_path, topic_name):
    """A syslog sender cannot be asked again, so what the agent read must survive its SIGKILL
    though no slot holding it was sealed. First 2,000 messages read whole into a slot that
    lingers (20 s, no early seal): the agent killed with all of them read and none sent — all
    arrive, once. Then a sender at ~1,000 messages/s over TCP, the agent SIGKILLed mid-stream
    and started again, the sender reconnecting: what is missing can only be what the kernel
    still held for the connection (a read is taken from it only once appended) — one run at
    the kill; every record that had a number arrived (the numbers run without a hole, one id
    each) and everything after the start arrived."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}", "format": "raw",
                            "topic": topic_name}],
                          buffer={"linger_ms": 20_000, "seal_when_idle": False,
                                  "seal_when_caught_up": False})
    agent = AgentProcess(config, tmp_path / "agent-1.log").start()
    held = 2_000
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join(b"<13>1 - h a - - - id-%06d\n" % i for i in range(held)))
    wait_until("every message read", lambda: agent.metric(
        "agent_source_read_events_total") == held, 30, agent)
    assert agent.metric("agent_drain_sent_events_total") == 0, "the slot should still fill"
    agent.kill()
    assert agent.proc.returncode == -9
    state = {"next": held, "stop": False, "reconnects": 0, "at_kill": None}

    def sender():
        while not state["stop"]:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    while not state["stop"]:
                        i = state["next"]
                        s.sendall(b"<13>1 - h a - - - id-%06d\n" % i)
                        state["next"] = i + 1
                        time.sleep(0.001)
            except OSError:
                state["reconnects"] += 1
                time.sleep(0.1)

    agent = AgentProcess(config, tmp_path / "agent-2.log").start()
    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        time.sleep(3)
        read_before = agent.metric("agent_source_read_events_total")
        state["at_kill"] = state["next"]
        agent.kill()
        assert agent.proc.returncode == -9
        time.sleep(1)
        agent = AgentProcess(config, tmp_path / "agent-3.log").start()
        wait_until("the sender back", lambda: state["next"] > state["at_kill"] + 1_000, 60,
                   agent)
        state["stop"] = True
        t.join(timeout=10)
        total = state["next"]
        assert agent.stop() == 0              # seals what lingers
    finally:
        state["stop"] = True
        if agent.alive():
            assert agent.stop() == 0
    ids: Counter = Counter()
    id_of: dict[int, int] = {}
    for r in read_all(kafka.bootstrap_servers, topic_name):
        m = re.search(rb"id-(\d{6})", r.value())
        i = int(m.group(1))
        ids[i] += 1
        n = int.from_bytes(dict(r.headers())["docket-seq"], "big")
        assert id_of.setdefault(n, i) == i, f"record number {n} stands for two ids"
    assert sorted(id_of) == list(range(len(id_of))), "a record that had a number is missing"
    assert [ids[i] for i in range(held)] == [1] * held, "the read, unsealed slot was not kept"
    log = (tmp_path / "agent-2.log").read_text()
    assert f"{held} record(s) of topic {topic_name} a listener had read" in log
    missing = sorted(set(range(total)) - set(ids))
    assert state["reconnects"] >= 1, "the kill should have cut the connection"
    if missing:                                       # one run, at the kill
        assert missing == list(range(missing[0], missing[-1] + 1)), missing[:20]
        assert missing[-1] < state["at_kill"] + 2_000 and missing[0] > state["at_kill"] - 2_000
    duplicates = sum(ids.values()) - len(ids)
    print(f"syslog TCP SIGKILL: {held} read and unsealed, all kept; then {total - held} sent, "
          f"{len(missing)} missing at the kill (ids {missing[:1]}..{missing[-1:]}; just before "
          f"it {read_before:.0f} read, {state['at_kill'] - held} sent), {duplicates} duplicates")


def test_routing_by_field_with_a_fallback_a_key_template_and_added_fields(kafka, tmp_path,
                                                                          topic_name):
    """``topic = "….{app}"``: each app's messages in a topic of its own, a message that names no
    app (not syslog at all) in the fallback topic, counted; the key from ``{host}/{app}``; the
    added fields in every message; and the agent's audit counts every topic it routed to."""
    base = topic_name.replace(".", "-")
    routed = {app: f"{base}.{app}" for app in ("billing", "cron")}
    fallback = f"{base}.other"
    ensure_topics(kafka.bootstrap_servers,
                  [TopicSpec(t, partitions=1) for t in (*routed.values(), fallback)])
    port = free_port()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}",
                            "topic": base + ".{app}", "fallback_topic": fallback,
                            "key": "{host}/{app}", "add_fields": {"dc": "eu1"},
                            "timestamp_field": "timestamp"}],
                          audit={"interval_ms": 1000})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    n = 300
    try:
        _logger(port, [f"id-{i:06d} pay" for i in range(n)], "-T", "-t", "billing")
        _logger(port, [f"id-{i:06d} job" for i in range(n, 2 * n)], "-T", "-t", "cron")
        with socket.create_connection(("127.0.0.1", port)) as s:      # no <PRI>: no app
            s.sendall(b"".join(b"id-%06d not syslog\n" % i for i in range(2 * n, 2 * n + 50)))
        wait_until("every message sent",
                   lambda: agent.metric("agent_drain_sent_events_total") >= 2 * n + 50, 60,
                   agent)
        fell_back = agent.metric("agent_source_bad_input_total", kind="routed_to_fallback")
        unmatched = agent.metric("agent_source_bad_input_total", kind="key_template_unmatched")
        time.sleep(2)                                    # an audit round past the last record
    finally:
        assert agent.stop() == 0
    host = socket.gethostname()
    for app, lo in (("billing", 0), ("cron", n)):
        records = read_all(kafka.bootstrap_servers, routed[app])
        assert _ids(records) == Counter(range(lo, lo + n))
        assert {r.key() for r in records} == {f"{host}/{app}".encode()}
        assert all(json.loads(r.value())["dc"] == "eu1" for r in records)
    other = read_all(kafka.bootstrap_servers, fallback)
    assert _ids(other) == Counter(range(2 * n, 2 * n + 50))
    assert {r.key() for r in other} == {None}
    assert other[0].timestamp()[1] > 0                  # the read time: no timestamp field
    assert json.loads(other[0].value())["parse_error"] == "no <PRI> at the start"
    assert fell_back == 50 and unmatched == 50
    from audit.contract.collect import read_audit_topic
    from tests.auditkit import tier_counts
    counted = tier_counts(read_audit_topic(kafka.bootstrap_servers, "docket.audit"), "producer",
                          {*routed.values(), fallback})
    per_topic = Counter()
    for (topic, _window, _origin), (count, _bytes, _checksum) in counted.items():
        per_topic[topic] += count
    assert per_topic == {routed["billing"]: n, routed["cron"]: n, fallback: 50}
