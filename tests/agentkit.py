"""Helpers for tests that run the agent as a user would: a config file, a process, waits."""

from __future__ import annotations

import compileall
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from agent.drain.native import extension_installed as native_built  # noqa: F401 (make native)

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "audit", "broker", "docket_common")     # what the agent imports


def compile_sources(root: Path = REPO) -> None:
    """Bytecode for the project's modules in the checkout ``root``, as an installed agent has
    it (pip and the .deb's postinst compile it): a benchmark's agent then starts as a user's
    does, instead of compiling every module of the project at each start, as it does when
    ``PYTHONDONTWRITEBYTECODE`` is set (0.2-0.25 CPU-s here)."""
    for package in PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clock_shift_env(seconds: int, build_dir: Path) -> dict[str, str]:
    """The environment that runs a process on a host whose wall clock is ``seconds`` off: the
    shim ``tests/clockshift.c``, built here with the system's C compiler, preloaded."""
    return {"LD_PRELOAD": str(_clock_shim(build_dir)), "CLOCK_SHIFT_S": str(seconds)}


def clock_step_env(shift_file: Path, build_dir: Path) -> dict[str, str]:
    """The environment of a process whose wall clock is off by the seconds written in
    ``shift_file``, looked at again every 100 ms: the test steps the clock by writing it."""
    if not shift_file.exists():
        shift_file.write_text("0")
    return {"LD_PRELOAD": str(_clock_shim(build_dir)), "CLOCK_SHIFT_FILE": str(shift_file)}


def _clock_shim(build_dir: Path) -> Path:
    lib = build_dir / "clockshift.so"
    if not lib.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib),
                        str(Path(__file__).with_name("clockshift.c")), "-ldl"], check=True)
    return lib


def write_config(path: Path, bootstrap: str, state_dir: Path, sources: list[dict],
                 **sections) -> Path:
    """A TOML config; ``sections`` like buffer={"size_bytes": ...} override the defaults."""
    conf = {
        "agent": {"id": "test-agent", "state_dir": str(state_dir), "shutdown_timeout_ms": 20000},
        # sync_on_seal as shipped: the pool's sealing thread syncs each slot
        "buffer": {"size_bytes": 128 << 20, "slot_size_bytes": 1 << 20, "linger_ms": 5},
        "broker": {"bootstrap_servers": bootstrap},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
    }
    for name, values in sections.items():
        conf.setdefault(name, {}).update(values)
    lines = []
    for name, values in conf.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    for src in sources:
        lines.append("[[sources]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in src.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_value(value) -> str:
    """A value as TOML writes it: JSON's scalars and arrays are TOML's; a table goes inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    return json.dumps(value)


class AgentProcess:
    """``docket-agent run --config FILE`` in a child process, awaited on its status endpoint."""

    def __init__(self, config: Path, log: Path, prefix: list[str] | None = None,
                 env: dict | None = None, binary: Path | None = None,
                 args: list[str] | None = None):
        self.binary = binary or BIN / "docket-agent"
        self.args = args or []                  # after `run --config FILE`
        self.config = config
        self.log = log
        text = config.read_text()
        self.listen = text.split('listen = "', 1)[1].split('"', 1)[0]
        self.prefix = prefix or []
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60, awaited: bool = True) -> AgentProcess:
        """``awaited=False``: return at once (a run that may end before it answers)."""
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([*self.prefix, str(self.binary), "run", "--config",
                                      str(self.config), *self.args], stdout=out, stderr=out,
                                     env=self.env)
        out.close()
        if not awaited:
            return self
        deadline = time.monotonic() + timeout_s
        while self.status() is None:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"agent not answering after {timeout_s}s:\n{self.log_text()}")
            time.sleep(0.1)
        return self

    def log_text(self) -> str:
        """The log's tail, for a failed assertion's message."""
        return self.log.read_text(errors="replace")[-4000:]

    def whole_log(self) -> str:
        """The whole log, to count or find lines in (the tail may have scrolled past them)."""
        return self.log.read_text(errors="replace")

    def status(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://{self.listen}/status", timeout=2) as r:
                return json.load(r)
        except OSError:
            return None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.listen}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, **labels) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def cpu_seconds(self, children: bool = False) -> float:
        """The agent's CPU time; with ``children``, that of the children it waited for too
        (what librdkafka runs: kinit, with Kerberos)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        if children:
            ticks += int(fields[13]) + int(fields[14])
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout_s: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def stop_with_writer(agent: AgentProcess, writer: subprocess.Popen) -> int:
    """End a run: the writer killed if it still writes, the agent stopped (SIGTERM); the
    agent's exit code."""
    if writer.poll() is None:
        writer.kill()
    return agent.stop()


def wait_until(what: str, check, timeout_s: float, agent: AgentProcess | None = None,
               step_s: float = 0.2):
    """``check()`` until it returns something true, which is returned; fails naming ``what``
    (and showing ``agent``'s log) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout_s} s"
                                 + (f":\n{agent.log_text()}" if agent else ""))
        time.sleep(step_s)


def consume_counts(bootstrap: str, topic: str, expected: int, timeout_s: float,
                   parse=lambda v: v, on_msg=None,
                   isolation: str = "read_committed", wanted: set | None = None) -> Counter:
    """Read ``topic`` from the start until ``expected`` distinct values (after ``parse``) came,
    or the time is up; ``on_msg`` sees every record (its timestamp, its headers). Distinct, not
    records: duplicates must not end the reading while some values have yet to arrive.
    ``wanted``: read until every one of these values came instead (a value that should not
    have come must not end the reading while one that should is still on its way).
    ``isolation``: ``read_uncommitted`` sees the records of aborted transactions too."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": isolation})
    md = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    counts: Counter = Counter()
    deadline = time.monotonic() + timeout_s
    try:
        left = set(wanted) if wanted is not None else None
        while (len(counts) < expected if left is None else left) \
                and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10000, timeout=0.5):
                if msg.error():
                    continue
                value = parse(msg.value())
                counts[value] += 1
                if left is not None:
                    left.discard(value)
                if on_msg is not None:
                    on_msg(msg)
        # duplicates of values already seen may still come; read a moment more
        quiet_until = time.monotonic() + 2
        while time.monotonic() < quiet_until:
            batch = consumer.consume(num_messages=10000, timeout=0.5)
            for msg in batch:
                if not msg.error():
                    counts[parse(msg.value())] += 1
                    if on_msg is not None:
                        on_msg(msg)
            if batch:
                quiet_until = time.monotonic() + 2
    finally:
        consumer.close()
    return counts
