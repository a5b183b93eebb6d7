"""Power cuts on a real file system that forgets: the agent's state folder and the application's
log folder on ``docket-forgetfs`` (``tests/forgetfs``, FUSE: every write kept in memory until
its file is synced, dropped at unmount), cut at random moments of a run at 20,000 lines/s with
rotation, against the real local Kafka.

A cut is what a host's power loss leaves: the agent and the application SIGKILLed (the page
cache with them, as the file system is unmounted before anything runs again), every write that
no ``fsync``/``msync`` made durable gone — or, at every other cut, a random half of the unsynced
pages kept (a disk writes back any subset before the power goes) —, every name made, moved or
removed in a folder not synced since undone (at every other cut, but for a random first part of
them), then the file system mounted again over what is durable and the application and the
agent started again.

The application (``faults/powercut_app.py``) syncs its log every 200 ms and notes outside
the file system what it wrote and what it synced: a line noted synced must reach Kafka; a line
written but not synced when the power went may be gone with the log's tail (it reaches Kafka
only if the agent had read and sent it). Checked after the run, by id: no synced line lost,
no record that is not a line the application wrote, duplicates counted (by record number: a
line sent again under the same number, or read again under a new one after its file was cut
back — ``renumbered``, which ``make soak``'s 200 cuts require to be 0) and each journal
entry's reason; the cuts really happened (the file system dropped pages
at each, the application's log lost a tail at some, names not yet synced were undone at some).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, consume_counts, write_config
from tests.faults.powercut_tally import Tally, line_id

FORGETFS = Path(__file__).resolve().parents[2] / "build" / "forgetfs" / "release" / \
    "docket-forgetfs"
APP = Path(__file__).with_name("powercut_app.py")
RATE = 20_000
ROTATE_EVERY = 30_000
SYNC_MS = 200                   # the application syncs its log this often: a tail to lose
CUTS = int(os.environ.get("DOCKET_POWER_CUTS", "10"))
SOAK_CUTS = 200                 # make soak
SEED = int(os.environ.get("DOCKET_POWER_CUT_SEED", "52"))

pytestmark = pytest.mark.skipif(
    not FORGETFS.exists() or not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"),
    reason="docket-forgetfs is not built, or FUSE is missing (make setup builds it with cargo and "
           "installs Debian's fuse3)")


class ForgetFs:
    """One mount of docket-forgetfs over ``backing`` at ``mountpoint``; ``cut`` ends it."""

    def __init__(self, backing: Path, mountpoint: Path, log: Path):
        self.backing, self.mountpoint, self.log = backing, mountpoint, log
        self.proc: subprocess.Popen | None = None
        self.figures: list[str] = []

    def mount(self, keep: float = 0.0, seed: int = 1) -> None:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([str(FORGETFS), str(self.backing), str(self.mountpoint),
                                      "--keep", str(keep), "--seed", str(seed)],
                                     stdout=out, stderr=out)
        out.close()
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mountpoint):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "docket-forgetfs did not mount in 10 s"
            time.sleep(0.02)

    def unmount(self) -> str:
        """Unmount (the processes using it are gone): what was never synced is dropped.
        Returns the file system's line of figures."""
        deadline = time.monotonic() + 20
        while True:
            run = subprocess.run(["fusermount3", "-u", str(self.mountpoint)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                break
            assert time.monotonic() < deadline, f"cannot unmount: {run.stderr}"
            time.sleep(0.1)
        self.proc.wait(timeout=30)
        lines = [x for x in self.log.read_text().splitlines() if "unmounted:" in x]
        self.figures.append(lines[-1])
        return lines[-1]


def dropped(figures: str) -> int:
    return int(figures.split(" unsynced pages dropped")[0].rsplit(" ", 1)[1])


def names_undone(figures: str) -> int:
    return int(figures.split(" name operations undone")[0].rsplit(" ", 1)[1])


def _keep_evidence(tmp_path: Path, figures: dict, lost: list, tally: Tally) -> None:
    """What a run with a line lost, a foreign record or a line under two numbers leaves for
    reading afterwards, in ``DOCKET_EVIDENCE_DIR`` (pytest keeps only its last three runs'
    folders): the figures, the agent's log, the loss journal, and every record of a line
    delivered more than once beside its first (number, offset, its first 200 bytes)."""
    out = Path(os.environ.get("DOCKET_EVIDENCE_DIR", "/tmp/docket-evidence")) / \
        f"power-cut-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("agent.log", "app.side", "forgetfs.log"):
        if (tmp_path / name).exists():
            shutil.copy(tmp_path / name, out / name)
    journal = tmp_path / "backing" / "state" / "loss-journal.jsonl"
    if journal.exists():
        shutil.copy(journal, out / journal.name)

    def shown(rec: tuple) -> list:
        return [(x.decode("latin-1") if isinstance(x, bytes) else x) for x in rec]

    renumbered = [(i, shown(a), shown(b)) for i, a, b in tally.renumbered_records()]
    (out / "figures.json").write_text(json.dumps({
        **figures, "lost_ids": lost[:1000],
        "foreign": [v.decode("latin-1") for v in tally.foreign[:100]],
        "glued": [v.decode("latin-1") for v in tally.glued[:100]],
        "again_under_a_new_number": renumbered[:1000]}, indent=1, default=str))
    print(f"evidence kept in {out}")


def side_notes(side: Path) -> tuple[set[int], int]:
    """(the ids written and never noted synced, at each cut, the highest id noted written)."""
    maybe, written, synced = set(), 0, 0
    for entry in side.read_text().splitlines():
        parts = entry.split()
        if parts[0] == "w":
            written = max(written, int(parts[2]))
        elif parts[0] == "s":
            synced = max(synced, int(parts[1]))
        elif parts[0] == "cut":
            maybe.update(range(synced, written))
    return maybe, written


def test_power_cuts_on_a_file_system_that_forgets_lose_no_synced_line(kafka, tmp_path,
                                                                      topic_name):
    _power_cuts(kafka, tmp_path, topic_name, CUTS)


@pytest.mark.soak
@pytest.mark.timeout(3600)          # ~10 min of cuts, then millions of records read back
def test_two_hundred_power_cuts_lose_no_synced_line(kafka, tmp_path, topic_name):
    figures = _power_cuts(kafka, tmp_path, topic_name, SOAK_CUTS)
    # The goal: a line the agent read before a cut arrives again only under its own number
    # (the start's check of what Kafka took, the file source's look at what the file still
    # holds after the cut): none read again under a new one.
    assert figures["renumbered"] == 0, figures


def _power_cuts(kafka, tmp_path, topic_name, cuts: int) -> dict:
    """``cuts`` cuts, 1-3 s apart; the checks of the module's docstring, one JSON line (and
    its figures returned)."""
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fs = ForgetFs(backing, mnt, tmp_path / "forgetfs.log")
    fs.mount()
    (mnt / "logs").mkdir()
    root = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(root)                                        # the folder's name durable
    os.close(root)
    bootstrap = kafka.bootstrap_servers
    ensure_topics(bootstrap, [TopicSpec(topic_name, partitions=3)])
    config = write_config(tmp_path / "agent.toml", bootstrap, mnt / "state",
                          [{"type": "file", "paths": [str(mnt / "logs" / "app.log*")],
                            "topic": topic_name}],
                          buffer={"size_bytes": 32 << 20, "slot_size_bytes": 256 << 10})
    agent = AgentProcess(config, tmp_path / "agent.log")
    side = tmp_path / "app.side"
    total = RATE * cuts * 10            # more than the run writes: the cuts end it
    rng = random.Random(SEED)

    def start_app() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(APP), str(mnt / "logs"), str(side),
                                 str(RATE), str(total), str(ROTATE_EVERY), str(SYNC_MS)])

    restarts, cut_figures, undone = [], [], []
    app = start_app()
    agent.start()
    try:
        for k in range(cuts):
            time.sleep(rng.uniform(1.0, 3.0))
            agent.kill()                                  # the power goes
            app.kill()
            app.wait(10)
            with open(side, "a") as f:
                f.write("cut\n")
            figures = fs.unmount()
            cut_figures.append(dropped(figures))
            undone.append(names_undone(figures))
            keep = 0.5 if k % 2 else 0.0
            fs.mount(keep=keep, seed=SEED * 100 + k)      # the host comes back
            t0 = time.monotonic()
            app = start_app()
            agent.start()
            restarts.append(round(time.monotonic() - t0, 2))
        time.sleep(2)
        app.kill()
        app.wait(10)
        with open(side, "a") as f:
            f.write("cut\n")                              # the last batch: maybe, as at a cut
        maybe, written = side_notes(side)
        required = [i for i in range(written) if i not in maybe]
        tally = Tally()

        def see(msg) -> None:
            tally.see(dict(msg.headers() or []).get("docket-seq"), msg.offset(), msg.value())

        counts = consume_counts(bootstrap, topic_name, len(required), max(300, 3 * cuts),
                                line_id, on_msg=see)
        status = agent.status()
    finally:
        if agent.alive():
            agent.stop()
        if app.poll() is None:
            app.kill()
        if fs.proc is not None and fs.proc.poll() is None:
            fs.unmount()
    journal = backing / "state" / "loss-journal.jsonl"
    entries = [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() \
        else []
    lost = [i for i in required if counts.get(i, 0) == 0]
    ids = {k: c for k, c in counts.items() if isinstance(k, int)}
    duplicates = sum(c - 1 for c in ids.values() if c > 1)
    figures = {
        "cuts": cuts, "written": written, "required": len(required),
        "written_unsynced_at_cuts": len(maybe),
        "unsynced_delivered": sum(1 for i in maybe if ids.get(i)),
        "delivered_distinct": len(ids), "lost_silently": len(lost),
        "duplicates": duplicates, **tally.figures(),
        "journaled": Counter(e["reason"] for e in entries),
        "pages_dropped_per_cut": cut_figures, "names_undone_per_cut": undone,
        "restart_s": restarts,
        "backlog_at_end": (status or {}).get("backlog"),
    }
    print(json.dumps(figures))
    if lost or tally.foreign or figures["renumbered"]:
        _keep_evidence(tmp_path, figures, lost, tally)
    assert not lost, f"{len(lost)} synced line(s) never delivered, first {lost[:5]}: {figures}"
    # Every record that is not one line whole holds what a cut left of the log: zeros of a hole,
    # or the first bytes of a line with the next line written after the cut.
    assert not tally.foreign, \
        f"records that are no line the application wrote: {tally.foreign[:3]}"
    assert not set(ids) - set(range(written)), "ids never written arrived"
    # The cuts were real: the file system dropped unsynced pages at each one, and the
    # application's log lost a tail that was written and not synced at some.
    assert len(cut_figures) == cuts and all(n > 0 for n in cut_figures), figures
    assert len(maybe) > 0, figures
    assert sum(undone) > 0, f"no cut undid a name (a rotation's, not yet synced): {figures}"
    return figures
