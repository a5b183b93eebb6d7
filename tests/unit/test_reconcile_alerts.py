"""The reconciler's alerts on a real SQLite file with a fake clock: audit records applied as
the consumer applies them, windows evaluated at chosen times, notifications read from the
outbox. No Kafka: what the consumer reads is what ``Store.apply`` is given."""

from __future__ import annotations

import json

from audit.contract.record import Ranges
from audit.reconcile.alerts.lifecycle import resolve_by_hand, snooze
from audit.reconcile.evaluate import evaluate
from audit.reconcile.store import Store
from tests.unit.reconcilekit import END, JUDGED, MIN, T0, W, cfg, count, progress


class Reconciler:
    def __init__(self, tmp_path, tiers=None, **alerts):
        self.store = Store(tmp_path / "r.db")
        self.cfg = cfg(tiers, **alerts)
        self.offset = 0

    def apply(self, *records):
        self.offset += len(records)
        self.store.apply(records, {}, {("docket.audit", 0): self.offset}, "t")

    def at(self, now):
        return evaluate(self.store, self.cfg, now)

    def alerts(self, status="open"):
        return [(r["kind"], r["tier"], r["origin"]) for r in self.store.db.query(
            "SELECT * FROM alerts WHERE status = ? ORDER BY id", (status,))]

    def members(self, kind, tier):
        """origin → (status, detail) of the members of the newest alert of (kind, tier)."""
        return {m["origin"]: (m["status"], json.loads(m["detail"])) for m in self.store.db.query(
            "SELECT m.* FROM alert_members m WHERE alert_id = (SELECT max(id) FROM alerts "
            "WHERE kind = ? AND tier = ?)", (kind, tier))}

    def sent(self):
        return [(json.loads(r["notification"])["event"], json.loads(r["notification"])["kind"])
                for r in self.store.db.query("SELECT * FROM alert_deliveries ORDER BY id")]


def test_a_loss_fires_once_names_the_missing_numbers_and_late_data_resolves_it(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 995), progress(END + 5 * MIN),
            Ranges.of(tier="kafka-local", origin="web-1", origin_incarnation="o",
                      emitter="kafka-local/count", seq=1, through=999, missing=[[10, 14]]))
    assert r.at(END + 1).fired == 0                       # pending: nothing yet
    assert r.at(JUDGED).fired == 1
    assert r.at(JUDGED + MIN).fired == 0                  # fires once
    [a] = r.store.db.query("SELECT * FROM alerts")
    detail = json.loads(a["detail"])
    assert (a["kind"], a["topic"], a["window_start"], a["tier"], a["origin"]) == \
        ("loss", "app", T0, "kafka-local", "web-1")
    assert (detail["expected"], detail["actual"], detail["missing"]) == (1000, 995, 5)
    assert detail["missing_ranges"] == [[10, 14]]
    assert detail["locate"] == ["docket-agent locate --seq 10-14"]
    r.apply(count("kafka-local", 1000, seq=2), progress(JUDGED + MIN, batch=2))
    assert r.at(JUDGED + 2 * MIN).resolved == 1
    assert r.sent() == [("firing", "loss"), ("resolved", "loss")]


def test_a_stopped_count_job_raises_audit_lag_and_leaves_windows_unknown_never_loss(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(progress(END - MIN), count("producer", 1000, at=END + MIN),
            count("kafka-local", 400, at=END - MIN))      # the job stopped mid-window
    r.at(END + 45 * MIN)
    assert r.alerts() == [("audit_lag", "kafka-local", None)]
    [state] = r.store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local'")
    assert state == ("unknown",)
    r.apply(count("kafka-local", 1000, seq=2, at=END + 46 * MIN),
            progress(END + 46 * MIN, batch=2))           # restarted: it catches up
    r.at(END + 47 * MIN)
    assert r.alerts() == [] and r.alerts("resolved") == [("audit_lag", "kafka-local", None)]


def test_duplicates_raise_duplication_not_loss(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 1040, distinct=1000),
            progress(END + 5 * MIN))
    r.at(JUDGED)
    assert r.alerts() == [("duplication", "kafka-local", "web-1")]


def test_equal_counts_with_other_content_raise_checksum_mismatch(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 1000, checksum=6),
            progress(END + 5 * MIN))
    r.at(JUDGED)
    assert r.alerts() == [("checksum_mismatch", "kafka-local", "web-1")]


