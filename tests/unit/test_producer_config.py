"""The send path an agent runs (``broker.send_path``, ``agent/drain/native.py``) and the
producer's librdkafka settings (``agent/drain/producer.py``): ``auto`` is the native path where
the extension is installed and the Python path where it is not or with exactly once; an
explicit path is kept, ``native`` with exactly once is refused, and so is ``native`` without
the extension (``docket-agent validate``). librdkafka's own linger is
shorter on the native path, which hands a slot's records over in one native loop; a setting in
``broker.librdkafka_options`` still decides."""

from __future__ import annotations

import sys

import pytest

from agent.config import ConfigError, parse
from agent.drain.native import choose_send_path, extension_installed
from agent.drain.producer import NATIVE_LINGER_MS, PRODUCER_LINGER_MS, producer_config
from agent.preflight import check_producer, check_send_path, send_path


def _config(**broker):
    return parse({"broker": {"bootstrap_servers": "127.0.0.1:9092", **broker},
                  "sources": [{"type": "file", "paths": ["/tmp/*.log"], "topic": "app.events"}]})


def test_the_default_is_auto():
    assert _config()["broker.send_path"] == "auto"


@pytest.mark.parametrize("setting, installed, path", [
    ("auto", True, "native"),           # either delivery: transactions on both paths
    ("auto", False, "python"),
    ("python", True, "python"),
    ("native", False, "native"),        # the agent then refuses to start, saying so
])
def test_the_path_chosen_and_why(setting, installed, path):
    chosen, why = choose_send_path(setting, installed=installed)
    assert chosen == path
    if setting != "auto":
        assert why == "set by broker.send_path"
    elif not installed:
        assert "not installed" in why and "make native" in why


def test_auto_looks_for_the_extension_itself():
    assert choose_send_path("auto")[0] == (
        "native" if extension_installed() else "python")


def test_validate_refuses_native_without_the_extension_and_auto_runs_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "docket_native", None)      # import fails: not built
    with pytest.raises(ConfigError) as e:
        check_send_path(_config(send_path="native"))
    assert e.value.path == "broker.send_path" and "make native" in e.value.hint
    check_send_path(_config())
    path, why = send_path(_config())
    assert path == "python" and "not installed" in why


@pytest.mark.skipif(not extension_installed(), reason="the native extension is not built here")
def test_both_send_paths_run_one_librdkafka():
    """The extension links the librdkafka confluent-kafka's wheel ships (make native): one
    version, one file mapped into the process, so a setting either path takes the other takes
    too (``https.ca.pem`` needs librdkafka's libcurl, which the extension once lacked)."""
    import confluent_kafka
    import docket_native

    assert docket_native.LIBRDKAFKA_VERSION == confluent_kafka.libversion()[0]
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "librdkafka" in line}
    assert len(mapped) == 1, mapped
    options = {"librdkafka_options": {"https.ca.pem": "unused"}}
    for path in ("python", "auto", "native"):
        check_producer(_config(send_path=path, **options))
    options = {"librdkafka_options": {"sasl.oauthbearer.method": "oidc"}}
    for path in ("python", "native"):
        check_producer(_config(send_path=path, **options))


@pytest.mark.parametrize("send_path", ["auto", "native", "python"])
def test_exactly_once_is_taken_on_every_send_path(send_path):
    cfg = _config(send_path=send_path, delivery="exactly_once")
    assert (cfg["broker.send_path"], cfg["broker.delivery"]) == (send_path, "exactly_once")


@pytest.mark.parametrize("send_path, linger", [("python", PRODUCER_LINGER_MS),
                                               ("native", NATIVE_LINGER_MS)])
def test_librdkafkas_linger_by_send_path(send_path, linger):
    assert producer_config(_config(), send_path)["linger.ms"] == linger
    assert NATIVE_LINGER_MS < PRODUCER_LINGER_MS


@pytest.mark.parametrize("send_path", ["python", "native"])
def test_a_linger_in_librdkafka_options_decides(send_path):
    cfg = _config(librdkafka_options={"linger.ms": 7})
    assert producer_config(cfg, send_path)["linger.ms"] == 7


def test_an_installed_extension_that_does_not_load_says_why_auto_runs_python(tmp_path,
                                                                             monkeypatch):
    """An extension whose librdkafka is gone (confluent-kafka upgraded, the extension not built
    again): ``auto`` runs the Python path and its reason carries the loader's error."""
    import importlib
    import sys

    package = tmp_path / "docket_native"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('librdkafka-0123abcd.so.1: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "docket_native", raising=False)
    importlib.invalidate_caches()
    path, why = choose_send_path("auto")
    assert path == "python"
    assert "installed but does not load" in why and "librdkafka-0123abcd.so.1" in why, why
