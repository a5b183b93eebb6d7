"""Alert delivery to real receivers on 127.0.0.1: an HTTP server (webhooks), an aiosmtpd SMTP
server (plain, and STARTTLS with AUTH on a certificate made for the test), and a real Prometheus
Alertmanager when its binary is installed. Back-off runs on a fake clock; every receiver binds
a port the OS chose and stops at the end of its test. No Kafka, no Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from datetime import datetime
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import sqlite_utils

from audit.reconcile.alerts import Dispatcher, Notification, channel_from_config, enqueue
from tests.alertkit import T0, FakeClock, attempts, notification, rows


@pytest.fixture
def db(tmp_path):
    return sqlite_utils.Database(tmp_path / "reconcile.db")


pytestmark = pytest.mark.timeout(60)


def wait_for(predicate, timeout_s: float = 10, what: str = "the condition"):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.05)
    return value


# -- an HTTP receiver ---------------------------------------------------------------------------


class HttpReceiver:
    """Records every POST and answers with the next status of ``answers`` (then 200). Bound at
    once, listening only after :meth:`listen`: until then, connections are refused."""

    def __init__(self, *answers: int):
        self.answers = list(answers)
        self.requests: list[tuple[str, dict, bytes]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests.append((self.path, dict(self.headers.items()), body))
                    status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                if 300 <= status < 400:
                    self.send_header("Location", "/moved/here")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.server_bind()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def listen(self) -> HttpReceiver:
        self.server.server_activate()
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread:
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()

    def bodies(self) -> list:
        return [json.loads(body) for _, _, body in self.requests]


@pytest.fixture
def receiver():
    made: list[HttpReceiver] = []

    def make(*answers: int, listening: bool = True) -> HttpReceiver:
        r = HttpReceiver(*answers)
        made.append(r)
        return r.listen() if listening else r

    yield make
    for r in made:
        r.stop()


def webhook(name, url, **more):
    return channel_from_config(name, {"type": "webhook", "url": url, **more})


def test_the_json_webhook_gets_the_notification_with_its_idempotency_key(db, receiver):
    hook = receiver()
    enqueue(db, notification(), ["ops"], T0)
    d = Dispatcher(db, {"ops": webhook("ops", hook.url + "/docket",
                                       headers={"Authorization": "Bearer t0ken"})},
                   clock=FakeClock())
    assert d.run_once().delivered == 1
    [(path, headers, body)] = hook.requests
    assert path == "/docket"
    assert headers["Idempotency-Key"] == "docket-12-firing-ops"
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer t0ken"
    sent = json.loads(body)
    assert sent["idempotency_key"] == "docket-12-firing-ops"
    assert Notification.from_json(sent) == notification()


def test_the_slack_webhook_gets_text_and_fields(db, receiver):
    hook = receiver()
    enqueue(db, notification(event="resolved"), ["chat"], T0)
    Dispatcher(db, {"chat": webhook("chat", hook.url, format="slack")},
               clock=FakeClock()).run_once()
    [body] = hook.bodies()
    assert body["text"] == ("RESOLVED loss app.events 2026-11-23T07:10Z kafka-local web-42: "
                            "1001 events missing at kafka-local")
    fields = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert fields["Origin"] == "web-42" and fields["expected"] == "12345"
    assert fields["Resolved at"] == "2026-11-23T07:35:00.000Z"
    assert hook.requests[0][1]["Idempotency-Key"] == "docket-12-resolved-chat"


def test_503_then_200_is_delivered_once_with_two_attempts_recorded(db, receiver, caplog):
    hook, clock = receiver(503), FakeClock()
    enqueue(db, notification(), ["ops"], clock.ms)
    secret = "/services/T000/B000/s3cretT0ken"
    d = Dispatcher(db, {"ops": webhook("ops", hook.url + secret)}, clock=clock)
    stats = d.run_once()
    assert stats.retrying == 1 and rows(db)[0]["last_error"].startswith(
        f"{hook.url}/… answered 503 Service Unavailable")
    assert "s3cret" not in rows(db)[0]["last_error"] + caplog.text     # the path is a secret
    clock.ms = stats.next_due_at
    assert d.run_once().delivered == 1
    assert d.run_once().attempted == 0
    assert [path for path, _, _ in hook.requests] == [secret, secret]
    assert [(a["ok"], a["error"] is None) for a in attempts(db)] == [(0, False), (1, True)]
    assert (rows(db)[0]["status"], rows(db)[0]["attempts"]) == ("delivered", 2)


def test_429_waits_at_least_its_retry_after(db, receiver):
    hook, clock = receiver(429), FakeClock()
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=clock, backoff_initial_ms=10,
                   backoff_max_ms=60_000)
    assert d.run_once().next_due_at == T0 + 1000


def test_a_receiver_down_for_a_while_then_up_gets_the_alert_exactly_once(db, receiver):
    hook, clock = receiver(listening=False), FakeClock()       # bound, not listening: refused
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=clock)
    for _ in range(3):
        stats = d.run_once()
        assert stats.retrying == 1
        clock.ms = stats.next_due_at
    assert "Connection refused" in rows(db)[0]["last_error"]
    hook.listen()
    assert d.run_once().delivered == 1
    clock.ms += 3_600_000
    assert d.run_once().attempted == 0
    assert len(hook.requests) == 1
    assert [a["ok"] for a in attempts(db)] == [0, 0, 0, 1]


def test_a_receiver_down_for_two_minutes_gets_every_alert_once_after_it_returns(db, receiver):
    """The delivery job's schedule (every 5 s) on a clock the test moves: ten alerts fire
    while the webhook refuses connections for two minutes; once it listens, each arrives once."""
    hook, clock = receiver(listening=False), FakeClock()
    for i in range(10):
        enqueue(db, notification(alert_id=100 + i), ["ops"], clock.ms + i * 1000)
    d = Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=clock)
    start = clock.ms
    while clock.ms < start + 120_000:
        d.run_once()
        clock.ms += 5_000
    assert hook.requests == [] and all(r["status"] == "pending" for r in rows(db))
    hook.listen()
    while clock.ms < start + 120_000 + 600_000 and \
            any(r["status"] == "pending" for r in rows(db)):
        d.run_once()
        clock.ms += 5_000
    ids = sorted(json.loads(body)["alert_id"] for _, _, body in hook.requests)
    assert ids == list(range(100, 110))                   # each once
    assert all(r["status"] == "delivered" for r in rows(db))


def test_400_gives_up(db, receiver):
    hook, clock = receiver(400), FakeClock()
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=clock)
    assert d.run_once().gave_up == 1
    clock.ms += 3_600_000
    assert d.run_once().attempted == 0
    [row] = rows(db)
    assert row["status"] == "gave_up" and "answered 400 Bad Request" in row["last_error"]


def test_a_redirect_gives_up_naming_the_new_address(db, receiver):
    hook = receiver(308)
    enqueue(db, notification(), ["ops"], T0)
    Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=FakeClock()).run_once()
    assert rows(db)[0]["status"] == "gave_up"
    assert f"(redirected to {hook.url}/…; configure the final address)" in \
        rows(db)[0]["last_error"]


def test_a_receiver_that_never_answers_costs_one_timeout_and_delays_no_other_channel(db,
                                                                                   receiver):
    hook = receiver()
    with socket.create_server(("127.0.0.1", 0)) as silent:       # accepts, never answers
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for alert_id in (1, 2, 3):
            enqueue(db, notification(alert_id=alert_id), ["slow", "ops"], T0)
        d = Dispatcher(db, {"slow": webhook("slow", silent_url, timeout_ms=300),
                            "ops": webhook("ops", hook.url)}, clock=FakeClock())
        stats = d.run_once()
    assert (stats.delivered, stats.retrying, stats.deferred) == (3, 1, 2)
    assert len(hook.requests) == 3
    assert "within 300 ms" in rows(db)[0]["last_error"]


def test_a_restarted_dispatcher_does_not_resend_delivered_rows(db, receiver, tmp_path):
    hook, clock = receiver(), FakeClock()
    for alert_id in (1, 2):
        enqueue(db, notification(alert_id=alert_id), ["ops"], clock.ms)
    Dispatcher(db, {"ops": webhook("ops", hook.url)}, clock=clock).run_once()
    db.close()
    enqueue(again := sqlite_utils.Database(tmp_path / "reconcile.db"),
            notification(alert_id=1), ["ops"], clock.ms)            # enqueued again: no-op
    clock.ms += 10**9
    stats = Dispatcher(again, {"ops": webhook("ops", hook.url)}, clock=clock).run_once()
    assert stats.attempted == 0
    assert [b["alert_id"] for b in hook.bodies()] == [1, 2]


# -- an SMTP receiver ---------------------------------------------------------------------------
try:
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword
except ImportError:                                   # the dev extra brings it
    Controller = None


class Mailbox:
    """aiosmtpd handler: keeps what it accepts; ``rcpt_answer``/``data_answers`` refuse."""

    def __init__(self):
        self.messages: list[dict] = []
        self.rcpt_answer: str | None = None
        self.data_answers: list[str] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.rcpt_answer:
            return self.rcpt_answer
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if self.data_answers:
            return self.data_answers.pop(0)
        self.messages.append({
            "from": envelope.mail_from, "to": list(envelope.rcpt_tos),
            "tls": session.ssl is not None,
            "login": session.auth_data.login if session.authenticated else None,
            "message": message_from_bytes(envelope.original_content, policy=default_policy)})
        return "250 Message accepted"


def _socket_controller(handler, **smtp):
    """aiosmtpd's threaded controller on a socket bound beforehand (port chosen by the OS)."""

    class SocketController(Controller):
        def __init__(self):
            self.sock = socket.create_server(("127.0.0.1", 0))
            super().__init__(handler, hostname="127.0.0.1", port=self.sock.getsockname()[1],
                             **smtp)

        def _create_server(self):
            return self.loop.create_server(self._factory_invoker, sock=self.sock)

    return SocketController()


