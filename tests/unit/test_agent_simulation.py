"""The agent — file source, pool, state database, journal, drain — against a writer rotating its
file every way logrotate does, killed at any step, with writer steps raced into the agent's own
calls (``simkit.py`` describes the simulation and what each run asserts).

Every seed asserts: no id lost (delivered, or inside a loss-journal entry, or never knowable to
the agent), and no id delivered more often than the slots that could have been in flight at
the kills allow. ``DOCKET_SIM_SEEDS`` sets how many seeds run (CI: the default below);
``DOCKET_SIM_SEED=N`` runs one seed, for reproducing a failure, in the test's own process
(``DOCKET_SIM_SEND_PATH=native`` with the native send path's drain). A
chunk's seeds run in one process per core (each seed is independent and single-threaded; a
seed's outcome does not depend on where it runs); a seed that hangs fails its chunk, naming
it."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import tempfile
from pathlib import Path

import pytest

from tests.unit.simkit import run_seed

SEEDS = int(os.environ.get("DOCKET_SIM_SEEDS", "1200"))
# The native send path's drain (``NativeDrain``, over the extension's fake: tests/unit/
# fakenative.py) on the seeds from 0 too: the same writers and kills, the other send path.
NATIVE_SEEDS = int(os.environ.get("DOCKET_SIM_NATIVE_SEEDS", "200"))
CHUNK = 100
ONE = os.environ.get("DOCKET_SIM_SEED")
ONE_PATH = os.environ.get("DOCKET_SIM_SEND_PATH", "python")
CHUNKS = [(ONE_PATH, int(ONE), int(ONE) + 1)] if ONE else \
    [(path, a, min(a + CHUNK, n)) for path, n in (("python", SEEDS), ("native", NATIVE_SEEDS))
     for a in range(0, n, CHUNK)]


SEED_TIMEOUT_S = 120      # one seed takes well under a second; a hung one fails its test


def _quiet() -> None:
    """A worker's logging: none (the test asserts outcomes; in-process, pytest keeps them)."""
    logging.disable(logging.CRITICAL)


@pytest.fixture(scope="module")
def workers():
    """One process per core (started once for the file: ``spawn``, not a fork of pytest's
    threads), or none on one core. Terminated at the end, a hung seed's worker too."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2 or ONE:
        yield None
        return
    pool = multiprocessing.get_context("spawn").Pool(cores, initializer=_quiet)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


@pytest.fixture
def scratch(tmp_path):
    """A tmpfs folder when there is one (the runs write and fsync many small files)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="docket-sim-") as d:
            yield Path(d)
    else:
        yield tmp_path


@pytest.mark.parametrize("chunk", CHUNKS, ids=lambda c: f"{c[0]}-seeds-{c[1]}-{c[2] - 1}")
def test_no_id_is_lost_and_duplicates_stay_within_the_slots_in_flight_at_kills(scratch, workers,
                                                                             chunk):
    path, seeds = chunk[0], range(chunk[1], chunk[2])
    if workers is None:
        outcomes = [run_seed(scratch, seed, send_path=path) for seed in seeds]
    else:
        runs = [(seed, workers.apply_async(run_seed, (scratch, seed), {"send_path": path}))
                for seed in seeds]
        outcomes = []
        for seed, run in runs:
            try:
                outcomes.append(run.get(SEED_TIMEOUT_S))
            except multiprocessing.TimeoutError:
                pytest.fail(f"seed {seed} still running after {SEED_TIMEOUT_S} s "
                            f"(DOCKET_SIM_SEED={seed} DOCKET_SIM_SEND_PATH={path} replays it)")
    bad = [o for o in outcomes if not o.ok]
    figures = {"seeds": len(outcomes), "ids": sum(o.written for o in outcomes),
               "kills": sum(o.kills for o in outcomes),
               "lost": sum(len(o.lost) for o in outcomes),
               "duplicates": sum(c - 1 for o in outcomes for c in o.delivered.values() if c > 1),
               "over_bound": sum(len(o.excess) for o in outcomes),
               "journaled": sum(len(o.journal) for o in outcomes)}
    print(json.dumps(figures))
    # The runs must have done what they are for: kills, and duplicates to bound.
    assert figures["kills"] > len(outcomes) and figures["ids"] > 500 * len(outcomes)
    assert not bad, "\n".join(o.summary() for o in bad[:3])
