"""Records Kafka refused for good: one JSON line each in ``dead-letter/dead-letter.jsonl``
(topic, time, error, the slot, key, value and headers in base64), fsync'd before the drain
journals the loss and frees the record's slot. A line the file system refuses is cut off again
and the error raised: the drain keeps the record (``Drain.failed``).
"""

from __future__ import annotations

import base64
import errno
import json
import os
from pathlib import Path

from confluent_kafka import KafkaError

from ..buffer.durable import make_folder, open_created
from .headers import Record

FILE_NAME = "dead-letter.jsonl"


def write_dead_letter(folder: Path, record: Record, err: KafkaError, slot_seq: int) -> None:
    """Append ``record`` (refused with ``err``, from the slot ``slot_seq``) to ``folder``'s
    dead-letter file, durably."""
    topic, value, key, ts, headers = record
    make_folder(folder)
    entry = {"topic": topic, "timestamp_ms": ts, "error": err.str(), "code": err.name(),
             "slot_seq": slot_seq,
             "key_b64": base64.b64encode(key).decode() if key is not None else None,
             "value_b64": base64.b64encode(value or b"").decode(),
             "headers": [[k, base64.b64encode(v or b"").decode()] for k, v in headers or []]}
    line = (json.dumps(entry) + "\n").encode()
    fd = open_created(folder / FILE_NAME, os.O_WRONLY | os.O_APPEND, 0o640)
    try:
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, line) < len(line):
                raise OSError(errno.ENOSPC, "No space left on device (a short write)")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)           # no half line stays behind
            raise
    finally:
        os.close(fd)
