"""A Spark standalone cluster on 127.0.0.1 for tests and benchmarks: one master and a few
workers started by the venv's own PySpark (``sbin/spark-daemon.sh``), every log, pid and work
folder under a folder of the caller's (never inside the venv). A job reaches it with
``--master`` set to ``StandaloneSpark.url``."""

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


class StandaloneSpark:
    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.ident = f"docket{os.getpid()}x{self.port}"

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.root / "log"), SPARK_PID_DIR=str(self.root / "pid"),
                   SPARK_WORKER_DIR=str(self.work_dir), SPARK_IDENT_STRING=self.ident)
        env.pop("SPARK_NO_DAEMONIZE", None)     # spark-daemon.sh must put them in background
        return env

    def _daemon(self, action: str, cls: str, instance: int, *args: str) -> None:
        subprocess.run(["bash", str(DAEMON), action, cls, str(instance), *args], env=self._env(),
                       check=True, stdout=subprocess.DEVNULL, timeout=60)

    def up(self) -> StandaloneSpark:
        for d in ("log", "pid", "work"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._daemon("start", MASTER, 1, "--host", "127.0.0.1", "--port", str(self.port),
                     "--webui-port", str(self.ui_port))
        try:
            self._wait(lambda s: s is not None, "the master's web UI")
            for i in range(1, self.workers + 1):
                self._daemon("start", WORKER, i, "--host", "127.0.0.1", "--cores",
                             str(self.cores), "--memory", self.memory, "--webui-port", "0",
                             self.url)
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
        except OSError:
            return None

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready(self.state()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark standalone: no {what} after {START_TIMEOUT_S}s; "
                                   f"logs in {self.root / 'log'}")
            time.sleep(0.5)

    def executor_logs(self) -> dict[str, list[Path]]:
        """Per worker folder of an application, the stderr of each of its executors."""
        out: dict[str, list[Path]] = {}
        for app in sorted(self.work_dir.glob("app-*")):
            out[app.name] = sorted(app.glob("*/stderr"))
        return out

    def down(self) -> None:
        for i in range(self.workers, 0, -1):
            self._stop(WORKER, i)
        self._stop(MASTER, 1)

    def _stop(self, cls: str, instance: int) -> None:
        pid_file = self.root / "pid" / f"spark-{self.ident}-{cls}-{instance}.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        try:
            self._daemon("stop", cls, instance)
        except subprocess.SubprocessError:
            pass
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and \
        "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