def test_an_agent_that_stops_its_heartbeats_raises_silent_producer(tmp_path):
    r = Reconciler(tmp_path, silent_ms=30 * MIN)
    r.apply(count("producer", 10, "web-1", at=END), count("producer", 10, "web-2", at=END),
            count("kafka-local", 10, "web-1"), count("kafka-local", 10, "web-2"),
            progress(END + 5 * MIN))
    r.apply(count("producer", 0, "web-1", window=T0 + 4 * W,
                  at=END + 35 * MIN))                    # web-1's heartbeat; web-2 is quiet
    r.at(END + 35 * MIN)
    assert ("silent_producer", "producer", "web-2") in r.alerts()
    assert ("silent_producer", "producer", "web-1") not in r.alerts()


def test_host_clocks_skewed_by_five_minutes_raise_nothing(tmp_path):
    r = Reconciler(tmp_path)
    for skew in (-5 * MIN, 5 * MIN):                     # each agent's clock, either way
        origin = f"web{skew}"
        r.apply(count("producer", 500, origin, at=END + MIN + skew),
                count("kafka-local", 500, origin, at=END + 2 * MIN))
    for batch, now in enumerate((END + MIN, END + 20 * MIN, JUDGED, END + 2 * 3_600_000)):
        r.apply(progress(max(now - MIN, END + 10 * MIN), batch))   # the job keeps up
        r.at(now)
    assert r.alerts() == [] and r.alerts("resolved") == []


def test_a_loss_of_unknown_size_journalled_by_the_agent_raises_a_loss_though_counts_agree(
        tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 100, dropped_unknown={"deleted_unread": 1}),
            count("kafka-local", 100), progress(END + 5 * MIN))
    r.at(JUDGED)
    [a] = r.store.db.query("SELECT * FROM alerts")
    assert (a["kind"], a["tier"]) == ("loss", "producer")
    assert "possible loss of unknown size: 1 deleted_unread" in a["summary"]
    [(state,)] = r.store.conn.execute("SELECT state FROM windows WHERE tier = 'producer'")
    assert state == "incomplete"


def test_a_snoozed_alert_is_notified_only_when_its_snooze_ends_while_it_still_holds(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 990), progress(END + 5 * MIN))
    # a former alert of the same key was snoozed for an hour
    r.store.conn.execute("INSERT INTO alerts (key, kind, alert_class, status, summary, detail, "
                         "fired_at, resolved_at) VALUES (?, 'loss', 'data', 'resolved', '', "
                         "'{}', 0, 1)", (json.dumps(["loss", "app", T0, "kafka-local",
                                                     None]),))
    r.store.conn.commit()
    snooze(r.store, 1, JUDGED + 60 * MIN, "test", JUDGED - 1)
    r.at(JUDGED)
    assert r.alerts() == [("loss", "kafka-local", "web-1")] and r.sent() == []
    r.apply(progress(JUDGED + 60 * MIN, batch=2))
    r.at(JUDGED + 61 * MIN)
    assert r.sent() == [("firing", "loss")]


def test_an_alert_resolved_by_hand_does_not_fire_again_until_its_condition_cleared(tmp_path):
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 990), progress(END + 5 * MIN))
    r.at(JUDGED)
    [(alert_id,)] = r.store.conn.execute("SELECT id FROM alerts")
    resolve_by_hand(r.store, r.cfg, alert_id, "ops", JUDGED + 1)
    assert r.at(JUDGED + MIN).fired == 0
    r.apply(count("kafka-local", 1000, seq=2), progress(JUDGED + 2 * MIN, batch=2))
    r.at(JUDGED + 3 * MIN)                                 # cleared
    r.apply(count("kafka-local", 990, seq=3, distinct=990), progress(JUDGED + 4 * MIN, 3))
    assert r.at(JUDGED + 5 * MIN).fired == 1               # holds again: a new alert
    assert r.sent() == [("firing", "loss"), ("resolved", "loss"), ("firing", "loss")]


