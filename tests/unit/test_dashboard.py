"""The audit dashboard in process (Starlette's test client, no socket) over a real SQLite
database filled by the reconciler's own ``Store.apply`` and ``evaluate``: the overview shows the
window with a loss in red, the window page names the losing host and its missing record numbers,
an alert is snoozed and resolved through CSRF-guarded forms, the JSON API answers, names from the
data are escaped, pages reference nothing outside this server, and the token guards every
request when set. Over a tier graph (producer → kafka-local → kafka-aggregate → warehouse, from
the reconciler's config): the overview colours any tier end to end or at its hop, the topic
page draws the producer against every tier in graph order, and the numbers shown are the
database's."""

from __future__ import annotations

import base64
import re
import sqlite3
import time
from contextlib import closing

import pytest
from starlette.testclient import TestClient

from audit.contract.record import Ranges
from audit.reconcile.config import load as load_config
from audit.reconcile.evaluate import evaluate
from audit.reconcile.store import Store
from dashboards.app import create_app
from dashboards.cli import main as dashboard_main
from docket_common.settings import ConfigError
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
    assert client.get("/api/tiers").json() == {      # no --config: what feeds it not known
        "tiers": ["producer", "kafka-local"], "fed_by": {"kafka-local": None},
        "hops": {"kafka-local": None}}
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


# -- the tier graph ----------------------------------------------------------------------------
# web-2 sent 500: kafka-local lost 50 of them, the mirror to kafka-aggregate 30 more; the
# warehouse and a tier named like a script (fed by the warehouse) hold what the aggregate holds.
GRAPH_TOML = f"""
[alerts]
default_channels = ["ops"]
silent_ms = 21600000

[channels.ops]
type = "webhook"
url = "http://127.0.0.1:9/x"

[tiers.kafka-local]
fed_by = ["producer"]

[tiers.kafka-aggregate]
fed_by = ["kafka-local"]

[tiers.warehouse]
fed_by = ["kafka-aggregate"]

[tiers."{EVIL}"]
fed_by = ["warehouse"]
"""
GRAPH = ["producer", "kafka-local", "kafka-aggregate", "warehouse", EVIL]
HELD = {"producer": 500, "kafka-local": 450, "kafka-aggregate": 420, "warehouse": 420, EVIL: 420}


@pytest.fixture
def graph(tmp_path):
    """(database, config) of a reconciler that judged one lossy window (``T0``) and one
    complete one over the graph ``GRAPH_TOML`` declares (no ``windows.tiers``: the order is
    the graph's, where names alone would put kafka-aggregate before kafka-local)."""
    config = tmp_path / "reconcile.toml"
    config.write_text(GRAPH_TOML)
    path = tmp_path / "g.db"
    store = Store(path)
    at = T0 + W + MIN
    store.apply([
        *(r for tier, n in HELD.items() for r in (
            count(tier, 1000, "web-1", window=T0, at=at), count(tier, n, "web-2", window=T0, at=at),
            count(tier, 100, "web-1", window=T0 + W, at=at + W))),
        *(progress(NOW - MIN, tier=t) for t in GRAPH[1:])], {}, {("docket.audit", 0): 9}, "t")
    evaluate(store, load_config(config), NOW)
    store.close()
    return path, config


def _stored(db, tier: str, window: int = T0) -> tuple:
    """(state, completeness, hop_completeness, missing) of ``tier``'s verdict on ``window``
    of topic app, as the reconciler stored it."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT state, completeness, hop_completeness, missing FROM windows "
                            "WHERE topic = 'app' AND window_start = ? AND tier = ?",
                            (window, tier)).fetchone()


def _shown(ratio: float) -> str:
    """A ratio as the pages show it: rounded down to a tenth of a percent."""
    return f"{int(ratio * 1000) / 10:.1f}%"


def _cell(html: str, window: int) -> tuple[str, str]:
    """(colour, text) of topic app's overview cell of ``window``."""
    row = re.search(r'<a href="/topic/app\?range=24h">app</a></th>(.*?)</tr>', html, re.S).group(1)
    state, text = re.search(r'<td class="cell state-([\w-]+)[^"]*" title="[^"]*">'
                            rf'<a href="/window/app/{window}">([^<]*)</a></td>', row).groups()
    return state, text.replace("&nbsp;", "").strip()


def test_the_reconcilers_graph_is_what_the_tables_hold(graph):
    """The scenario's numbers, as the reconciler stored them: the aggregate lost at its hop,
    the warehouse is complete at its hop and short end to end."""
    db, _config = graph
    assert _stored(db, "kafka-local") == ("incomplete", 1450 / 1500, 1450 / 1500, 50)
    assert _stored(db, "kafka-aggregate") == ("incomplete", 1420 / 1500, 1420 / 1450, 30)
    assert _stored(db, "warehouse") == ("complete", 1420 / 1500, 1.0, 0)
    assert _stored(db, EVIL) == ("complete", 1420 / 1500, 1.0, 0)


