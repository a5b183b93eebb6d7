"""Container runtimes' log files (``format = "cri" | "docker"``): the framing read and removed,
partial lines joined into the line the application wrote, a multiline rule over the joined
lines, stream and time kept, the path's pod, namespace and container, lines that are not the
runtime's framing counted and shipped whole — on the real file source, pool and state
database (a fake clock), each record counted by its id."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.config import ConfigError, parse
from agent.tail.container import Framing, path_fields, time_ms
from agent.tail.multiline import line_bounds
from tests.unit.tailkit import Harness

UID = "1f0c8d9e-2b7a-4c1d-9e8f-0a1b2c3d4e5f"
CID = "3b" * 32


def cri(text: str, stream: str = "stdout", tag: str = "F", second: int = 0) -> bytes:
    return f"2026-12-03T21:00:{second:02d}.123456789Z {stream} {tag} {text}\n".encode()


def docker(text: str, stream: str = "stdout", second: int = 0) -> bytes:
    return json.dumps({"log": text, "stream": stream,
                       "time": f"2026-12-03T21:00:{second:02d}.123456789Z"}).encode() + b"\n"


def records(h: Harness) -> list[dict]:
    return [json.loads(v) for v in h.values()]


def test_the_path_names_the_pod_namespace_and_container():
    assert path_fields(f"/var/log/pods/shop_web-7d9f_{UID}/nginx/2.log") == {
        "namespace": "shop", "pod": "web-7d9f", "pod_uid": UID, "container": "nginx",
        "restart": 2}
    assert path_fields(f"/var/log/pods/shop_web-7d9f_{UID}/nginx/0.log.20261203-210000") == {
        "namespace": "shop", "pod": "web-7d9f", "pod_uid": UID, "container": "nginx",
        "restart": 0}
    assert path_fields(f"/var/log/containers/web-7d9f_shop_nginx-{CID}.log") == {
        "pod": "web-7d9f", "namespace": "shop", "container": "nginx", "container_id": CID}
    assert path_fields(f"/var/lib/docker/containers/{CID}/{CID}-json.log.1") == {
        "container_id": CID}
    assert path_fields("/var/log/app/app.log") == {}


def plan_of(f: Framing, data: bytes):
    starts, ends = line_bounds(data, len(data))
    parts = f.parts(data, starts, ends)
    return parts, f.plan(parts)


def test_cri_lines_are_read_into_time_stream_tag_and_content():
    f = Framing("cri")
    data = (cri("whole") + cri("half ", tag="P") + cri("rest", stream="stderr", tag="F:x")
            + b"2026-12-03T21:00:00Z stdout F\n" + b"no framing at all\n"
            + b"2026-12-03T21:00:00Z stdin F x\n" + cri("end\r", tag="F"))
    parts, plan = plan_of(f, data)
    assert [(p.framed, p.stream, p.partial, p.content) for p in parts] == [
        (True, "stdout", False, b"whole"), (True, "stdout", True, b"half "),
        (True, "stderr", False, b"rest"), (True, "stdout", False, b""),
        (False, None, False, b"no framing at all"),
        (False, None, False, b"2026-12-03T21:00:00Z stdin F x"),
        (True, "stdout", False, b"end")]
    # per stream: stdout's "half " goes on in the next stdout line (the empty one)
    assert plan.records == [[0], [1, 3], [2], [4], [5], [6]]
    assert plan.groups.tolist() == [True, True, False, False, True, True, True]
    assert plan.closed and not any(plan.unfinished)
    assert time_ms("2026-12-03T21:00:00.123456789Z") == 1_796_331_600_123
    assert time_ms("2026-12-03T21:00:00") == 1_796_331_600_000      # no zone: UTC


def test_parts_are_joined_per_stream_whatever_lies_between():
    """The runtimes write stdout and stderr to one file: a stderr line (or one that is no
    framing) between a stdout line's parts is a record of its own, the stdout line whole, in
    the order of their first lines, all in one group."""
    f = Framing("cri")
    data = (cri("A-first ", "stdout", "P") + cri("B-whole", "stderr") + b"junk\n"
            + cri("A-rest", "stdout") + cri("C", "stderr"))
    _, plan = plan_of(f, data)
    assert plan.records == [[0, 3], [1], [2], [4]]
    assert plan.groups.tolist() == [True, False, False, False, True]


def test_an_entry_the_other_stream_outlives_is_closed_by_the_runtimes_clock(tmp_path):
    """stderr's part whose last part never comes does not hold stdout back for longer than
    flush_ms of the runtime's time: it is sent as it is, counted."""
    h = Harness(tmp_path, format="cri")
    h.app.write_bytes(cri("id-000000000 lost its end ", "stderr", "P", second=0)
                      + b"".join(cri(f"id-{i:09d} out", second=i // 2) for i in range(1, 9)))
    h.step()
    assert [r["message"] for r in records(h)] == ["id-000000000 lost its end "] + \
        [f"id-{i:09d} out" for i in range(1, 9)]
    assert h.metrics.get("agent_source_bad_input_total", kind="container_entry_unfinished",
                         topic="t") == 1


def test_an_open_entry_holds_the_lines_after_it_until_its_end(tmp_path):
    h = Harness(tmp_path, format="cri")
    with open(h.app, "ab") as f:
        f.write(cri("id-000000000 A-first ", "stdout", "P") + cri("id-000000001 B", "stderr"))
        f.flush()
        h.step(2, advance_s=0.2)
        assert records(h) == []                  # B waits behind A's open entry
        f.write(cri("A-rest", "stdout"))
        f.flush()
        h.step(1)
    got = records(h)
    assert [(r["stream"], r["message"]) for r in got] == [
        ("stdout", "id-000000000 A-first A-rest"), ("stderr", "id-000000001 B")]
    assert h.src.due() is None


def test_a_cri_file_becomes_one_json_record_per_line_with_the_runtimes_time(tmp_path):
    h = Harness(tmp_path, format="cri")
    h.app.write_bytes(b"".join(cri(f"id-{i:09d} hello", "stderr" if i % 3 == 0 else "stdout",
                                   second=i % 60) for i in range(100)))
    h.step()
    got = records(h)
    assert [r["message"] for r in got] == [f"id-{i:09d} hello" for i in range(100)]
    assert [r["stream"] for r in got] == ["stderr" if i % 3 == 0 else "stdout"
                                          for i in range(100)]
    assert got[7]["time"] == "2026-12-03T21:00:07.123456789Z"
    times = [t for s in h.pool.sealed() for t, _k, _v in s.records()]
    assert times[7] == time_ms("2026-12-03T21:00:07.123456789Z")      # the event time
    assert h.db.get(1)["sealed_offset"] == h.app.stat().st_size


def test_a_whole_line_is_sent_at_once_and_a_partial_one_waits_for_its_last_part(tmp_path):
    """A line ending its entry (F) is never held for a flush; parts (P) wait for theirs."""
    h = Harness(tmp_path, format="cri")
    with open(h.app, "ab") as f:
        f.write(cri("id-000000000 one"))
        f.flush()
        h.step(1)
        assert [r["message"] for r in records(h)] == ["id-000000000 one"]
        f.write(cri("id-000000001 a long ", tag="P") + cri("line cut ", tag="P"))
        f.flush()
        h.step(2, advance_s=0.3)
        assert len(records(h)) == 1
        f.write(cri("in three"))
        f.flush()
        h.step(1)
    assert [r["message"] for r in records(h)] == ["id-000000000 one",
                                                  "id-000000001 a long line cut in three"]
    assert h.src.due() is None


def test_parts_whose_last_never_comes_are_sent_after_the_flush(tmp_path):
    h = Harness(tmp_path, format="cri")
    h.app.write_bytes(cri("id-000000000 cut ", tag="P") + cri("off", tag="P"))
    h.step(1)
    assert records(h) == [] and h.src.due() is not None
    h.step(2, advance_s=0.6)                      # the default flush: 1 s at one size
    assert [r["message"] for r in records(h)] == ["id-000000000 cut off"]


def test_a_stack_trace_cut_into_partial_lines_and_lines_is_one_record(tmp_path):
    """The multiline rule is applied to the lines the application wrote, after the runtime's
    parts are joined, per stream: a frame the runtime cut in two is still one line of the
    trace, and stdout's lines written between its lines do not cut it."""
    h = Harness(tmp_path, format="cri", multiline={"preset": "java", "flush_ms": 500})
    trace = ["2026-12-03 21:00:00.000 ERROR id-000000000 failed",
             "java.lang.IllegalStateException: boom",
             "\tat app.Worker.step(Worker.java:10)",
             "\tat app.Main.main(Main.java:3)"]
    data = (cri(trace[0], "stderr") + cri("id-000000002 stdout between", "stdout")
            + cri(trace[1], "stderr") + cri(trace[2][:9], "stderr", "P")
            + cri("id-000000003 stdout between", "stdout") + cri(trace[2][9:], "stderr", "F")
            + cri(trace[3], "stderr")
            + cri("2026-12-03 21:00:01.000 INFO id-000000001 next", "stderr"))
    h.app.write_bytes(data)
    h.step()
    assert records(h) == []           # each stream's last event may go on, and holds after it
    h.step(2, advance_s=0.3)          # the flush: the file one size for flush_ms
    assert [(r["stream"], r["message"]) for r in records(h)] == [
        ("stderr", "\n".join(trace)), ("stdout", "id-000000002 stdout between"),
        ("stdout", "id-000000003 stdout between"),
        ("stderr", "2026-12-03 21:00:01.000 INFO id-000000001 next")]


def test_a_crash_mid_entry_reads_the_entry_again_whole_once(tmp_path):
    h = Harness(tmp_path, format="cri")
    whole = [cri(f"id-{i:09d} x") for i in range(20)]
    h.app.write_bytes(b"".join(whole) + cri("id-000000020 first half ", tag="P"))
    h.step()
    h.drain_all()
    h.restart(crash=True)
    with open(h.app, "ab") as f:
        f.write(cri("second half"))
    h.step()
    messages = [r["message"] for r in records(h)]
    assert messages == [f"id-{i:09d} x" for i in range(20)] + \
        ["id-000000020 first half second half"]


def test_lines_that_are_no_framing_are_counted_and_shipped_whole(tmp_path):
    h = Harness(tmp_path, format="cri")
    h.app.write_bytes(cri("id-000000000 ok") + b"id-000000001 not framed\n"
                      + cri("id-000000002 ok"))
    h.step()
    got = records(h)
    assert got[1] == {"message": "id-000000001 not framed"}
    assert [r["message"] for r in got] == ["id-000000000 ok", "id-000000001 not framed",
                                           "id-000000002 ok"]
    assert h.metrics.get("agent_source_bad_input_total", kind="container_unparsable",
                         topic="t") == 1


def test_docker_json_file_lines_are_joined_at_their_newline(tmp_path):
    h = Harness(tmp_path, format="docker", key_field="stream")
    h.app.write_bytes(docker("id-000000000 one\n") + docker("id-000000001 cut", "stderr")
                      + docker(" at 16 KiB\n", "stderr") + b'{"no log": 1}\n'
                      + docker("id-000000003 caf\u00e9\n", second=9))
    h.step()
    got = records(h)
    assert [r["message"] for r in got] == ["id-000000000 one", "id-000000001 cut at 16 KiB",
                                           '{"no log": 1}', "id-000000003 caf\u00e9"]
    assert got[1]["stream"] == "stderr"
    keys = [k for s in h.pool.sealed() for _t, k, _v in s.records()]
    assert keys == [b"stdout", b"stderr", None, b"stdout"]
    times = [t for s in h.pool.sealed() for t, _k, _v in s.records()]
    assert times[3] == time_ms("2026-12-03T21:00:09.123456789Z")      # kept with a key field
    assert h.metrics.get("agent_source_bad_input_total", kind="container_unparsable",
                         topic="t") == 1


@pytest.mark.parametrize("crash", [False, True])
def test_many_entries_of_two_streams_each_whole_across_reads_restarts_and_parts(tmp_path,
                                                                              crash):
    """Entries of random sizes on stdout and stderr, some cut into parts, the two streams'
    parts interleaved at random, written in random pieces across steps and restarts: each
    entry arrives whole, in its stream's order — once across clean restarts; at least once
    and at most twice across crashes (what was read after the last checkpoint, again)."""
    rnd = np.random.default_rng(5)
    h = Harness(tmp_path, format="cri", read_chunk_bytes=4096)
    want: dict[str, list[str]] = {"stdout": [], "stderr": []}
    queues: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    for i in range(400):
        stream = "stderr" if rnd.random() < 0.3 else "stdout"
        text = f"id-{i:09d} " + "y" * int(rnd.integers(0, 3000))
        want[stream].append(text)
        cuts = sorted(set(rnd.integers(1, len(text), int(rnd.integers(0, 4))).tolist()))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        queues[stream] += [cri(piece, stream, "F" if j == len(pieces) - 1 else "P")
                           for j, piece in enumerate(pieces)]
    data = bytearray()
    while queues["stdout"] or queues["stderr"]:
        stream = "stderr" if not queues["stdout"] or (queues["stderr"] and rnd.random() < 0.3) \
            else "stdout"
        data += queues[stream].pop(0)
    at, restarts = 0, 0
    while at < len(data):
        step = int(rnd.integers(1, 20000))
        with open(h.app, "ab") as f:
            f.write(data[at:at + step])
        at += step
        h.step(1, advance_s=0.01)
        if rnd.random() < 0.1:
            h.drain_all()
            h.step(1, advance_s=0.01)           # read on past what was acknowledged
            h.restart(crash=crash)
            restarts += 1
    h.step(2, advance_s=0.01)
    h.drain_all()
    assert restarts >= 5
    got = [json.loads(v) for v in h.delivered]
    for stream, texts in want.items():
        mine = [r["message"] for r in got if r["stream"] == stream]
        if not crash:
            assert mine == texts, stream
        else:
            copies = {t: mine.count(t) for t in texts}
            assert set(mine) == set(texts) and max(copies.values()) <= 2, stream
            firsts = [mine.index(t) for t in texts]
            assert firsts == sorted(firsts), stream     # in the stream's order


@pytest.mark.parametrize("extra, path, why", [
    ({"type": "socket", "path": "SOCK", "format": "cri"}, "format", "socket"),
    ({"type": "file", "paths": ["GLOB"], "format": "json"}, "format", "cri, docker"),
    ({"type": "file", "paths": ["GLOB"], "format": "cri", "encoding": "latin-1"}, "encoding",
     "UTF-8"),
    ({"type": "file", "paths": ["GLOB"], "format": "docker", "timestamp_field": "time"},
     "timestamp_field", "runtime's time"),
    ({"type": "syslog", "listen": "127.0.0.1:5514", "format": "cri"}, "format", "json, raw"),
    ({"type": "file", "paths": ["GLOB"], "format": "cri", "partial_flush_ms": 500},
     "partial_flush_ms", "waited for"),
])
def test_a_format_a_source_does_not_take_is_refused_with_its_key_path(tmp_path, extra, path,
                                                                        why):
    src = {k: (str(tmp_path / "s.sock") if v == "SOCK" else v) for k, v in extra.items()}
    if "paths" in src:
        src["paths"] = [str(tmp_path / "*.log")]
    with pytest.raises(ConfigError) as e:
        parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"},
               "sources": [{"topic": "t", **src}]})
    assert e.value.path == f"sources[0].{path}" and why in e.value.render()


def test_a_syslog_source_without_a_format_is_json(tmp_path):
    cfg = parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"},
                 "sources": [{"type": "syslog", "topic": "t", "listen": "127.0.0.1:5514"},
                             {"type": "file", "topic": "u", "paths": [str(tmp_path / "*")]}]})
    assert [s.format for s in cfg.sources] == ["json", None]


