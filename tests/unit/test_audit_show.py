"""``docket-audit show``: the reconciler's view from its database (``--db``: a real SQLite file
with audit records applied and windows evaluated, no Kafka), and the audit topic's view when
the cluster does not answer (a port on 127.0.0.1 that refuses connections)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from audit.cli import EXIT_UNAVAILABLE, main
from audit.reconcile.evaluate import evaluate
from audit.reconcile.store import Store
from docket_common.formats import window_label
from tests.unit.reconcilekit import MIN, W, cfg, count, lossy_window, progress

NOW = int(time.time() * 1000)
T0 = (NOW - 3 * 3_600_000) // W * W           # judged and final by now
EMPTY = T0 + W                                 # heartbeats only
OLD = T0 - 3 * 86_400_000                      # outside the default 24 hours


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "r.db"
    store = Store(path)
    at = T0 + W + MIN
    store.apply([
        *lossy_window(T0, at),                                          # 100 lost
        count("producer", 10, window=T0, at=at, topic="pay"),
        count("kafka-local", 12, distinct=10, window=T0, at=at, topic="pay"),   # 2 twice
        count("producer", 0, "web-1", window=EMPTY, at=EMPTY + W + MIN),
        count("producer", 0, "web-2", window=EMPTY, at=EMPTY + W + MIN),
        count("producer", 5, window=OLD, at=OLD + W + MIN),
        count("kafka-local", 5, window=OLD, at=OLD + W + MIN),
        progress(NOW - MIN)], {}, {("docket.audit", 0): 11}, "t")
    evaluate(store, cfg(), NOW)
    store.close()
    return path


def show(capsys, *args) -> list[str]:
    assert main(["show", *args]) == 0
    return [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]


def test_one_row_per_topic_and_window_with_the_tiers_side_by_side_and_a_verdict(db, capsys):
    assert show(capsys, "--db", str(db)) == [
        "app",
        "window producer kafka-local verdict",
        f"{window_label(T0)} 1500 (1500/0) 1400 (1400/0) incomplete 93.3% "
        "kafka-local: 100 missing from web-2",
        "",
        "pay",
        "window producer kafka-local verdict",
        f"{window_label(T0)} 10 (10/0) 12 (10/2) complete 100.0%; kafka-local: 2 duplicates",
    ]


def test_a_window_is_named_by_its_utc_start_to_the_minute():
    assert window_label(1_795_418_400_000) == "2026-11-23T07:20Z"
    assert window_label(1_795_418_405_000) == "2026-11-23T07:20:05Z"


def test_windows_every_tier_counted_zero_in_show_only_with_all(db, capsys):
    rows = show(capsys, "--db", str(db), "--topic", "app", "--all")
    assert rows[2].startswith(window_label(T0))
    assert rows[3] == f"{window_label(EMPTY)} 0 (0/0) 0 (0/0) complete 100.0%"
    assert len(rows) == 4


def test_since_and_topic_select_the_windows(db, capsys):
    rows = show(capsys, "--db", str(db), "--topic", "app", "--since", "4d")
    assert [r.split()[0] for r in rows[2:]] == [window_label(OLD), window_label(T0)]
    [line] = show(capsys, "--db", str(db), "--topic", "app", "--since", "1h")
    assert line.startswith("no windows of app since ")
    assert line.endswith("with counts (--all shows the empty ones)")


def test_json_gives_the_same_rows(db, capsys):
    assert main(["show", "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["topic"], r["window_start"]) for r in rows] == [("app", T0), ("pay", T0)]
    app = rows[0]
    assert [(t["tier"], t["count"], t["distinct"], t["state"], t["final"])
            for t in app["tiers"]] == [("producer", 1500, 1500, "complete", True),
                                       ("kafka-local", 1400, 1400, "incomplete", True)]
    v = app["verdict"]
    assert (v["state"], v["tier"], v["expected"], v["actual"]) == \
        ("incomplete", "kafka-local", 1500, 1400)
    assert v["origins"] == [{"origin": "web-2", "state": "incomplete", "missing": 100,
                             "reason": "100 missing"}]
    assert v["text"] == "incomplete 93.3% kafka-local: 100 missing from web-2"


def test_a_database_that_is_not_there_is_an_error_not_a_new_file(tmp_path, capsys):
    assert main(["show", "--db", str(tmp_path / "nope.db")]) != 0
    assert "no reconciler database at" in capsys.readouterr().err
    assert not (tmp_path / "nope.db").exists()


def test_since_and_all_need_the_database(capsys):
    assert main(["show", "--bootstrap-servers", "127.0.0.1:9", "--all"]) != 0
    assert "add --db FILE" in capsys.readouterr().err


def test_a_cluster_that_does_not_answer_is_one_error_line_and_a_hint_within_seconds(capfd):
    with socket.socket() as closed:                # bound, never listening: refuses connections
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        started = time.monotonic()
        rc = main(["show", "--bootstrap-servers", f"127.0.0.1:{port}"])
        took = time.monotonic() - started
    err = capfd.readouterr().err
    assert rc == EXIT_UNAVAILABLE and took < 20
    lines = err.splitlines()
    assert lines[0].startswith(f"docket-audit: no answer from the Kafka cluster at "
                               f"127.0.0.1:{port} within 5 s")
    assert lines[1].startswith("  hint: is it up")
    assert len(lines) == 2, err                    # no librdkafka lines
