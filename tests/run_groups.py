"""``make test``: the suite in independent groups, side by side.

Most of a Kafka or Spark test's time is waiting — for a broker, a job's trigger, a window, a
timeout — not CPU, so on two cores two sessions finish well before one session of both. Each
group is a pytest session of its own: its own clusters (``tests/conftest.py`` starts them per
session), its own Spark starts, its own temporary folder. ``audit`` holds what needs Spark, the
mirror, the secured clusters and the reconciler; ``agent`` everything else (the agent, its faults,
the unit tests), so a test file added anywhere runs in exactly one group.

Every line a group prints is streamed with the group's name in front, and kept in
``build/test-groups/NAME.log``; a last line sums the groups up. The exit status is the first
failing group's (pytest's own codes; 5 only when no group collected a test). SIGTERM or SIGINT
reaches every group, whose sessions stop their clusters as pytest does on Ctrl-C.

Arguments are pytest's, given to every group (``make test PYTEST_ARGS=-q``). Arguments naming
tests (a path, ``-k``, ``-m``) run one plain session instead: a selection is not split.

``--soak`` (``make soak``) runs the long runs the same way in two groups of their own: the
broker-pause matrix, and the rest at the lowest CPU priority.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "test-groups"
# Each group's temporary folder, emptied by pytest when the group starts (short: unix socket
# paths under it must stay within 108 bytes).
TMP = Path("/tmp/docket-tests")

# The audit pipeline's tests: Spark jobs, MirrorMaker 2, the secured clusters (their fixtures,
# kafka_sasl and kafka_mtls, start once, in this group), the reconciler and the dashboards.
AUDIT = [
    "tests/integration/test_audit_identity.py",
    "tests/integration/test_audit_tiers.py",
    "tests/integration/test_clock_skew.py",
    "tests/integration/test_reconcile.py",
    "tests/integration/test_reconcile_scenarios.py",
    "tests/integration/test_reconcile_spark.py",
    "tests/integration/test_mirror.py",
    "tests/integration/test_mirror_audit.py",
    "tests/integration/test_secured_audit.py",
    "tests/integration/test_broker_security.py",
    "tests/integration/test_agent_security.py",
    "tests/integration/test_dashboard_browser.py",
    "tests/integration/test_dashboard_process.py",
    "tests/integration/test_alert_delivery.py",
    "tests/integration/test_agent_jvm_logging.py",     # a count job over its topic
    "tests/faults/test_audit_job_kill.py",
    "tests/faults/test_reconcile_kill.py",
]
GROUPS = {"agent": [f"--ignore={path}" for path in AUDIT], "audit": AUDIT}
# ``make soak`` (``--soak``): the broker-pause matrix (85 min, mostly outages waited out, whose
# catch-ups are measured) beside every other long run, which runs at the lowest CPU priority
# (``keep_nice``) so the matrix's catch-ups are not measured against them.
SOAK_GROUPS = {"pause": ["-m", "soak", "-k", "pause_matrix"],
               "soak": ["-m", "soak", "-k", "not pause_matrix"]}
SOAK_NICE = {"soak": 19}
# Each group's slowest tests, so a CI log says where its time went.
DEFAULT_ARGS = ["--durations=15"]
_SELECTING = re.compile(r"^(-k|-m|--deselect|tests/|\./tests)")


def selects(args: list[str]) -> bool:
    """Do ``args`` name tests (then one plain session runs them)?"""
    return any(_SELECTING.match(a) or Path(a.split("::")[0]).exists() for a in args)


def _stream(name: str, proc: subprocess.Popen, log: Path, lock: threading.Lock) -> None:
    with open(log, "w") as out:
        for line in proc.stdout:
            out.write(line)
            out.flush()
            with lock:
                sys.stdout.write(f"[{name}] {line}")
                sys.stdout.flush()


def _summary(log: Path) -> str:
    """pytest's own last line of a group: ``N passed, M deselected in S s``."""
    lines = [ln.strip("= \n") for ln in log.read_text(errors="replace").splitlines()]
    return next((ln for ln in reversed(lines) if re.search(r"\bin [\d.]+s\b", ln)), "no summary")