def test_an_entry_longer_than_a_mebibyte_without_a_rule_is_one_record(tmp_path):
    """100 parts of 16 KiB and a last one: one line to the application, one record (capped
    as any line is, not at the multiline default)."""
    h = Harness(tmp_path, format="cri", slot_bytes=4 << 20)
    text = "".join(chr(97 + k % 26) * 16384 for k in range(100)) + "end"
    h.app.write_bytes(b"".join(cri(text[a:a + 16384], tag="P" if a + 16384 < len(text)
                                   else "F") for a in range(0, len(text), 16384))
                      + cri("id-000000001 next"))
    h.step()
    assert [r["message"] for r in records(h)] == [text, "id-000000001 next"]
    assert not h.metrics.get("agent_source_bad_input_total", kind="multiline_event_cut",
                             topic="t")


@pytest.mark.parametrize("multiline", [None, {"preset": "java"}])
def test_lines_docker_never_writes_are_shipped_not_crashed_on(tmp_path, multiline):
    """A log holding a newline inside, a lone surrogate in the stream or time, JSON nested
    deeper than the parser goes: each a record, the agent running."""
    h = Harness(tmp_path, format="docker", multiline=multiline)
    deep = b"[" * 100_000 + b"\n"
    h.app.write_bytes(b'{"log":"id-000000000 a\\nb\\n","stream":"stdout","time":"x"}\n'
                      + b'{"log":"id-000000001\\n","stream":"\\ud800","time":"\\udc00"}\n'
                      + deep + docker("id-000000003 fine\n"))
    h.step(3, advance_s=0.6)
    got = records(h)
    assert [r["message"][:12] for r in got] == ["id-000000000", "id-000000001", "[" * 12,
                                                "id-000000003"]
    assert got[0]["message"] == "id-000000000 a\nb"
    assert got[1]["stream"] == "?"


