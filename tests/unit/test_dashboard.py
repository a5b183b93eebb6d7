"""The audit dashboard in process (Starlette's test client, no socket) over a real SQLite
database filled by the reconciler's own ``Store.apply`` and ``evaluate``: the overview shows the
window with a loss in red, the window page names the losing host and its missing record numbers,
an alert is snoozed and resolved through CSRF-guarded forms, the JSON API answers, names from the
data are escaped, pages reference nothing outside this server, and the token guards every
request when set."""

from __future__ import annotations

import base64
import re
import time

import pytest
from starlette.testclient import TestClient

from audit.contract.record import Ranges
from audit.reconcile.service import evaluate
from audit.reconcile.store import Store
from dashboards.app import create_app
from dashboards.cli import main as dashboard_main
from tests.unit.reconcilekit import MIN, W, cfg, count, lossy_window, progress

NOW = int(time.time() * 1000)
T0 = (NOW - 3 * 3_600_000) // W * W
EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "r.db"
    store = Store(path)
    at = T0 + W + MIN
    store.apply([
        *lossy_window(T0, at),                                          # 100 lost
        count("producer", 10, window=T0, at=at, topic=EVIL),
        count("kafka-local", 10, window=T0, at=at, topic=EVIL),
        Ranges(tier="kafka-local", origin="web-2", origin_incarnation="i",
               emitter="kafka-local/count", seq=1, through=499, missing=[[290, 399]],
               missing_total=110, emitted_at=at),
        # the producer journalled 290-299 as dropped: not a loss, not listed as missing
        Ranges(tier="producer", origin="web-2", origin_incarnation="i", emitter="web-2/agent",
               seq=1, through=499, missing=[[290, 299]], missing_total=10, emitted_at=at),
        progress(NOW - MIN)], {}, {("docket.audit", 0): 8}, "t")
    evaluate(store, cfg(), NOW)
    store.close()
    return path


@pytest.fixture
def client(db):
    return TestClient(create_app(db), base_url="http://127.0.0.1")


def _no_outside_references(html: str) -> None:
    assert not re.search(r'(src|href|action)="(https?:)?//', html), "a reference off this server"


def test_the_overview_shows_the_lossy_window_in_red_and_escapes_names(client):
    r = client.get("/?tier=kafka-local")
    assert r.status_code == 200
    html = r.text
    row = re.search(r'<a href="/topic/app\?range=24h">app</a></th>(.*?)</tr>', html, re.S)
    assert row and "state-incomplete" in row.group(1) and f"/window/app/{T0}" in row.group(1)
    assert "93.3%" in row.group(1)                     # 1400 of 1500, rounded down
    assert EVIL not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "open alert" in html and "web-2" in html
    _no_outside_references(html)
    assert "default-src 'self'" in r.headers["content-security-policy"]


def test_the_window_page_names_the_host_its_missing_numbers_and_how_to_locate_them(client):
    html = client.get(f"/window/app/{T0}").text
    origin = re.search(r"<tr><th>web-2</th>(.*?)</tr>", html, re.S).group(1)
    assert "−100" in origin and "300–399" in origin and "290" not in origin
    assert "docket-agent locate --config /etc/docket/agent.toml --seq 300-399" in origin
    tiers = re.search(r'<table class="tiers">(.*?)</table>', html, re.S).group(1)
    assert "through its hop" in tiers
    _no_outside_references(html)
    assert client.get(f"/window/app/{T0 + W * 100}").status_code == 200     # nothing there
    assert "no verdict" in client.get(f"/window/app/{T0 + W * 100}").text


def test_every_page_renders_without_outside_references(client):
    for path in ("/", "/alerts", "/alerts?status=all", "/health", "/topic/app",
                 f"/topic/{EVIL}", "/static/docket.css", "/static/docket.js"):
        r = client.get(path)
        assert r.status_code == 200, path
        assert EVIL not in r.text, path
        _no_outside_references(r.text)


