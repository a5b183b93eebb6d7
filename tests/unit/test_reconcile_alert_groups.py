"""Grouped alerts: one alert per (kind, topic, window, tier) however many origins its condition
holds for, and one ``silent_producer`` per window the producers went quiet in; each origin a
member with its own figures, joining and clearing while the alert is open. On a real SQLite file
with a fake clock, notifications read from the outbox (``test_reconcile_alerts.Reconciler``)."""

from __future__ import annotations

import json

from audit.contract.record import Ranges
from audit.reconcile.alerts.lifecycle import REPLACED, alerts_of_window, notification
from audit.reconcile.store import Store
from tests.unit.reconcilekit import END, JUDGED, MIN, T0, W, count, progress
from tests.unit.test_reconcile_alerts import Reconciler

HOSTS = [f"web-{i:03d}" for i in range(200)]


def partition_tail_lost(r: Reconciler, hosts: list[str], lost: dict[str, int]) -> None:
    """Every host sent 100 records of the window; the tier counted ``100 - lost[host]`` of
    each, the lost ones the last numbers of the host's run."""
    records = []
    for host in hosts:
        n = lost.get(host, 0)
        records += [count("producer", 100, host), count("kafka-local", 100 - n, host)]
        if n:
            records.append(Ranges.of(tier="kafka-local", origin=host, origin_incarnation="o",
                                     emitter="kafka-local/count", seq=1, through=99,
                                     missing=[[100 - n, 99]]))
    r.apply(*records, progress(END + 5 * MIN))


def firing(r: Reconciler) -> list[dict]:
    return [json.loads(d["notification"]) for d in r.store.db.query(
        "SELECT notification FROM alert_deliveries ORDER BY id")]


def test_a_partitions_tail_lost_for_two_hundred_hosts_is_one_alert_naming_them_all(tmp_path):
    r = Reconciler(tmp_path)
    lost = {host: 1 + i % 7 for i, host in enumerate(HOSTS)}
    lost["web-123"] = 40                                    # the worst
    partition_tail_lost(r, HOSTS, lost)
    assert r.at(JUDGED).fired == 1
    [a] = r.store.db.query("SELECT * FROM alerts")
    detail = json.loads(a["detail"])
    assert (a["kind"], a["tier"], a["origin"], a["window_start"]) == \
        ("loss", "kafka-local", None, T0)
    assert (detail["origins"], detail["missing"], detail["worst_origin"]) == \
        (200, sum(lost.values()), "web-123")
    assert detail["worst"]["missing_ranges"] == [[60, 99]]
    assert len(detail["members"]) == 20 and detail["members"][0] == "web-123"
    assert a["summary"] == (f"{sum(lost.values())} events missing from 200 origins at app "
                            "window 2025-11-21T23:00:00Z tier kafka-local (worst web-123: 40)")
    members = r.members("loss", "kafka-local")
    assert {o: d["missing"] for o, (_s, d) in members.items()} == lost
    assert members["web-007"][1]["locate"] == ["docket-agent locate --seq 99-99"]
    [sent] = firing(r)                                      # one notification, not 200
    n = notification(r.store, a["id"], "firing")
    assert n.headline() == "FIRING loss app 2025-11-21T23:00Z kafka-local 200 origins"
    assert sent["event"] == "firing" and sent["detail"]["origins"] == 200
    # the window's page lists every member, each with its own locate commands
    [listed] = alerts_of_window(r.store, "app", T0)
    assert len(listed["members"]) == 200
    assert listed["members"][0]["detail"]["locate"]


def test_members_clear_as_their_data_arrives_and_the_alert_resolves_with_the_last(tmp_path):
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2", "web-3"], {"web-1": 5, "web-2": 3, "web-3": 1})
    r.at(JUDGED)
    r.apply(count("kafka-local", 100, "web-1", seq=2), progress(JUDGED + MIN, batch=2))
    assert r.at(JUDGED + 2 * MIN).resolved == 0
    [a] = r.store.db.query("SELECT * FROM alerts")
    assert a["status"] == "open"
    assert (json.loads(a["detail"])["origins"], json.loads(a["detail"])["missing"]) == (2, 4)
    assert {o: s for o, (s, _d) in r.members("loss", "kafka-local").items()} == {
        "web-1": "cleared", "web-2": "holding", "web-3": "holding"}
    r.apply(count("kafka-local", 100, "web-2", seq=2), count("kafka-local", 100, "web-3", seq=2),
            progress(JUDGED + 3 * MIN, batch=3))
    assert r.at(JUDGED + 4 * MIN).resolved == 1
    assert r.sent() == [("firing", "loss"), ("resolved", "loss")]
    [a] = r.store.db.query("SELECT status, resolved_by FROM alerts")
    assert (a["status"], a["resolved_by"]) == ("resolved", "condition cleared")