def test_a_time_with_digits_python_reads_but_int_refuses_is_no_crash(tmp_path):
    """"²" is a digit to str.isdigit but not to int(): a second already seen once took the
    fast path into a ValueError that stopped the agent, at every start again."""
    h = Harness(tmp_path, format="docker")
    h.app.write_bytes(docker("id-000000000 ok\n")
                      + b'{"log":"id-000000001 odd\\n","stream":"stdout",'
                        b'"time":"2026-12-03T21:00:00.\\u00b2Z"}\n')
    h.step()
    got = records(h)
    assert [r["message"] for r in got] == ["id-000000000 ok", "id-000000001 odd"]


def test_a_part_without_a_time_is_joined_alike_in_the_read_and_in_its_group(tmp_path):
    """The runtime's clock is each line's own: a group planned alone decides as the whole read
    did (before, a group began its clock afresh and cut an entry the read had joined)."""
    def d(log, stream="stdout", time=True):
        obj = {"log": log, "stream": stream}
        if time:
            obj["time"] = "2026-12-03T21:00:05.000000000Z"
        return json.dumps(obj).encode() + b"\n"

    h = Harness(tmp_path, format="docker")
    h.app.write_bytes(d("id-0 zero\n") + d("id-1 A-first ", time=False) + d("id-2 B\n", "stderr")
                      + d("A-rest\n"))
    h.step(2)
    assert [r["message"] for r in records(h)] == ["id-0 zero", "id-1 A-first A-rest", "id-2 B"]
    assert not h.metrics.get("agent_source_bad_input_total", kind="container_entry_unfinished",
                             topic="t")