def _failures(log: Path) -> list[str]:
    """pytest's ``FAILED``/``ERROR`` lines of a group (its short test summary): the tests that
    failed and the first line of each one's error, so the end of a CI log names them; then
    where they failed (the last frames of the tracebacks: ``file.py:line: Error``) and any
    SQLite lock diagnosis (``tests/conftest.py``)."""
    lines = log.read_text(errors="replace").splitlines()
    failed = [ln.strip()[:400] for ln in lines if re.match(r"^(FAILED|ERROR) tests/", ln)]
    if not failed:
        return []
    where = [ln.strip() for ln in lines if re.match(r"^[\w./-]+\.py:\d+: \w+$", ln.strip())]
    diagnosis = [ln.strip()[:2000] for ln in lines if ln.startswith("sqlite lock diagnosis:")]
    return failed + [f"at {ln}" for ln in where[-8:]] + diagnosis


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                                # gone since the listing
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def keep_nice(root: int, nice: int, stop: threading.Event, every_s: float = 0.5) -> None:
    """Hold every process under ``root`` at ``nice``, its own and its autogroup's: where the
    kernel groups each session (``kernel.sched_autogroup_enabled``), a process's nice weighs
    only against its own session's, and the brokers, agents and JVMs a test starts in sessions
    of their own would otherwise take as much CPU as the group beside them."""
    while not stop.wait(every_s):
        for pid in _descendants(root):
            try:
                if os.getpriority(os.PRIO_PROCESS, pid) < nice:
                    os.setpriority(os.PRIO_PROCESS, pid, nice)
                Path(f"/proc/{pid}/autogroup").write_text(str(nice))
            except OSError:
                pass                                # gone, or no autogroups here


def run_groups(args: list[str], groups: dict[str, list[str]] = GROUPS,
               nice: dict[str, int] | None = None) -> int:
    nice = nice or {}
    LOGS.mkdir(parents=True, exist_ok=True)
    # pytest makes --basetemp itself but not its parent: a fresh machine has no /tmp/docket-tests.
    TMP.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen] = {}
    threads = []
    settled = threading.Event()
    began = time.monotonic()
    for name, selection in groups.items():
        cmd = [sys.executable, "-m", "pytest", *DEFAULT_ARGS, *args, *selection,
               f"--basetemp={TMP}/{name}"]
        # a group held at a nice of its own runs in a session (an autogroup) of its own
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, bufsize=1,
                                       start_new_session=bool(nice.get(name)))
        t = threading.Thread(target=_stream, args=(name, procs[name], LOGS / f"{name}.log", lock))
        t.start()
        threads.append(t)
        if nice.get(name):
            threading.Thread(target=keep_nice, args=(procs[name].pid, nice[name], settled),
                             daemon=True).start()

    def forward(signum, _frame):
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = {name: p.wait() for name, p in procs.items()}
    settled.set()
    for t in threads:
        t.join()
    spent = time.monotonic() - began
    for name in groups:
        print(f"group {name}: exit {codes[name]}: {_summary(LOGS / f'{name}.log')}")
    failing = [c for c in codes.values() if c not in (0, 5)]
    code = failing[0] if failing else (5 if all(c == 5 for c in codes.values()) else 0)
    verdict = "passed" if code == 0 else f"FAILED (exit {code})"
    print(f"=== {len(groups)} groups side by side {verdict} in {spent:.0f}s: "
          + "; ".join(f"{n}: {_summary(LOGS / f'{n}.log')}" for n in groups) + " ===")
    # Last, so the tail of a log names what failed even when the groups' output interleaved.
    for name in groups:
        for line in _failures(LOGS / f"{name}.log"):
            print(f"{name} {line}")
    return code


def main(argv: list[str]) -> int:
    if "--soak" in argv:
        rest = [a for a in argv if a != "--soak"]
        if selects(rest):
            return subprocess.call([sys.executable, "-m", "pytest", "-m", "soak", "-s", *rest],
                                   cwd=ROOT)
        return run_groups(["-s", *rest], SOAK_GROUPS, SOAK_NICE)
    if selects(argv):
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
    return run_groups(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
