"""Container log files (``format = "cri"`` and ``"docker"``) through the real agent into a real
Kafka, laid out as the kubelet and docker lay them out (``var/log/pods/<ns>_<pod>_<uid>/
<container>/0.log``, ``var/lib/docker/containers/<id>/<id>-json.log``) under a temp folder:
entries cut into partial lines at random, the kubelet's rotation (``0.log`` renamed to
``0.log.<time>``, the one before gzipped), a SIGKILL mid-stream. The pods' files are routed to
a topic per namespace (``topic = "….pods-{namespace}"``) with an added field. Every entry
arrives whole with its pod, namespace and container, in its namespace's topic, counted by id;
the agent's audit counts every record under the topic it went to."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, wait_until, write_config
from tests.kafkautil import read_all

UID = "0f9e8d7c-6b5a-4321-8fed-cba987654321"
CID = "ab" * 32
PODS = (("shop", "web-5c7d", "nginx"), ("shop", "api-9f2b", "app"), ("ops", "cron-1a2b", "job"))


def _cri(text: str, tag: str, stream: str) -> bytes:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
    return f"{stamp} {stream} {tag} {text}\n".encode()


def _docker(text: str, last: bool, stream: str) -> bytes:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
    return json.dumps({"log": text + ("\n" if last else ""), "stream": stream,
                       "time": stamp}).encode() + b"\n"


class Runtime:
    """Writes entries for each container as its runtime would: each cut into 1-3 parts at
    random, written part by part; the kubelet's rotation of a CRI file every ``rotate_every``
    entries (renamed to ``0.log.<n>``, the rotation before it gzipped and removed)."""

    def __init__(self, root: Path, rotate_every: int = 0):
        self.root = root
        self.rotate_every = rotate_every
        self.files = {}
        for ns, pod, container in PODS:
            folder = root / "var/log/pods" / f"{ns}_{pod}_{UID}" / container
            folder.mkdir(parents=True)
            self.files[(ns, pod, container)] = ("cri", folder / "0.log")
        folder = root / "var/lib/docker/containers" / CID
        folder.mkdir(parents=True)
        self.files[("docker",)] = ("docker", folder / f"{CID}-json.log")
        self.written: dict[int, tuple] = {}          # id -> (which, text)
        self.streams: dict[int, str] = {}            # id -> its stream
        self.rotations = self.gzipped = 0
        self.rnd = random.Random(11)
        self.next = 0
        self.stop = False

    def entry(self) -> None:
        """The next entry (its id's container), cut into parts; now and then the next id's
        entry, on the other stream, written whole between its first part and the rest (as
        a runtime's two stream writers interleave)."""
        i = self.next
        which = list(self.files)[i % len(self.files)]
        kind, path = self.files[which]
        pieces = self._pieces(i, which)
        between = self.rnd.random() < 0.2 and len(pieces) > 1
        self.streams[i] = "stderr" if i % 5 == 0 else "stdout"
        with open(path, "ab") as f:
            for j, piece in enumerate(pieces):
                last = j == len(pieces) - 1
                f.write(self._line(kind, piece, last, self.streams[i]))
                if j == 0 and between:
                    self.written[i + 1] = (which, f"id-{i + 1:07d} between")
                    self.streams[i + 1] = "stdout" if self.streams[i] == "stderr" else "stderr"
                    f.write(self._line(kind, f"id-{i + 1:07d} between", True,
                                       self.streams[i + 1]))
                f.flush()
        self.next = i + 2 if between else i + 1
        if kind == "cri" and self.rotate_every and self.rnd.random() < 1 / self.rotate_every:
            self._rotate(path)

    def _pieces(self, i: int, which: tuple) -> list[str]:
        text = f"id-{i:07d} " + "z" * self.rnd.randint(0, 600)
        self.written[i] = (which, text)
        cuts = sorted(self.rnd.sample(range(1, len(text)), self.rnd.randint(0, 2)))
        return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]

    @staticmethod
    def _line(kind: str, piece: str, last: bool, stream: str) -> bytes:
        return _cri(piece, "F" if last else "P", stream) if kind == "cri" \
            else _docker(piece, last, stream)

    def _rotate(self, path: Path) -> None:
        """As the kubelet does: the live file renamed with a time suffix, a new one begun; the
        rotation before it compressed (``.gz``) and the uncompressed one removed."""
        older = sorted(path.parent.glob("0.log.*[0-9]"))
        for old in older:
            with open(old, "rb") as src, gzip.open(f"{old}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            old.unlink()
            self.gzipped += 1
        os.rename(path, f"{path}.{self.rotations:08d}")
        path.touch()
        self.rotations += 1

    def run(self, rate: float) -> None:
        while not self.stop:
            self.entry()
            time.sleep(1 / rate)


def _expected(which: tuple) -> dict:
    if which == ("docker",):
        return {"container_id": CID}
    ns, pod, container = which
    return {"namespace": ns, "pod": pod, "pod_uid": UID, "container": container, "restart": 0}


def _check(records, runtime: Runtime) -> Counter:
    """Every entry whole with its container's fields; returns the copies per id."""
    ids: Counter = Counter()
    for r in records:
        obj = json.loads(r.value())
        i = int(re.match(r"id-(\d{7}) ", obj["message"]).group(1))
        which, text = runtime.written[i]
        assert obj["message"] == text, f"entry {i} not whole"
        assert obj["stream"] == runtime.streams[i]
        assert {k: obj.get(k) for k in _expected(which)} == _expected(which)
        ids[i] += 1
    return ids


# The pods' files are routed by their namespace (a topic each); none falls back.
NAMESPACES = sorted({ns for ns, _p, _c in PODS})
KINDS = (*(f"pods-{ns}" for ns in NAMESPACES), "pods-other", "docker")


def _topics(topic: str) -> list[str]:
    return [f"{topic}.{k}" for k in KINDS]


def _read_every(kafka, topic: str) -> list:
    return [r for t in _topics(topic) for r in read_all(kafka.bootstrap_servers, t)]


def _config(tmp_path, kafka, topic, **audit):
    root = tmp_path / "node"
    return root, write_config(tmp_path / "agent.toml", kafka.bootstrap_servers,
                              tmp_path / "state", [
        {"type": "file", "format": "cri", "topic": topic + ".pods-{namespace}",
         "fallback_topic": f"{topic}.pods-other", "key_field": "pod",
         "add_fields": {"cluster": "eu1-a"},
         "paths": [str(root / "var/log/pods/*/*/*.log*")]},
        {"type": "file", "format": "docker", "topic": f"{topic}.docker",
         "paths": [str(root / "var/lib/docker/containers/*/*-json.log*")]},
    ], **audit)


def test_pods_and_docker_every_entry_once_whole_with_its_pod_and_audited(kafka, tmp_path,
                                                                        topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=2)
                                            for t in _topics(topic_name)])
    root, config = _config(tmp_path, kafka, topic_name, audit={"interval_ms": 1000})
    runtime = Runtime(root, rotate_every=150)
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        while runtime.next < 3_000:
            runtime.entry()
        total = runtime.next
        wait_until("every entry sent", lambda: agent.metric(
            "agent_drain_sent_events_total") >= total, 90, agent)
        time.sleep(2)                                  # an audit round past the last record
        unframed = agent.metric("agent_source_bad_input_total", kind="container_unparsable")
    finally:
        assert agent.stop() == 0
    assert runtime.rotations >= 4 and runtime.gzipped >= 3, "the kubelet's rotation happened"
    by_ns = {ns: read_all(kafka.bootstrap_servers, f"{topic_name}.pods-{ns}")
             for ns in NAMESPACES}
    pods = [r for records in by_ns.values() for r in records]
    docker = read_all(kafka.bootstrap_servers, f"{topic_name}.docker")
    ids = _check(pods + docker, runtime)
    for ns, records in by_ns.items():                  # each namespace's in its topic
        assert records and {json.loads(r.value())["namespace"] for r in records} == {ns}
    assert all(json.loads(r.value())["cluster"] == "eu1-a" for r in pods)
    assert read_all(kafka.bootstrap_servers, f"{topic_name}.pods-other") == []
    assert ids == Counter(range(total)), "each entry exactly once"
    assert sum(text.endswith(" between") for _w, text in runtime.written.values()) >= 100
    assert unframed == 0
    assert {r.key() for r in pods} == {p.encode() for _ns, p, _c in PODS}
    from audit.contract.collect import read_audit_topic
    from tests.auditkit import tier_counts
    counted = tier_counts(read_audit_topic(kafka.bootstrap_servers, "docket.audit"), "producer",
                          set(_topics(topic_name)))
    per_topic = Counter()
    for (topic, _window, _origin), (count, _bytes, _checksum) in counted.items():
        per_topic[topic] += count
    assert per_topic == {**{f"{topic_name}.pods-{ns}": len(by_ns[ns]) for ns in NAMESPACES},
                         f"{topic_name}.docker": len(docker)}