def test_held_tells_a_file_written_on_after_a_cut_from_the_one_a_slot_read():
    f = Framing("cri")
    data = cri("id-1 a ", tag="P") + cri("id-2 b", "stderr") + cri("rest") + cri("id-3 c")
    values = [json.dumps({"time": "2026-12-03T21:00:00.123456789Z", "stream": s,
                          "message": m, "pod": "p"}).encode()
              for s, m in (("stdout", "id-1 a rest"), ("stderr", "id-2 b"), ("stdout", "id-3 c"))]
    assert f.held(data, values)
    assert f.held(data, [b"not json", b"[" * 100_000, *values])    # others' records between
    assert not f.held(data, values[:2])            # a line no record holds
    later = data.replace(b"21:00:00.123", b"21:07:00.123")
    assert not f.held(later, values)               # written again after the cut, later
    assert not f.held(cri("id-9 new"), values)


def _routed(h: Harness) -> dict[str, list[tuple[bytes | None, dict]]]:
    h.checkpoint()
    out: dict[str, list] = {}
    for s in h.pool.sealed():
        out.setdefault(s.topic, []).extend((k, json.loads(v)) for _t, k, v in s.records())
    return out


def test_files_routed_by_their_pods_namespace_with_a_fallback_a_key_and_added_fields(tmp_path):
    """``topic = "pods.{namespace}"``: each file's records in the topic its path's namespace
    makes, keyed by ``{namespace}/{pod}``, with the added fields; a file whose path names no
    pod goes to the fallback, unkeyed, both counted. A crash after some were sealed: each
    record in its topic, none lost, those not sealed read again under the same topic."""
    h = Harness(tmp_path, pattern="pods/*/*/*.log", format="cri", topic="pods.{namespace}",
                fallback_topic="pods.other", key="{namespace}/{pod}", add_fields={"dc": "eu1"})
    files = {"shop": h.logs / f"pods/shop_web-7d9f_{UID}/nginx/0.log",
             "pay": h.logs / f"pods/pay_api-5c4b_{UID}/app/0.log",
             "other": h.logs / "pods/static/site/0.log"}      # no <ns>_<pod>_<uid>: no pod
    for i, f in enumerate(files.values()):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"".join(cri(f"id-{i}{j:08d}") for j in range(50)))
    h.step()
    got = _routed(h)
    assert sorted(got) == ["pods.other", "pods.pay", "pods.shop"]
    assert {k for k, _r in got["pods.shop"]} == {b"shop/web-7d9f"}
    assert {k for k, _r in got["pods.pay"]} == {b"pay/api-5c4b"}
    assert {k for k, _r in got["pods.other"]} == {None}
    shop = got["pods.shop"][0][1]
    assert (shop["namespace"], shop["pod"], shop["container"], shop["dc"]) == \
        ("shop", "web-7d9f", "nginx", "eu1")
    assert got["pods.other"][0][1]["dc"] == "eu1" and "namespace" not in got["pods.other"][0][1]
    assert [len(v) for _t, v in sorted(got.items())] == [50, 50, 50]
    bad = h.metrics.get("agent_source_bad_input_total", kind="routed_to_fallback",
                          topic="pods.other")
    assert bad == 50
    assert h.metrics.get("agent_source_bad_input_total", kind="key_template_unmatched",
                           topic="pods.other") == 50
    assert h.metrics.get("agent_source_read_events_total", topic="pods.shop") == 50
    for i, f in enumerate(files.values()):                  # more, then a crash unsealed
        with open(f, "ab") as out:
            out.write(b"".join(cri(f"id-{i}{j:08d}") for j in range(50, 80)))
    h.step()
    h.restart(crash=True)
    h.step()
    got = _routed(h)
    for topic, i in (("pods.shop", 0), ("pods.pay", 1), ("pods.other", 2)):
        ids = [r["message"] for _k, r in got[topic]]
        assert sorted(set(ids)) == [f"id-{i}{j:08d}" for j in range(80)], topic
        assert len(ids) == 80, topic                         # sealed once, the rest once