def test_a_member_the_tier_cannot_judge_keeps_the_alert_open(tmp_path):
    """web-2 is lost at the tier and then unknown there (its report is newer than the tier's
    reading): neither a loss nor a recovery, so the alert stays open for it."""
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2"], {"web-1": 5, "web-2": 3})
    r.at(JUDGED)
    r.apply(count("kafka-local", 100, "web-1", seq=2),
            count("producer", 150, "web-2", seq=2, at=JUDGED + 2 * MIN),   # a newer report
            progress(JUDGED + MIN, batch=2))
    r.at(JUDGED + 2 * MIN)
    [a] = r.store.db.query("SELECT * FROM alerts")
    states = {o: s for o, (s, _d) in r.members("loss", "kafka-local").items()}
    assert (a["status"], states) == ("open", {"web-1": "cleared", "web-2": "holding"})


def test_a_loss_spreading_to_more_hosts_joins_the_open_alert_and_notifies_once(tmp_path):
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2"], {"web-1": 5})
    r.at(JUDGED)
    [a] = r.store.db.query("SELECT * FROM alerts")
    assert a["origin"] == "web-1" and json.loads(a["detail"])["origins"] == 1
    r.apply(count("kafka-local", 90, "web-2", seq=2), progress(JUDGED + MIN, batch=2))
    assert r.at(JUDGED + 2 * MIN).fired == 0
    [a] = r.store.db.query("SELECT * FROM alerts")
    assert json.loads(a["detail"])["origins"] == 2
    assert a["origin"] == "web-1"          # what it fired as: Alertmanager's labels stay put
    assert r.sent() == [("firing", "loss")]


def test_each_kind_and_tier_is_its_own_group(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 100, "web-1"), count("kafka-local", 90, "web-1"),
            count("producer", 100, "web-2"), count("kafka-local", 110, "web-2", distinct=100),
            count("producer", 100, "web-3"), count("kafka-local", 120, "web-3", distinct=100),
            count("producer", 100, "web-4", window=T0 + W),
            count("kafka-local", 99, "web-4", window=T0 + W),
            progress(END + W + 5 * MIN))
    r.at(JUDGED + W)
    assert sorted(r.alerts(), key=str) == [("duplication", "kafka-local", None),
                                           ("loss", "kafka-local", "web-1"),
                                           ("loss", "kafka-local", "web-4")]


def test_hosts_gone_quiet_in_one_window_are_one_silent_producer_alert(tmp_path):
    r = Reconciler(tmp_path, silent_ms=30 * MIN)
    quiet = [f"db-{i}" for i in range(40)]
    r.apply(*[count("producer", 10, h, at=END + i * 1000) for i, h in enumerate(quiet)],
            count("producer", 10, "late-1", at=END + W + MIN),       # a window later
            progress(END + 5 * MIN))
    heard = [count("producer", 0, "web-1", window=T0 + 6 * W, at=END + 5 * W)]
    r.apply(*heard)
    r.at(END + 5 * W)
    rows = r.store.db.query("SELECT * FROM alerts WHERE kind = 'silent_producer' AND "
                            "status = 'open'")
    silent = sorted(((a["window_start"], a["origin"], json.loads(a["detail"])["origins"])
                     for a in rows), key=str)
    assert silent == [(None, "late-1", 1), (None, None, 40)]
    assert [s for s in r.sent() if s[1] == "silent_producer"] == [("firing", "silent_producer")] * 2
    producers = r.store.open_health_kinds("producer")
    assert sorted(o for o, kind in producers if kind == "silent_producer") == \
        sorted(quiet + ["late-1"])
    # half of them speak again: they clear; the alert stays for the rest
    r.apply(*[count("producer", 0, h, window=T0 + 6 * W, seq=2, at=END + 5 * W + MIN)
              for h in quiet[:20]])
    r.at(END + 5 * W + MIN)
    assert r.store.conn.execute("SELECT count(*) FROM alerts WHERE kind = 'silent_producer' "
                                "AND status = 'resolved'").fetchone() == (0,)
    detail = json.loads(r.store.conn.execute(
        "SELECT detail FROM alerts WHERE origin IS NULL AND kind = 'silent_producer'"
    ).fetchone()[0])
    assert detail["origins"] == 20
    r.apply(*[count("producer", 0, h, window=T0 + 6 * W, seq=2, at=END + 5 * W + 2 * MIN)
              for h in quiet[20:]])
    r.at(END + 5 * W + 2 * MIN)
    assert r.store.conn.execute("SELECT origin FROM alerts WHERE kind = 'silent_producer' "
                                "AND status = 'resolved'").fetchall() == [(None,)]


