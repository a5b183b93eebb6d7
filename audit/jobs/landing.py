"""Each micro-batch of ``land --dedup`` lands in the table once, however often it runs.

Spark's file sink cannot take the deduplicating step's second output (the copies it skipped,
for the audit topic), so ``land --dedup`` writes through ``foreachBatch`` and commits each batch
itself:

1. The batch is written by Spark into ``WAREHOUSE/_staging/{incarnation}-{query}-{batch}``,
   partitioned like the table; Spark's batch commit ends with ``_SUCCESS``.
2. Its files are moved, one ``rename`` each (atomic: a reader sees a whole file or none), into
   ``WAREHOUSE/data/topic=…/date=…/hour=…`` under names that carry the job's incarnation, the
   land query's id and the batch id, so no two batches, and no two checkpoints, can collide
   (and a file of the table is never replaced).
3. ``docket-landed`` in the land query's checkpoint (``CHECKPOINT/land``) is replaced (write,
   then rename) by the batch id, and the staging folder removed.

Spark runs a batch again after a crash only if its own commit log does not have it; then:
``docket-landed`` already says it — nothing to do; a staging folder with ``_SUCCESS`` — the
moves are finished (files moved already are gone from staging, and never written twice); a
staging folder without ``_SUCCESS`` — nothing of it is in the table: written again. The
counting query reads ``data/`` as a file stream, which takes each file once: the warehouse
tier counts exactly what landed.

This holds against a process dying at any point (the fault the tests inject), not against the
machine losing power before the file system wrote its metadata (no ``fsync`` here).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..contract.errors import AuditError

log = logging.getLogger("docket.audit")

MODE_FILE = "_landing"            # in WAREHOUSE: how this table is landed
DEDUP_MODE, FILE_SINK_MODE = "dedup", "file-sink"


class LandingError(AuditError):
    pass


def claim_mode(warehouse: Path, mode: str) -> None:
    """Record how ``warehouse`` is landed, or refuse another way: a table landed by Spark's
    file sink is read through its ``_spark_metadata`` log, which would hide every file landed
    here, and the other way round the log would hide nothing that is not there."""
    path = warehouse / MODE_FILE
    try:
        have = path.read_text().strip()
    except FileNotFoundError:
        if mode == DEDUP_MODE and (warehouse / "data" / "_spark_metadata").exists():
            have = FILE_SINK_MODE        # landed before this file existed
        else:
            warehouse.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(MODE_FILE + ".tmp")
            tmp.write_text(mode + "\n")
            tmp.replace(path)
            return
    if have != mode:
        raise LandingError(
            f"{warehouse} was landed {'with' if have == DEDUP_MODE else 'without'} --dedup; "
            "a table cannot mix both",
            hint="land into another --warehouse, or run the job as it ran before")


class BatchLanding:
    """``query_checkpoint``: the land query's own checkpoint folder. The marker lives in it,
    and the names of the files landed carry its query id, so a query checkpoint started again
    (its batch ids from 0) neither skips its batches nor overwrites the earlier files."""

    def __init__(self, warehouse: Path, query_checkpoint: Path, incarnation: str):
        self.data = warehouse / "data"
        self.staging = warehouse / "_staging"
        self.query_checkpoint = query_checkpoint
        self.marker = query_checkpoint / "docket-landed"
        self.incarnation = incarnation
        self._prefix: str | None = None
        for d in (self.data, self.staging, query_checkpoint):
            d.mkdir(parents=True, exist_ok=True)

    @property
    def prefix(self) -> str:
        """``{incarnation}-{query id}``: what the batch's folders and files are named after
        (Spark writes the query id into the checkpoint's ``metadata`` when it starts)."""
        if self._prefix is None:
            try:
                qid = json.loads((self.query_checkpoint / "metadata").read_text())["id"]
                self._prefix = f"{self.incarnation}-{qid[:8]}"
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                self._prefix = self.incarnation
        return self._prefix

    def committed(self) -> int:
        """The last batch landed, -1 before the first."""
        try:
            return int(self.marker.read_text())
        except FileNotFoundError:
            return -1

    def land(self, batch_id: int, write: Callable[[Path], None]) -> int | None:
        """Land batch ``batch_id``: ``write(folder)`` writes its rows there as a partitioned
        Parquet table. Returns the files moved into the table, None when the batch was landed
        before."""
        if batch_id <= self.committed():
            return None
        stage = self.staging / f"{self.prefix}-{batch_id}"
        if not (stage / "_SUCCESS").exists():
            shutil.rmtree(stage, ignore_errors=True)
            write(stage)
            if not (stage / "_SUCCESS").exists():
                raise LandingError(f"batch {batch_id} written to {stage} without _SUCCESS")
        moved = self._move(stage, batch_id)
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_text(f"{batch_id}\n")
        tmp.replace(self.marker)
        self._clean(batch_id)
        return moved

    def _move(self, stage: Path, batch_id: int) -> int:
        moved = 0
        for path in sorted(stage.rglob("*")):
            rel = path.relative_to(stage)
            if not path.is_file() or any(p.startswith(("_", ".")) for p in rel.parts):
                continue                  # _SUCCESS, Spark's .crc files, _temporary
            dest = self.data / rel.parent / f"{self.prefix}-b{batch_id}-{path.name}"
            if dest.exists():             # never replace a file of the table
                raise LandingError(f"{dest} is in the table already; batch {batch_id} of "
                                   f"{stage} is not landed over it",
                                   hint="is a second land job writing into this warehouse?")
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, dest)
            moved += 1
        return moved

    def _clean(self, batch_id: int) -> None:
        """Remove this query's staging folders up to ``batch_id`` (landed)."""
        prefix = f"{self.prefix}-"
        for d in self.staging.iterdir():
            if d.name.startswith(prefix):
                try:
                    n = int(d.name[len(prefix):])
                except ValueError:
                    continue
                if n <= batch_id:
                    shutil.rmtree(d, ignore_errors=True)