def test_a_plain_file_routed_by_the_hosts_name(tmp_path):
    h = Harness(tmp_path, topic="{hostname}.app", fallback_topic="app.other",
                key="{hostname}")
    host = h.src.reader.routes.hostname
    h.write(0, 20)
    h.step()
    h.checkpoint()
    [slot] = h.pool.sealed()
    assert slot.topic == f"{host}.app" and len(h.ids()) == 20
    assert {k for _t, k, _v in slot.records()} == {host.encode()}


@pytest.mark.parametrize("extra, path, why", [
    ({"add_fields": {"dc": "eu1"}}, "add_fields", "plain file's lines are shipped as written"),
    ({"format": "cri", "topic": "pods.{service}", "fallback_topic": "x"}, "topic",
     "not a field of the file"),                   # a plain file's: a field of its lines
    ({"topic": "logs.{hostname}"}, "fallback_topic", "needs a fallback topic"),
    ({"format": "cri", "add_fields": {"stream": "x"}}, "add_fields.stream", "every record"),
    ({"format": "cri", "key": "{pod}", "key_field": "pod"}, "key", "not both"),
    ({"fallback_topic": "x"}, "fallback_topic", "only a topic that names fields"),
])
def test_a_file_sources_routing_that_cannot_work_is_refused(tmp_path, extra, path, why):
    src = {"type": "file", "topic": "t", "paths": [str(tmp_path / "*.log")], **extra}
    with pytest.raises(ConfigError) as err:
        parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"}, "sources": [src]})
    assert err.value.path == f"sources[0].{path}" and why in err.value.render(), \
        err.value.render()


def test_a_file_sources_templates_over_its_files_fields_are_taken(tmp_path):
    src = {"type": "file", "topic": "k8s.{namespace}.{container}", "format": "cri",
           "fallback_topic": "k8s.other", "key": "{hostname}/{pod}", "add_fields": {"dc": "eu1"},
           "paths": ["/var/log/pods/*/*/*.log"]}
    cfg = parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"}, "sources": [src]})
    assert cfg.sources[0].label == "k8s.other"
    with pytest.raises(ConfigError) as err:
        parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"},
               "sources": [{"type": "socket", "topic": "s.{x}",
                            "path": str(tmp_path / "s.sock")}]})
    assert "socket source does not route" in err.value.render()