def test_a_per_origin_alert_of_an_older_reconciler_is_replaced_by_a_grouped_one(tmp_path):
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2"], {"web-1": 5, "web-2": 2})
    old_key = json.dumps(["loss", "app", T0, "kafka-local", "web-1"])
    r.store.conn.execute(
        "INSERT INTO alerts (key, kind, alert_class, status, topic, window_start, window_ms, "
        "tier, origin, summary, detail, fired_at, notified) VALUES (?, 'loss', 'data', 'open', "
        "'app', ?, ?, 'kafka-local', 'web-1', 'old', '{}', 0, 1)", (old_key, T0, W))
    r.store.conn.commit()
    assert r.at(JUDGED).fired == 1 and r.at(JUDGED).resolved == 0
    rows = {a["origin"]: (a["status"], a["resolved_by"])
            for a in r.store.db.query("SELECT * FROM alerts")}
    assert rows == {"web-1": ("resolved", REPLACED), None: ("open", None)}
    assert sorted(r.sent()) == [("firing", "loss"), ("resolved", "loss")]


def test_a_layout_six_file_gets_the_members_table(tmp_path):
    store = Store(tmp_path / "r.db")
    store.conn.execute("DROP TABLE alert_members")
    store.conn.execute("PRAGMA user_version = 6")
    store.conn.commit()
    store.close()
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == 7
    assert store.holding_members(1) == {}


def test_the_window_page_lists_a_grouped_alerts_origins_with_their_locate_commands(tmp_path):
    from starlette.testclient import TestClient

    from dashboards.app import create_app
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2", "<b>web-3</b>"],
                        {"web-1": 5, "web-2": 3, "<b>web-3</b>": 1})
    r.at(JUDGED)
    r.store.close()
    html = TestClient(create_app(tmp_path / "r.db"), base_url="http://127.0.0.1").get(
        f"/window/app/{T0}").text
    alerts = html[html.index('id="window-alerts"'):]
    assert "9 events missing from 3 origins" in alerts
    for origin, first in (("web-1", 95), ("web-2", 97), ("&lt;b&gt;web-3&lt;/b&gt;", 99)):
        assert f"{origin} (holding)" in alerts
        assert f"docket-agent locate --seq {first}-99</code> <small>on {origin}</small>" \
            in alerts
    assert "<b>web-3" not in html


def test_a_small_fleets_day_raises_one_alert_per_kind_topic_window_and_tier(tmp_path):
    """The benchmarks' fleet (tests/bench/fleet.py) at a small size: every alert it must raise,
    no other, and its whole-partition loss one alert naming every writer."""
    from audit.reconcile.config import parse
    from audit.reconcile.evaluate import evaluate
    from tests.bench import fleet
    shape = fleet.Fleet(origins=300, topics=30, windows=8)
    store = Store(tmp_path / "r.db")
    store.apply(list(shape.records()), {}, {("docket.audit", 0): 1}, "t")
    cfg = parse({"channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/x"}},
                 "alerts": {"default_channels": ["ops"], "silent_ms": 6 * 3_600_000,
                            "lag_ms": 6 * 3_600_000},
                 "windows": {"tiers": fleet.TIERS}, "tiers": fleet.GRAPH})
    evaluate(store, cfg, fleet.T0 + (shape.windows + 6) * fleet.WINDOW_MS)
    want = shape.expected()
    got = dict(store.conn.execute("SELECT kind || ' ' || tier, count(*) FROM alerts "
                                  "GROUP BY kind, tier"))
    assert got == {"loss kafka-local": want["loss_alerts"],
                   "duplication aggregate": want["duplication_alerts"]}
    topic, window = shape.whole_loss
    [(detail,)] = store.conn.execute(
        "SELECT detail FROM alerts WHERE topic = ? AND window_start = ?",
        (f"fleet.t{topic:04d}", fleet.T0 + window * fleet.WINDOW_MS))
    assert json.loads(detail)["origins"] == want["whole_loss_origins"] == 50
    assert json.loads(detail)["missing"] == 50 * fleet.LOST