def test_api_tiers_lists_each_tier_in_graph_order_with_what_feeds_it(graph):
    db, config = graph
    tiers = TestClient(create_app(db, config=config), base_url="http://127.0.0.1").get(
        "/api/tiers").json()
    assert tiers == {
        "tiers": GRAPH,
        "fed_by": {"kafka-local": ["producer"], "kafka-aggregate": ["kafka-local"],
                   "warehouse": ["kafka-aggregate"], EVIL: ["warehouse"]},
        "hops": {"kafka-local": "producer → kafka-local",
                 "kafka-aggregate": "kafka-local → kafka-aggregate",
                 "warehouse": "kafka-aggregate → warehouse", EVIL: f"warehouse → {EVIL}"}}
    # Without the config the dashboard cannot know the graph, and does not pretend to.
    blind = TestClient(create_app(db), base_url="http://127.0.0.1").get("/api/tiers").json()
    assert blind["tiers"] == ["producer", EVIL, "kafka-aggregate", "kafka-local", "warehouse"]
    assert set(blind["fed_by"].values()) == {None} and set(blind["hops"].values()) == {None}


def test_two_data_centres_feeding_one_aggregate_name_the_hop_after_both(tmp_path):
    from dashboards.data import Graph

    g = Graph(("producer",), {"dc1": ("producer",), "dc2": ("producer",),
                              "aggregate": ("dc1", "dc2"), "warehouse": ("aggregate",)})
    arranged = g.arrange({"producer", "warehouse", "aggregate", "dc2", "dc1"})
    assert arranged["tiers"] == ["producer", "dc1", "dc2", "aggregate", "warehouse"]
    assert arranged["hops"]["aggregate"] == "dc1 + dc2 → aggregate"
    # a topic dc1 does not count: the aggregate's hop is dc1's own feeder's, as judged
    assert g.arrange({"producer", "dc2", "aggregate"})["fed_by"]["aggregate"] == \
        ["producer", "dc2"]


@pytest.mark.parametrize("tier", GRAPH[1:])
def test_the_overview_colours_any_tier_end_to_end_or_at_its_hop_with_the_stored_numbers(
        graph, tier):
    db, config = graph
    client = TestClient(create_app(db, config=config), base_url="http://127.0.0.1")
    state, whole, hop, missing = _stored(db, tier)
    end_to_end = client.get("/", params={"tier": tier}).text
    at_hop = client.get("/", params={"tier": tier, "measure": "hop"}).text
    # At its hop: the tier's verdict, and the percentage of what its feeding tiers hold.
    assert _cell(at_hop, T0) == (state, _shown(hop) if state == "incomplete" else "")
    # End to end: against what the producers accepted; complete at its hop yet short of that
    # is "lost upstream".
    assert _cell(end_to_end, T0) == ("upstream" if state == "complete" else state, _shown(whole))
    assert _cell(end_to_end, T0 + W) == _cell(at_hop, T0 + W) == ("complete", "")
    feeder = {"kafka-local": "producer", "kafka-aggregate": "kafka-local",
              "warehouse": "kafka-aggregate", EVIL: "warehouse"}[tier]
    label = f"{feeder} → {tier}".replace("<", "&lt;").replace(">", "&gt;")
    showing = re.search(r'<p class="showing" id="showing">(.*?)</p>', at_hop, re.S).group(1)
    assert label in showing
    assert f'<option value="hop" selected>hop completeness ({label})</option>' in at_hop
    options = re.findall(r'<option value="([^"]*)"[^>]*>[^<]*</option>',
                         re.search(r'<select name="tier">(.*?)</select>', at_hop, re.S).group(1))
    assert options == [t.replace("<", "&lt;").replace(">", "&gt;") for t in GRAPH]
    for html in (end_to_end, at_hop):
        assert EVIL not in html
        _no_outside_references(html)
    # "lost upstream" is told apart only where something upstream of the hop can lose
    assert ("lost upstream" in end_to_end) == (feeder != "producer")
    assert "lost upstream" not in at_hop


def test_the_overview_names_no_hop_it_does_not_know(graph):
    db, _config = graph
    html = TestClient(create_app(db), base_url="http://127.0.0.1").get(
        "/", params={"tier": "kafka-aggregate", "measure": "hop"}).text
    assert _cell(html, T0) == ("incomplete", "97.9%")       # the stored hop, all the same
    showing = re.search(r'<p class="showing" id="showing">(.*?)</p>', html, re.S).group(1)
    assert "what feeds kafka-aggregate is not known: start the dashboard with --config" in \
        showing and "→" not in showing
    assert '<option value="hop" selected>hop completeness (at its hop)</option>' in html