def test_an_alert_is_snoozed_and_resolved_only_with_the_csrf_token(client, db):
    page = client.get("/alerts").text
    alert_id = int(re.search(r'id="alert-(\d+)"', page).group(1))
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    refused = client.post(f"/alerts/{alert_id}/snooze", data={"for": "1h"})
    assert refused.status_code == 403
    r = client.post(f"/alerts/{alert_id}/snooze", data={"for": "4h", "csrf": token},
                    follow_redirects=False)
    assert r.status_code == 303
    assert f"alert {alert_id} snoozed" in client.get(r.headers["location"]).text
    snoozed = client.get("/api/alerts?status=snoozed").json()["alerts"]
    assert [a["id"] for a in snoozed] == [alert_id] and snoozed[0]["snoozed_by"] == "dashboard"
    assert snoozed[0]["snoozed_until"] > NOW + 3 * 3_600_000
    client.post(f"/alerts/{alert_id}/resolve", data={"csrf": token})
    resolved = client.get("/api/alerts?status=resolved").json()["alerts"]
    assert [a["id"] for a in resolved] == [alert_id]
    assert client.post("/alerts/999/resolve", data={"csrf": token}).status_code == 404


def test_the_api(client):
    c = client.get("/api/completeness?tier=kafka-local").json()
    assert c["tier"] == "kafka-local" and set(c["topics"]) == {"app", EVIL}
    assert c["topics"]["app"][str(T0)]["state"] == "incomplete"
    assert client.get("/api/tiers").json() == {"tiers": ["producer", "kafka-local"]}
    paged = client.get("/api/completeness?tier=kafka-local&per_page=1&page=1").json()
    assert paged["topics_total"] == 2 and list(paged["topics"]) == ["app"]   # sorted: "<" first
    assert paged["totals"] == c["totals"]                  # totals over every topic
    w = client.get(f"/api/window?topic=app&start={T0}").json()
    assert w["origins"]["web-2"]["kafka-local"]["missing"] == 100
    # web-1 has exactly what its producer accepted: no row of its own, its producer's figures
    assert w["origins"]["web-1"]["kafka-local"] == {
        "state": "complete", "expected": 1000, "count": 1000, "distinct": 1000,
        "duplicates": 0, "missing": 0, "checksum": "match", "reason": ""}
    assert w["origins"]["web-2"]["producer"]["count"] == 500
    assert w["missing_ranges"]["web-2"]["kafka-local"]["ranges"] == [[300, 399]]
    assert client.get(f"/api/window?topic=app&start={10**20}").status_code == 400
    assert client.get(f"/window/app/{10**20}").status_code == 200           # "nothing here"
    mark = client.get("/api/watermark?topic=app&tier=kafka-local").json()
    assert mark["watermark_ms"] is None                  # its only window is incomplete
    assert client.get(f"/api/watermark?topic={EVIL}&tier=kafka-local").json()[
        "watermark_ms"] == T0 + W
    health = client.get("/api/health").json()["tiers"]
    assert [t["tier"] for t in health] == ["producer", "kafka-local"]
    for bad in ("/api/alerts?status=bogus", "/api/watermark?topic=app", "/api/window?topic=x",
                "/api/topic"):
        r = client.get(bad)
        assert r.status_code == 400 and "error" in r.json(), bad


def test_a_host_name_other_than_loopback_is_refused_without_a_token(db):
    """A page elsewhere whose name was rebound to 127.0.0.1 sends its own Host header."""
    client = TestClient(create_app(db), base_url="http://attacker.example")
    assert client.get("/alerts").status_code == 400
    assert TestClient(create_app(db), base_url="http://localhost:8642").get("/").status_code \
        == 200


def test_a_snooze_shows_only_while_it_runs(db):
    client = TestClient(create_app(db), base_url="http://127.0.0.1")
    page = client.get("/alerts").text
    alert_id = int(re.search(r'id="alert-(\d+)"', page).group(1))
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    client.post(f"/alerts/{alert_id}/snooze", data={"for": "1h", "csrf": token})
    later = TestClient(create_app(db, clock=lambda: (NOW + 2 * 3_600_000) / 1000),
                       base_url="http://127.0.0.1")
    assert later.get("/api/alerts?status=snoozed").json()["alerts"] == []
    assert later.get("/api/alerts?status=open").json()["alerts"][0]["snoozed_until"] is None


def test_the_token_guards_every_request(db):
    client = TestClient(create_app(db, token="s3cret-token-0123456789"),
                        base_url="http://anywhere.example")
    assert client.get("/").status_code == 401
    assert client.get("/api/tiers").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/tiers", headers={
        "Authorization": "Bearer s3cret-token-0123456789"}).status_code == 200
    basic = base64.b64encode(b"anyone:s3cret-token-0123456789").decode()
    assert client.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200