def test_a_windows_page_names_its_twenty_worst_origins_and_all_on_request(tmp_path):
    from starlette.testclient import TestClient

    from dashboards.app import create_app
    r = Reconciler(tmp_path)
    lost = {host: (i % 9) for i, host in enumerate(HOSTS)}         # 0 to 8 lost, some none
    partition_tail_lost(r, HOSTS, lost)
    r.at(JUDGED)
    r.store.close()
    client = TestClient(create_app(tmp_path / "r.db"), base_url="http://127.0.0.1")
    html = client.get(f"/window/app/{T0}").text
    table = html[html.index('id="origins"'):html.index("</table>", html.index('id="origins"'))]
    shown = [line.split("<th>")[1].split("<")[0] for line in table.splitlines()
             if line.strip().startswith("<tr><th>") and "origin</th>" not in line]
    worst = sorted(HOSTS, key=lambda h: (-lost[h], h))[:20]
    assert shown == worst                                  # the 20 worst, worst first
    not_complete = sum(1 for n in lost.values() if n)
    assert f"The 20 worst of 200 origins ({not_complete} not complete at every tier)" in html
    every = client.get(f"/window/app/{T0}?origins=all").text
    assert every.count("<tr><th>web-") == 200 and "All 200 origins, by name." in every


def test_a_group_resolved_by_hand_keeps_its_origins_out_not_a_new_origins_loss(tmp_path):
    from audit.reconcile.alerts.lifecycle import resolve_by_hand
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2", "web-3"], {"web-1": 5, "web-2": 3})
    r.at(JUDGED)
    [(first,)] = r.store.conn.execute("SELECT id FROM alerts")
    resolve_by_hand(r.store, r.cfg, first, "ops", JUDGED + 1)
    assert r.at(JUDGED + MIN).fired == 0                   # web-1 and web-2: resolved by hand
    r.apply(count("kafka-local", 90, "web-3", seq=2), progress(JUDGED + 2 * MIN, batch=2))
    assert r.at(JUDGED + 3 * MIN).fired == 1                # web-3's loss: an alert of its own
    [(second, origin)] = r.store.conn.execute(
        "SELECT id, origin FROM alerts WHERE status = 'open'")
    assert origin == "web-3" and set(r.members("loss", "kafka-local")) == {"web-3"}
    # web-2 unknown at the tier (a newer report it has not read), web-1 complete: web-1's
    # hand resolution ends, web-2's stays (an unknown state clears nothing)
    r.apply(count("kafka-local", 100, "web-1", seq=3),
            count("producer", 150, "web-2", seq=2, at=JUDGED + 4 * MIN),
            progress(JUDGED + 4 * MIN, batch=3))
    r.at(JUDGED + 5 * MIN)
    snoozed = {json.loads(k)[4] for (k,) in r.store.conn.execute("SELECT key FROM snoozes")}
    assert snoozed == {"web-2"}
    # web-2 judged again, still short: no alert (its condition never cleared)
    r.apply(progress(JUDGED + 6 * MIN, batch=4))
    r.apply(count("kafka-local", 145, "web-2", seq=4), progress(JUDGED + 7 * MIN, batch=5))
    assert r.at(JUDGED + 8 * MIN).fired == 0
    assert set(r.members("loss", "kafka-local")) == {"web-3"}
    assert second == r.store.conn.execute("SELECT max(id) FROM alerts").fetchone()[0]