def test_a_loss_in_a_mirror_is_alerted_at_its_hop_with_the_numbers_lost_there(tmp_path):
    """kafka-local lost 10..14 (the agent's own tier's loss), the mirror to the aggregate lost
    100..119 more: the aggregate's alert names the hop and only the mirror's numbers."""
    r = Reconciler(tmp_path, {"kafka-local": {"fed_by": ["producer"]},
                              "aggregate": {"fed_by": ["kafka-local"]}})
    def ranges(tier, missing):
        return Ranges.of(tier=tier, origin="web-1", origin_incarnation="o",
                         emitter=f"{tier}/count", seq=1, through=999, missing=missing)
    r.apply(count("producer", 1000), count("kafka-local", 995), count("aggregate", 975),
            progress(END + 5 * MIN), progress(END + 5 * MIN, tier="aggregate"),
            ranges("kafka-local", [[10, 14]]), ranges("aggregate", [[10, 14], [100, 119]]))
    assert r.at(JUDGED).fired == 2
    alerts = {a["tier"]: a for a in r.store.db.query("SELECT * FROM alerts")}
    hop = json.loads(alerts["aggregate"]["detail"])
    assert (hop["hop"], hop["hop_expected"], hop["actual"], hop["missing"]) == \
        ("kafka-local → aggregate", 995, 975, 20)
    assert hop["missing_ranges"] == [[100, 119]] and hop["missing_ranges_total"] == 20
    assert "20 of 995 events missing at app window" in alerts["aggregate"]["summary"]
    assert "hop kafka-local → aggregate origin web-1" in alerts["aggregate"]["summary"]
    local = json.loads(alerts["kafka-local"]["detail"])
    assert (local["missing"], local["missing_ranges"]) == (5, [[10, 14]])
    assert "hop" not in local and "tier kafka-local" in alerts["kafka-local"]["summary"]


def test_with_two_data_centres_a_loss_is_located_to_the_mirror_that_held_the_origin(tmp_path):
    r = Reconciler(tmp_path, {"dc1": {"fed_by": ["producer"]}, "dc2": {"fed_by": ["producer"]},
                              "aggregate": {"fed_by": ["dc1", "dc2"]}})
    r.apply(count("producer", 1000, "web-1"), count("producer", 500, "web-2"),
            count("dc1", 1000, "web-1"), count("dc2", 500, "web-2"),
            count("aggregate", 1000, "web-1"), count("aggregate", 480, "web-2"),
            *(progress(END + 5 * MIN, tier=t) for t in ("dc1", "dc2", "aggregate")))
    r.at(JUDGED)
    assert r.alerts() == [("loss", "aggregate", "web-2")]
    [a] = r.store.db.query("SELECT * FROM alerts")
    detail = json.loads(a["detail"])
    assert (detail["hop"], detail["hop_expected"], detail["missing"]) == \
        ("dc2 → aggregate", 500, 20)
    states = {(t, o): s for t, o, s in r.store.conn.execute(
        "SELECT tier, origin, state FROM window_origins")}
    assert ("dc1", "web-2") not in states and ("dc2", "web-1") not in states  # not theirs
    assert {t: s for t, s in r.store.conn.execute("SELECT tier, state FROM windows")} == {
        "producer": "complete", "dc1": "complete", "dc2": "complete",
        "aggregate": "incomplete"}


def test_a_final_window_revised_to_unknown_is_judged_again_when_the_tier_catches_up(tmp_path):
    """A window final and complete gets a new origin's producer report (late, or through a
    mirror) that the tier has not read past: unknown. Nothing about the window changes when
    the tier's caught_up mark comes, yet it must be judged again then: here a loss."""
    from tests.unit.reconcilekit import caught_up
    r = Reconciler(tmp_path)
    late = JUDGED + 2 * 3_600_000                           # past the window's final_ms
    r.apply(count("producer", 1000), count("kafka-local", 1000),
            progress(END + 5 * MIN, marks=True), caught_up("web-1"))
    r.at(late)
    assert r.store.conn.execute("SELECT state, final FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("complete", 1)]
    r.apply(count("producer", 500, "web-2", at=late))
    r.at(late + MIN)
    assert r.store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("unknown",)]
    r.apply(caught_up("web-2"))                             # no count: web-2's records are lost
    r.at(late + 2 * MIN)
    assert r.store.conn.execute("SELECT state, final, revision FROM windows WHERE "
                                "tier = 'kafka-local'").fetchall() == [("incomplete", 1, 2)]
    assert ("loss", "kafka-local", "web-2") in r.alerts()   # (and audit_lag: hours later)