def test_the_token_guards_websockets_too():
    """No page uses one; a WebSocket scope without the token is closed before the app sees it."""
    import asyncio

    from dashboards.app import _TokenAuth

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    async def send(message):
        sent.append(message)

    guard = _TokenAuth(app, "s3cret-token-0123456789")
    asyncio.run(guard({"type": "websocket", "headers": []}, None, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    asyncio.run(guard({"type": "websocket", "headers": [
        (b"authorization", b"Bearer s3cret-token-0123456789")]}, None, send))
    asyncio.run(guard({"type": "lifespan"}, None, send))
    assert reached == ["websocket", "lifespan"]


def test_a_reachable_address_without_a_token_is_refused(db, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DOCKET_DASHBOARD_TOKEN", raising=False)
    assert dashboard_main(["--db", str(db), "--listen", "0.0.0.0:8642"]) == 78
    assert "no token is set" in capsys.readouterr().err
    assert dashboard_main(["--db", str(tmp_path / "none.db")]) == 78
    assert dashboard_main(["--db", str(db), "--listen", "nonsense"]) == 78
    short = tmp_path / "t"
    short.write_text("short")
    assert dashboard_main(["--db", str(db), "--token-file", str(short)]) == 78
    assert "shorter than 16" in capsys.readouterr().err
    monkeypatch.setenv("DOCKET_DASHBOARD_TOKEN", "short")
    assert dashboard_main(["--db", str(db)]) == 78
    for listen in ("[::]:8642", ":8642", "example.org:8642"):
        monkeypatch.delenv("DOCKET_DASHBOARD_TOKEN")
        assert dashboard_main(["--db", str(db), "--listen", listen]) == 78, listen
        assert "no token is set" in capsys.readouterr().err
        monkeypatch.setenv("DOCKET_DASHBOARD_TOKEN", "short")


def test_the_vendored_libraries_are_the_pinned_npm_files_and_the_pages_load_them(client):
    from dashboards import vendor

    listed = vendor.manifest()
    assert {n: p["version"] for n, p in listed["packages"].items()} == \
        {n: v[0] for n, v in vendor.PINS.items()}
    for name, digest in listed["files"].items():
        assert vendor.sha256(vendor.VENDOR / name) == digest, f"{name} differs from npm's"
    html = client.get("/?tier=kafka-local").text
    for script in ("htmx.org/htmx.min.js", "uplot/uPlot.iife.min.js"):
        assert f'src="/static/vendor/{script}"' in html
        assert client.get(f"/static/vendor/{script}").status_code == 200


def test_the_health_page_shows_each_hosts_clock_offset_as_a_fact(tmp_path):
    """Producers on the health page: when their counts last arrived and how far their clocks
    are from the broker's; a host 10 minutes ahead carries its open ``clock_skew`` (never a
    loss), one measured on time none, one never measured a dash."""
    path = tmp_path / "r.db"
    store = Store(path)
    at = NOW - MIN
    records = [count("producer", 10, origin, window=T0, at=at + skew)
               for origin, skew in (("ahead", 600_000), ("true", 0), ("unmeasured", 0))]
    for r in records:
        r.arrived_at = at
    store.apply(records, {}, {("docket.audit", 0): 3}, "t",
                clock_offsets={"ahead": (at, 600_000), "true": (at, 40)})
    evaluate(store, cfg(), NOW)
    store.close()
    client = TestClient(create_app(path), base_url="http://127.0.0.1")
    hosts = {h["origin"]: h for h in client.get("/api/health").json()["producers"]}
    assert {o: (h["clock_offset_s"], h["alerts"]) for o, h in hosts.items()} == {
        "ahead": (600.0, ["clock_skew"]), "true": (0.0, []), "unmeasured": (None, [])}
    assert all(h["last_seen_s"] >= 59 for h in hosts.values())    # arrived a minute before
    html = client.get("/health").text
    row = re.search(r"<th>ahead</th>(.*?)</tr>", html, re.S).group(1)
    assert "+600.0 s" in row and "clock_skew" in row
    assert re.search(r"<th>unmeasured</th><td>[^<]*</td><td>–</td>", html)