def test_quiet_producers_resolved_by_hand_page_again_only_after_they_spoke(tmp_path):
    from audit.reconcile.alerts.lifecycle import resolve_by_hand
    r = Reconciler(tmp_path, silent_ms=30 * MIN)
    r.apply(count("producer", 10, "db-1", at=END), count("producer", 10, "db-2", at=END),
            progress(END + 5 * MIN))
    r.at(END + 35 * MIN)
    [(alert_id, summary)] = r.store.conn.execute(
        "SELECT id, summary FROM alerts WHERE kind = 'silent_producer'")
    members = r.store.holding_members(alert_id)
    r.at(END + 36 * MIN)                                    # still quiet: members unchanged
    assert r.store.holding_members(alert_id) == members
    resolve_by_hand(r.store, r.cfg, alert_id, "ops", END + 37 * MIN)
    assert r.at(END + 38 * MIN).fired == 0
    r.apply(count("producer", 0, "db-1", window=T0 + 4 * W, at=END + 39 * MIN),
            count("producer", 0, "db-2", window=T0 + 4 * W, at=END + 39 * MIN))
    r.at(END + 40 * MIN)                                    # they spoke: the snoozes end
    assert r.store.conn.execute("SELECT count(*) FROM snoozes").fetchone() == (0,)
    assert r.at(END + 80 * MIN).fired >= 1                  # quiet again: paged again
    assert [a for a in r.alerts() if a[0] == "silent_producer"] == \
        [("silent_producer", "producer", None)]


def test_a_group_left_with_another_origin_than_it_fired_for_says_so(tmp_path):
    r = Reconciler(tmp_path)
    partition_tail_lost(r, ["web-1", "web-2"], {"web-1": 5})
    r.at(JUDGED)
    r.apply(count("kafka-local", 100, "web-1", seq=2), count("kafka-local", 97, "web-2", seq=2),
            progress(JUDGED + MIN, batch=2))
    r.at(JUDGED + 2 * MIN)
    [a] = r.store.db.query("SELECT * FROM alerts")
    assert a["origin"] == "web-1"                           # as it fired: labels stay
    assert a["summary"] == ("3 events missing from 1 origin at app window "
                            "2025-11-21T23:00:00Z tier kafka-local (worst web-2: 3)")
    n = notification(r.store, a["id"], "firing")
    assert n.headline() == "FIRING loss app 2025-11-21T23:00Z kafka-local 1 origin"


def test_a_layout_six_file_loses_its_per_row_dirty_triggers(tmp_path):
    store = Store(tmp_path / "r.db")
    store.conn.executescript("""
        CREATE TRIGGER counts_dirty_insert AFTER INSERT ON counts BEGIN
            INSERT INTO dirty SELECT new.topic, new.window_start WHERE 0; END;
        CREATE TRIGGER counts_dirty_update AFTER UPDATE ON counts BEGIN
            INSERT INTO dirty SELECT new.topic, new.window_start WHERE 0; END;
        PRAGMA user_version = 6;""")
    store.close()
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND "
                              "name LIKE 'counts_dirty%'").fetchall() == []
    store.apply([count("producer", 10)], {}, {}, "t")
    assert store.conn.execute("SELECT count(*) FROM dirty").fetchone() == (1,)


def test_a_group_at_a_hop_names_the_hop_its_members_share():
    """A loss at a hop for several origins: the grouped alert's detail names the hop (what a
    receiver or the demo's drill matches on), as each member's does; members at different
    hops (of a tier fed by several) leave it to each member."""
    from audit.reconcile.alerts.lifecycle import group_text

    at = "app window 2025-11-21T23:00:00Z hop kafka-aggregate → warehouse"
    hop = "kafka-aggregate → warehouse"
    members = {o: (f"{n} of 100 events missing", {"missing": n, "hop": hop})
               for o, n in (("web-1", 5), ("web-2", 9))}
    summary, detail = group_text("loss", at, members, None)
    assert detail["hop"] == hop and detail["worst"]["hop"] == hop
    assert summary == f"14 events missing from 2 origins at {at} (worst web-2: 9)"
    members["web-1"][1]["hop"] = "dc2-local → warehouse"
    assert "hop" not in group_text("loss", at, members, None)[1]
    assert "hop" not in group_text("loss", at, {o: (s, {"missing": d["missing"]})
                                                for o, (s, d) in members.items()}, None)[1]
