"""The producer's librdkafka settings (``agent/drain/producer.py``): librdkafka's own linger is
shorter on the native send path, which hands a slot's records over in one native loop; a
setting in ``broker.librdkafka_options`` still decides."""

from __future__ import annotations

import pytest

from agent.config import parse
from agent.drain.producer import NATIVE_LINGER_MS, PRODUCER_LINGER_MS, producer_config


def _config(**broker):
    return parse({"broker": {"bootstrap_servers": "127.0.0.1:9092", **broker},
                  "sources": [{"type": "file", "paths": ["/tmp/*.log"], "topic": "app.events"}]})


@pytest.mark.parametrize("send_path, linger", [("python", PRODUCER_LINGER_MS),
                                               ("native", NATIVE_LINGER_MS)])
def test_librdkafkas_linger_by_send_path(send_path, linger):
    assert producer_config(_config(send_path=send_path))["linger.ms"] == linger
    assert NATIVE_LINGER_MS < PRODUCER_LINGER_MS


@pytest.mark.parametrize("send_path", ["python", "native"])
def test_a_linger_in_librdkafka_options_decides(send_path):
    cfg = _config(send_path=send_path, librdkafka_options={"linger.ms": 7})
    assert producer_config(cfg)["linger.ms"] == 7
