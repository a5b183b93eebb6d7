"""The reconciler's ``/metrics``: a real SQLite file with audit records applied as the consumer
applies them and windows evaluated on a fake clock, served by the real HTTP server on
127.0.0.1 (a free port) and read with requests. No Kafka."""

from __future__ import annotations

import pytest
import requests

from audit.reconcile.config import parse
from audit.reconcile.metrics import METRICS, MetricsListenError, MetricsServer, render
from audit.reconcile.service import Reconciler
from docket_common.settings import ConfigError
from tests.alertkit import FakeClock
from tests.unit.reconcilekit import END, JUDGED, MIN, T0, W, cfg, count, progress

NOW = JUDGED + 1234                         # when /metrics is read


@pytest.fixture
def reconciler(tmp_path):
    clock = FakeClock(JUDGED)
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=clock)
    old = T0 - 6 * W                                     # final by now, complete
    rec.apply([count("producer", 1000), count("producer", 500, "web-2"),
               count("kafka-local", 995), count("kafka-local", 500, "web-2"),
               count("producer", 10, window=old), count("kafka-local", 10, window=old),
               progress(END + 5 * MIN)],
              {"not_json": (2, "0@7: not JSON")}, {("docket.audit", 0): 9})
    rec.evaluate_job()                                   # a loss of 5 at kafka-local, web-1
    clock.to(NOW)
    yield rec
    rec.close()


@pytest.fixture
def metrics(reconciler):
    server = MetricsServer("127.0.0.1:0", reconciler).start()
    yield f"http://127.0.0.1:{server.port}/metrics"
    server.stop()


def samples(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_metrics_are_read_from_the_database_and_the_reconciler_at_each_request(metrics,
                                                                                reconciler):
    got = requests.get(metrics, timeout=10)
    assert got.status_code == 200
    assert got.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    s = samples(got.text)
    assert s['reconcile_windows{tier="producer",state="complete",final="0"}'] == "1"
    assert s['reconcile_windows{tier="producer",state="complete",final="1"}'] == "1"
    assert s['reconcile_windows{tier="kafka-local",state="incomplete",final="0"}'] == "1"
    assert s['reconcile_windows{tier="kafka-local",state="complete",final="1"}'] == "1"
    assert s['reconcile_windows{tier="kafka-local",state="unknown",final="0"}'] == "0"
    assert sum(int(v) for k, v in s.items() if k.startswith("reconcile_windows{")) == 4
    assert s['reconcile_alerts_open{kind="loss",alert_class="data"}'] == "1"
    assert s['reconcile_alerts_open{kind="audit_lag",alert_class="health"}'] == "0"
    # now − the newest progress (END + 5 min) and − each origin's newest producer record
    assert s['reconcile_audit_lag_seconds{tier="kafka-local"}'] == "1501.235"
    assert s['reconcile_producer_last_seen_seconds{origin="web-1"}'] == "1741.235"
    assert s['reconcile_producer_last_seen_seconds{origin="web-2"}'] == "1741.235"
    assert s["reconcile_records_applied_total"] == "7"
    assert s['reconcile_records_malformed_total{reason="not_json"}'] == "2"
    assert s['reconcile_notifications{status="pending"}'] == "1"
    assert s['reconcile_notifications{status="delivered"}'] == "0"
    assert s["reconcile_last_evaluation_timestamp_seconds"] == "1763768400.001"   # not 1.76e9
    for name, (kind, _help) in METRICS.items():
        assert f"# TYPE {name} {kind}\n" in got.text

    reconciler.apply([count("kafka-local", 1000, seq=2)], {}, {("docket.audit", 0): 10})
    reconciler.clock.to(NOW + 1000)
    reconciler.evaluate_job()                            # late data: the loss resolves
    s = samples(requests.get(metrics, timeout=10).text)
    assert s["reconcile_records_applied_total"] == "8"
    assert s['reconcile_windows{tier="kafka-local",state="complete",final="0"}'] == "1"
    assert s['reconcile_windows{tier="kafka-local",state="incomplete",final="0"}'] == "0"
    assert s['reconcile_alerts_open{kind="loss",alert_class="data"}'] == "0"
    assert s['reconcile_notifications{status="pending"}'] == "2"
    assert s["reconcile_last_evaluation_timestamp_seconds"] == "1763768402.235"


def test_only_metrics_is_served(metrics):
    assert requests.get(metrics.replace("/metrics", "/status"), timeout=10).status_code == 404


def test_no_evaluation_yet_leaves_the_timestamp_out(tmp_path):
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=FakeClock(JUDGED))
    server = MetricsServer("127.0.0.1:0", rec).start()
    try:
        text = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.stop()
        rec.close()
    s = samples(text)
    assert s["reconcile_records_applied_total"] == "0"
    assert "reconcile_last_evaluation_timestamp_seconds" not in s
    assert "# TYPE reconcile_last_evaluation_timestamp_seconds gauge" in text


def test_label_values_are_escaped_and_values_printed_exactly():
    text = render({"reconcile_producer_last_seen_seconds": [
                       ({"origin": 'we"b\\2\nx'}, 0.1 + 0.2)],
                   "reconcile_records_applied_total": [({}, 12345678901)]})
    assert 'reconcile_producer_last_seen_seconds{origin="we\\"b\\\\2\\nx"} ' \
        '0.30000000000000004\n' in text
    assert "reconcile_records_applied_total 12345678901\n" in text


def test_a_port_in_use_is_an_error_that_says_where_to_change_it(reconciler):
    first = MetricsServer("127.0.0.1:0", reconciler)
    try:
        with pytest.raises(MetricsListenError, match="reconcile.listen") as err:
            MetricsServer(f"127.0.0.1:{first.port}", reconciler)
        assert "[reconcile] listen" in err.value.hint
    finally:
        first.stop()


@pytest.mark.parametrize("listen", ["9465", "localhost:http", "127.0.0.1:70000"])
def test_reconcile_listen_must_be_host_and_port(listen):
    with pytest.raises(ConfigError, match="reconcile.listen"):
        parse({"reconcile": {"listen": listen}})


def test_an_empty_reconcile_listen_turns_the_server_off():
    assert parse({"reconcile": {"listen": ""}})["reconcile.listen"] == ""