def test_api_completeness_gives_each_cells_hop_completeness(graph):
    db, config = graph
    client = TestClient(create_app(db, config=config), base_url="http://127.0.0.1")
    for tier in GRAPH:
        c = client.get("/api/completeness", params={"tier": tier}).json()
        cell = c["topics"]["app"][str(T0)]
        assert (cell["state"], cell["completeness"], cell["hop_completeness"],
                cell["missing"]) == _stored(db, tier)
        assert c["tiers"] == GRAPH and c["hops"]["kafka-aggregate"] == \
            "kafka-local → kafka-aggregate"


def test_the_topic_page_draws_the_producer_against_every_tier_in_graph_order(graph):
    db, config = graph
    client = TestClient(create_app(db, config=config), base_url="http://127.0.0.1")
    escaped = [t.replace("<", "&lt;").replace(">", "&gt;") for t in GRAPH]
    html = client.get("/topic/app").text
    assert EVIL not in html
    _no_outside_references(html)
    charts = re.findall(r'<figure class="correlation"><figcaption><strong>([^<]*)</strong> · '
                        r'([^<]*)</figcaption>\s*<div class="chart" data-chart="topic" '
                        r'data-topic="app" data-range="24h" data-tier="([^"]*)"></div>', html)
    assert [(t, tier) for t, _hop, tier in charts] == [(t, t) for t in escaped[1:]]
    assert [hop for _t, hop, _tier in charts] == [
        "producer → kafka-local", "kafka-local → kafka-aggregate",
        "kafka-aggregate → warehouse", f"warehouse → {escaped[-1]}"]
    head = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
    assert re.findall(r"<th>([^<]*)</th>", head) == ["window (UTC)", *escaped]
    row = re.search(rf'<a href="/window/app/{T0}">[^<]*</a></th>(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r'<td class="hop">([^<]*)</td>', row) == [
        _shown(_stored(db, t)[2]) for t in GRAPH[1:]]
    assert re.findall(r"<td class=\"hop\">([^<]*)</td>", row) == [
        "96.6%", "97.9%", "100.0%", "100.0%"]
    hist = client.get("/api/topic", params={"topic": "app"}).json()
    assert hist["tiers"] == GRAPH and hist["fed_by"]["warehouse"] == ["kafka-aggregate"]
    [lossy] = [w for w in hist["windows"] if w["window_start"] == T0]
    assert {t: lossy["tiers"][t]["distinct"] for t in GRAPH} == {
        t: 1000 + n for t, n in HELD.items()}


def test_the_window_page_names_each_tiers_hop(graph):
    db, config = graph
    html = TestClient(create_app(db, config=config), base_url="http://127.0.0.1").get(
        f"/window/app/{T0}").text
    tiers = re.search(r'<table class="tiers">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r"<tr class=\"state-[^\"]*\"><th>([^<]*)</th>.*?</tr>", tiers, re.S)
    assert rows == [t.replace("<", "&lt;").replace(">", "&gt;") for t in GRAPH]
    aggregate = re.search(r"<th>kafka-aggregate</th>(.*?)</tr>", tiers, re.S).group(1)
    assert "97.9%<br><small>kafka-local → kafka-aggregate</small>" in aggregate


def test_only_the_graph_is_read_from_the_reconcilers_config(db, tmp_path):
    """What else it holds (its channels, its Kafka credentials' files) is the reconciler's:
    the dashboard's service may not be able to read those files."""
    config = tmp_path / "reconcile.toml"
    config.write_text('[alerts]\ndefault_channels = ["nowhere"]\n\n'
                      '[tiers.kafka-local]\nfed_by = ["producer"]\n')
    with pytest.raises(ConfigError, match="'nowhere' is not defined"):
        load_config(config)                                # the reconciler would refuse it
    tiers = TestClient(create_app(db, config=config), base_url="http://127.0.0.1").get(
        "/api/tiers").json()
    assert tiers["hops"] == {"kafka-local": "producer → kafka-local"}


def test_a_wrong_reconciler_config_is_refused_with_its_key_path(db, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[tiers.a]\nfed_by = ["b"]\n[tiers.b]\nfed_by = ["a"]\n')
    assert dashboard_main(["--db", str(db), "--config", str(bad)]) == 78
    err = capsys.readouterr().err
    assert f"--config {bad}" in err and "tiers.a.fed_by" in err and "cycle" in err
