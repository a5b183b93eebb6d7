"""A Spark standalone cluster on 127.0.0.1 for tests and benchmarks: one master and a few
workers started by the venv's own PySpark (``sbin/spark-daemon.sh``), every log, work and
scratch folder under a folder of the caller's (never inside the venv). A job reaches it with
``--master`` set to ``StandaloneSpark.url``.

The daemons run in the foreground of sessions of their own, so stopping one stops its
executors with it. They do not die with a SIGKILLed caller (the JVM is a child of
spark-daemon.sh, which a parent-death signal would not reach): ``down`` must run, as the
callers' ``finally`` blocks make sure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from tests.agentkit import free_port

SPARK_HOME = Path(pyspark.__file__).parent
DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


class StandaloneSpark:
    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.ident = f"docket{os.getpid()}x{self.port}"
        self._groups: list[subprocess.Popen] = []     # one per daemon, each its own session

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.root / "log"), SPARK_PID_DIR=str(self.root / "pid"),
                   SPARK_WORKER_DIR=str(self.work_dir),
                   SPARK_LOCAL_DIRS=str(self.root / "local"), SPARK_IDENT_STRING=self.ident,
                   SPARK_NO_DAEMONIZE="1")
        env.pop("SPARK_MASTER", None)       # would make spark-daemon.sh rsync into SPARK_HOME
        return env

    def _start(self, cls: str, instance: int, *args: str) -> None:
        """``spark-daemon.sh start`` in the foreground (SPARK_NO_DAEMONIZE), in a session of
        its own: ``down`` stops the daemon and everything it started (a worker's executors)
        as one process group, and no pid file can point at a reused pid."""
        name = f"{cls.rsplit('.', 1)[1].lower()}-{instance}"
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            self._groups.append(subprocess.Popen(
                ["bash", str(DAEMON), "start", cls, str(instance), *args], env=self._env(),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True))

    def up(self) -> StandaloneSpark:
        for d in ("log", "pid", "work", "local"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        try:
            self._start(MASTER, 1, "--host", "127.0.0.1", "--port", str(self.port),
                        "--webui-port", str(self.ui_port))
            self._wait(lambda s: s is not None, "the master's web UI")
            for i in range(1, self.workers + 1):
                self._start(WORKER, i, "--host", "127.0.0.1", "--cores", str(self.cores),
                            "--memory", self.memory, "--webui-port", "0", self.url)
            self._wait(lambda s: s is not None and s.get("aliveworkers") == self.workers,
                       f"{self.workers} workers")
        except BaseException:
            self.down()
            raise
        return self

    def state(self) -> dict | None:
        """The master's JSON view (workers, applications), None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready(self.state()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark standalone: no {what} after {START_TIMEOUT_S}s; "
                                   f"logs in {self.root / 'log'}")
            time.sleep(0.5)

    def executor_logs(self) -> dict[str, list[Path]]:
        """Per application folder of the workers, the stderr of each of its executors."""
        out: dict[str, list[Path]] = {}
        for app in sorted(self.work_dir.glob("app-*")):
            out[app.name] = sorted(app.glob("*/stderr"))
        return out

    def down(self) -> None:
        """Workers first, then the master: SIGTERM to each daemon's process group (a worker's
        shutdown stops its executors), SIGKILL to what is left of it after STOP_TIMEOUT_S."""
        groups, self._groups = self._groups[::-1], []
        for proc in groups:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in groups:
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