@pytest.fixture
def smtp_server():
    if Controller is None:
        pytest.skip("aiosmtpd is not installed (pip install -e '.[dev]')")
    started = []

    def start(**smtp) -> tuple[Mailbox, int]:
        box = Mailbox()
        controller = _socket_controller(box, **smtp)
        controller.start()
        started.append(controller)
        return box, controller.port

    yield start
    for controller in started:
        controller.stop()


def email(port, **more):
    return channel_from_config("mail", {
        "type": "email", "host": "127.0.0.1", "port": port,
        "sender": "Docket <docket@example.com>",
        "recipients": ["data-team@example.com", "oncall@example.com"], **more})


def test_plain_smtp_gets_the_email_with_its_subject_and_details(db, smtp_server):
    box, port = smtp_server()
    enqueue(db, notification(), ["mail"], T0)
    enqueue(db, notification(event="resolved"), ["mail"], T0)
    assert Dispatcher(db, {"mail": email(port)}, clock=FakeClock()).run_once().delivered == 2
    firing, resolved = box.messages
    assert firing["to"] == ["data-team@example.com", "oncall@example.com"]
    msg = firing["message"]
    assert msg["Subject"] == "[docket] FIRING loss app.events 2026-11-23T07:10Z kafka-local web-42"
    assert msg["Message-ID"] == "<docket-12-firing-mail@example.com>"
    body = msg.get_content()
    for expected in ("expected: 12345", "missing: [[1000,1999],[5000,5000]]", "team-a",
                     "Idempotency key: docket-12-firing-mail"):
        assert expected in body
    assert resolved["message"]["Subject"].startswith("[docket] RESOLVED loss app.events")
    assert resolved["message"]["In-Reply-To"] == "<docket-12-firing-mail@example.com>"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1, made by the openssl command."""
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("the openssl command is needed to make a certificate for STARTTLS")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True, timeout=30)
    return d / "cert.pem", d / "key.pem"


def test_starttls_and_auth_deliver_and_a_wrong_password_gives_up(db, smtp_server, certificate):
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    def check(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=isinstance(auth_data, LoginPassword)
                          and (auth_data.login, auth_data.password) == (b"docket", b"s3cret"),
                          handled=False, auth_data=auth_data)      # aiosmtpd answers

    box, port = smtp_server(tls_context=server_tls, require_starttls=True,
                            authenticator=check, auth_require_tls=True)
    tls = dict(starttls=True, ca_file=str(cert), username="docket")
    enqueue(db, notification(alert_id=1), ["mail", "wrong"], T0)
    stats = Dispatcher(db, {"mail": email(port, password="s3cret", **tls),
                            "wrong": email(port, password="guess", **tls)},
                       clock=FakeClock()).run_once()
    assert (stats.delivered, stats.gave_up) == (1, 1)
    [got] = box.messages
    assert got["tls"] and got["login"] == b"docket"
    assert got["message"]["Subject"].startswith("[docket] FIRING loss app.events")
    assert "535" in rows(db)[1]["last_error"]


def test_starttls_refused_when_the_server_does_not_offer_it(db, smtp_server):
    box, port = smtp_server()
    enqueue(db, notification(), ["mail"], T0)
    Dispatcher(db, {"mail": email(port, starttls=True)}, clock=FakeClock()).run_once()
    assert rows(db)[0]["status"] == "gave_up" and "STARTTLS" in rows(db)[0]["last_error"]
    assert box.messages == []


def test_smtp_4xx_is_retried_and_5xx_gives_up(db, smtp_server):
    box, port = smtp_server()
    box.data_answers = ["451 4.3.0 try again later"]
    clock = FakeClock()
    enqueue(db, notification(alert_id=1), ["mail"], clock.ms)
    d = Dispatcher(db, {"mail": email(port)}, clock=clock)
    stats = d.run_once()
    assert stats.retrying == 1 and "451" in rows(db)[0]["last_error"]
    clock.ms = stats.next_due_at
    assert d.run_once().delivered == 1 and len(box.messages) == 1
    box.rcpt_answer = "550 5.1.1 no such user"
    enqueue(db, notification(alert_id=2), ["mail"], clock.ms)
    assert d.run_once().gave_up == 1
    assert "refused every recipient" in rows(db)[1]["last_error"]


def test_an_smtp_server_that_is_down_is_retried(db):
    with socket.socket() as bound:                   # bound, never listening: refused
        bound.bind(("127.0.0.1", 0))
        enqueue(db, notification(), ["mail"], T0)
        stats = Dispatcher(db, {"mail": email(bound.getsockname()[1])},
                           clock=FakeClock()).run_once()
    assert stats.retrying == 1 and "Connection refused" in rows(db)[0]["last_error"]


# -- a real Alertmanager ------------------------------------------------------------------------
ALERTMANAGER = (os.environ.get("DOCKET_ALERTMANAGER") or shutil.which("alertmanager")
                or shutil.which("prometheus-alertmanager"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path, receiver):
    """A real Alertmanager on 127.0.0.1 (no clustering, its own storage), routing every alert
    at once to a webhook receiver of the test. Yields (its URL, that receiver)."""
    if not ALERTMANAGER:
        pytest.skip("no Alertmanager binary (Debian: apt-get install --no-install-recommends "
                    "prometheus-alertmanager; or set DOCKET_ALERTMANAGER=/path/to/alertmanager)")
    hook = receiver()
    config = {
        "route": {"receiver": "test", "group_by": ["..."], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test", "webhook_configs": [
            {"url": f"{hook.url}/alertmanager", "send_resolved": True}]}],
    }
    (tmp_path / "alertmanager.yml").write_text(json.dumps(config))     # JSON is YAML
    port = free_port()
    cmd = [ALERTMANAGER, f"--config.file={tmp_path / 'alertmanager.yml'}",
           f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
           "--cluster.listen-address=", "--log.level=warn"]
    if setpriv := shutil.which("setpriv"):
        cmd = [setpriv, "--pdeathsig", "KILL", *cmd]                 # dies with pytest
    log = open(tmp_path / "alertmanager.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def ready():
        if proc.poll() is not None:
            raise AssertionError("alertmanager exited:\n" +
                                 (tmp_path / "alertmanager.log").read_text())
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(ready, 10, "alertmanager ready")
        yield url, hook
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_alertmanager_shows_the_firing_alert_with_its_labels_and_ends_it_when_resolved(
        db, alertmanager):
    url, hook = alertmanager
    # Times a minute or more in the past: the rows are due, and the resolution is in
    # Alertmanager's past, even if the wall clock steps back by up to a minute meanwhile.
    now = int(time.time() * 1000) - 60_000
    firing = notification(fired_at=now - 60_000, window_start=now - now % 600_000 - 600_000)
    resolved = notification(event="resolved", fired_at=firing.fired_at,
                            window_start=firing.window_start, resolved_at=now - 1000)
    am = channel_from_config("am", {"type": "alertmanager", "url": url,
                                    "firing_hold_ms": 3_600_000})
    enqueue(db, firing, ["am"], now)
    assert Dispatcher(db, {"am": am}).run_once().delivered == 1

    [shown] = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
    window = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(firing.window_start / 1000))
    assert shown["labels"] == {"alertname": "DocketLoss", "alert_class": "data",
                               "severity": "critical",
                               "topic": "app.events", "window": window, "tier": "kafka-local",
                               "origin": "web-42", "owner": "team-a"}
    assert shown["status"]["state"] == "active"
    assert shown["annotations"]["summary"] == firing.summary
    assert json.loads(shown["annotations"]["description"]) == firing.detail
    ends = datetime.fromisoformat(shown["endsAt"].replace("Z", "+00:00")).timestamp()
    assert ends > time.time() + 3000                     # held, not Alertmanager's 5 minutes
    notice = wait_for(lambda: [b for b in hook.bodies() if b["status"] == "firing"], 10,
                      "alertmanager's firing notification")
    assert notice[0]["alerts"][0]["labels"]["alertname"] == "DocketLoss"

    enqueue(db, resolved, ["am"], now)
    assert Dispatcher(db, {"am": am}).run_once().delivered == 1
    assert requests.get(f"{url}/api/v2/alerts", params={"active": "true"}, timeout=5).json() == []
    notice = wait_for(lambda: [b for b in hook.bodies() if b["status"] == "resolved"], 10,
                      "alertmanager's resolved notification")
    [alert] = notice[0]["alerts"]
    assert alert["labels"]["window"] == window
    assert alert["endsAt"].startswith(
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(resolved.resolved_at / 1000)))