def test_a_sigkill_mid_stream_loses_no_entry_and_cuts_none(kafka, tmp_path, topic_name):
    """The runtime writes on while the agent is killed and started again: every entry arrives
    whole (none half sent and its rest as another), at most twice (read again after the last
    checkpoint)."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=1)
                                            for t in _topics(topic_name)])
    root, config = _config(tmp_path, kafka, topic_name)
    runtime = Runtime(root, rotate_every=400)
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    writer = threading.Thread(target=runtime.run, args=(1_000,), daemon=True)
    writer.start()
    try:
        time.sleep(3)
        at_kill = runtime.next
        agent.kill()
        assert agent.proc.returncode == -9
        time.sleep(1)
        agent = AgentProcess(config, tmp_path / "agent.log").start()
        wait_until("more written", lambda: runtime.next > at_kill + 2_000, 60, agent)
        runtime.stop = True
        writer.join(timeout=10)
        total = runtime.next
        wait_until("every entry read and sent", lambda: agent.metric(
            "agent_drain_sent_events_total") >= agent.metric("agent_source_read_events_total")
            and Counter(_check(_read_every(kafka, topic_name),
                               runtime)).keys() >= set(range(total)), 90, agent)
    finally:
        runtime.stop = True
        if agent.alive():
            assert agent.stop() == 0
    assert runtime.rotations >= 1
    ids = _check(_read_every(kafka, topic_name), runtime)
    assert set(ids) == set(range(total)), "an entry is missing"
    assert max(ids.values()) <= 2
    print(f"containers SIGKILL: {total} entries, {sum(ids.values()) - total} read twice")