def test_an_origin_still_unknown_keeps_a_window_with_a_loss_from_being_final(tmp_path):
    """web-1's records are short at the tier (a loss: the tier is incomplete) while the tier's
    job has not read past web-2's report (unknown). The window must not become final for the
    loss, else nothing judges it again when the tier's mark for web-2 comes (it changes no
    count) and web-2's loss never fires (seen: a reconciler killed mid-stream between the
    marks of two origins, tests/faults/test_reconcile_kill.py)."""
    from tests.unit.reconcilekit import caught_up
    r = Reconciler(tmp_path)
    late = JUDGED + 2 * 3_600_000                           # past the window's final_ms
    r.apply(count("producer", 1000, "web-1"), count("kafka-local", 993, "web-1"),
            count("producer", 500, "web-2"), count("kafka-local", 493, "web-2"),
            progress(END + 5 * MIN, marks=True), caught_up("web-1"))
    r.at(late)
    assert [a for a in r.alerts() if a[0] == "loss"] == [("loss", "kafka-local", "web-1")]
    assert r.store.conn.execute("SELECT state, final FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("incomplete", 0)]
    r.apply(caught_up("web-2"))                             # no count: web-2's 7 are lost too
    r.at(late + MIN)                                        # it joins web-1's alert
    assert [a for a in r.alerts() if a[0] == "loss"] == [("loss", "kafka-local", "web-1")]
    members = r.members("loss", "kafka-local")
    assert {o: (status, d["missing"]) for o, (status, d) in members.items()} == {
        "web-1": ("holding", 7), "web-2": ("holding", 7)}
    assert r.store.conn.execute("SELECT state, final FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("incomplete", 1)]


def test_a_tiers_mark_that_came_through_a_mirror_counts_once_the_mirror_vouches_for_it(
        tmp_path):
    """On the aggregate, kafka-local's records arrive through the mirror in no order: its mark
    of batch 1 may be read before that batch's counts. Its mark counts only once the mirror's
    watcher says everything kafka-local/count wrote up to batch 1 was copied."""
    from audit.contract.record import CaughtUp
    from tests.unit.reconcilekit import caught_up

    def vouched(batch: int) -> CaughtUp:
        return CaughtUp(tier="mirror", emitter="mirror/local->aggregate", incarnation="w",
                        seq=batch + 1, source="kafka-local/count", source_incarnation="j",
                        source_seq=batch)
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 990),
            progress(END + 5 * MIN, marks=True), caught_up("web-1"), vouched(0))
    r.at(JUDGED)
    assert r.alerts() == []
    assert r.store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("unknown",)]
    r.apply(vouched(1))
    r.at(JUDGED + MIN)
    assert r.alerts() == [("loss", "kafka-local", "web-1")]


def test_an_origin_no_data_centre_holds_holds_the_window_back_until_one_reads_it(tmp_path):
    """web-3 reported 50 records that reached no cluster and that no data centre's job has
    read the reports of: every tier unknown (no tier complete, nothing final), and the window
    judged again until dc2's job reads web-3's reports: then a loss at dc2."""
    from tests.unit.reconcilekit import caught_up
    r = Reconciler(tmp_path, {"dc1": {"fed_by": ["producer"]}, "dc2": {"fed_by": ["producer"]},
                              "aggregate": {"fed_by": ["dc1", "dc2"]}})
    r.apply(count("producer", 100, "web-1"), count("producer", 60, "web-2"),
            count("producer", 50, "web-3"), count("dc1", 100, "web-1"),
            count("dc2", 60, "web-2"), count("aggregate", 100, "web-1"),
            count("aggregate", 60, "web-2"),
            *(progress(END + 5 * MIN, marks=True, tier=t) for t in ("dc1", "dc2", "aggregate")),
            caught_up("web-1", tier="dc1"), caught_up("web-2", tier="dc2"),
            *(caught_up(o, tier="aggregate") for o in ("web-1", "web-2", "web-3")))
    late = JUDGED + 2 * 3_600_000                           # past the window's final_ms
    r.at(late)
    assert {t: (s, f) for t, s, f in r.store.conn.execute(
        "SELECT tier, state, final FROM windows")} == {
        "producer": ("complete", 1), "dc1": ("unknown", 0), "dc2": ("unknown", 0),
        "aggregate": ("unknown", 0)}
    assert r.store.conn.execute("SELECT expected FROM windows WHERE tier = 'aggregate'"
                                ).fetchone() == (210,)
    assert [a for a in r.alerts() if a[0] != "audit_lag"] == []      # (hours later)
    r.apply(caught_up("web-3", tier="dc2"))                 # no count: lost in dc2
    r.at(late + MIN)
    assert {t: s for t, s in r.store.conn.execute("SELECT tier, state FROM windows")} == {
        "producer": "complete", "dc1": "complete", "dc2": "incomplete",
        "aggregate": "complete"}
    assert ("loss", "dc2", "web-3") in r.alerts()


def test_a_hops_duplication_alert_counts_only_the_copies_its_mirror_added(tmp_path):
    """kafka-local holds 100 copies an agent resent, the mirror copied them along and added 50:
    the aggregate's alert says 50 (its table keeps all 150); a mirror that added none raises
    nothing at the aggregate."""
    r = Reconciler(tmp_path, {"kafka-local": {"fed_by": ["producer"]},
                              "aggregate": {"fed_by": ["kafka-local"]}})
    r.apply(count("producer", 1000), count("kafka-local", 1100, distinct=1000),
            count("aggregate", 1150, distinct=1000), count("producer", 10, "web-2"),
            count("kafka-local", 12, "web-2", distinct=10),
            count("aggregate", 12, "web-2", distinct=10),
            progress(END + 5 * MIN), progress(END + 5 * MIN, tier="aggregate"))
    r.at(JUDGED)
    assert sorted(r.alerts(), key=str) == [("duplication", "aggregate", "web-1"),
                                           ("duplication", "kafka-local", None)]
    details = {a["tier"]: (a["summary"], json.loads(a["detail"]))
               for a in r.store.db.query("SELECT * FROM alerts")}
    summary, detail = details["aggregate"]
    assert (detail["extra"], detail["hop_duplicates"], detail["duplicates"]) == (50, 50, 150)
    assert summary.startswith("50 extra records at ")
    summary, detail = details["kafka-local"]           # one alert: both origins, web-1 worst
    assert (detail["origins"], detail["extra"], detail["worst_origin"]) == (2, 102, "web-1")
    assert summary == ("102 extra records from 2 origins at app window 2025-11-21T23:00:00Z "
                       "tier kafka-local (worst web-1: 100)")
    assert {o: d["extra"] for o, (_s, d) in r.members("duplication", "kafka-local").items()} \
        == {"web-1": 100, "web-2": 2}
    assert r.store.conn.execute("SELECT duplicates FROM windows WHERE tier = 'aggregate'"
                                ).fetchone() == (152,)


def test_a_mirrored_tiers_verdicts_hold_while_its_newest_mark_waits_for_the_watcher(tmp_path):
    """kafka-local's job marks batch 2 (it read web-1's next report) before the watcher has
    vouched for that batch: batch 1's mark, vouched for, still holds (the tier's verdicts
    went unknown each time its mark grew)."""
    from audit.contract.record import CaughtUp

    def mark(batch: int) -> CaughtUp:
        return CaughtUp(tier="kafka-local", emitter="kafka-local/count", incarnation="j",
                        seq=batch, source="web-1/agent", source_incarnation="i",
                        source_seq=batch)

    def vouched(batch: int) -> CaughtUp:
        return CaughtUp(tier="mirror", emitter="mirror/local->aggregate", incarnation="w",
                        seq=batch, source="kafka-local/count", source_incarnation="j",
                        source_seq=batch)
    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 990),
            progress(END + 5 * MIN, marks=True), mark(1), vouched(1))
    r.at(JUDGED)
    assert r.alerts() == [("loss", "kafka-local", "web-1")]
    r.apply(mark(2))
    r.at(JUDGED + MIN)
    assert r.store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local'"
                                ).fetchall() == [("incomplete",)]


def test_docket_audit_alerts_lists_what_the_dashboard_lists(tmp_path, capsys):
    """The command and the dashboard read the alerts through one function: the same alerts,
    the command oldest first, with their detail and deliveries in its JSON."""
    from audit.cli import main
    from dashboards import data

    r = Reconciler(tmp_path)
    r.apply(count("producer", 1000), count("kafka-local", 995), progress(END + 5 * MIN))
    r.apply(count("producer", 1000, window=T0 + W, seq=2, at=END + W + MIN),
            count("kafka-local", 990, window=T0 + W, seq=2, at=END + W + MIN),
            progress(END + W + 5 * MIN, batch=2))
    assert r.at(JUDGED + W).fired == 2
    r.store.close()
    assert main(["alerts", "--db", str(tmp_path / "r.db"), "--status", "open", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    shown = data.alerts(Store(tmp_path / "r.db"), "open", JUDGED + W)
    assert [a["id"] for a in listed] == sorted(a["id"] for a in shown) and len(listed) == 2
    assert [a["detail"]["missing"] for a in listed] == [5, 10]
    assert [a["deliveries"] for a in listed] == [a["deliveries"] for a in reversed(shown)]
    assert all(a["deliveries"] and a["snoozed_until"] is None for a in listed)
    assert main(["alerts", "--db", str(tmp_path / "r.db"), "--status", "resolved"]) == 0
    assert capsys.readouterr().out.strip() == "no resolved alerts"
