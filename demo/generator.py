"""An application that writes event logs, for the demo: JSON lines into two files, rotated.

``python -m demo.generator DIR [--rate N]`` writes ``DIR/app.log`` (application events),
``DIR/access.log`` (HTTP access events) and ``DIR/payments.log`` (payment transactions) at
about N lines/s in all, each line with an RFC 3339 ``ts``, a ``user`` and a few realistic
fields. Every ``--rotate-lines`` lines a file is rotated the way logrotate's default does it
(rename to ``.1``, older ones shifted, three kept, a new file created); SIGUSR1 rotates every
file at once (the demo's fault drill). SIGTERM ends it after the line it is writing.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

SERVICES = ("checkout", "search", "profile", "catalog", "payments")
PATHS = ("/", "/search", "/item/{}", "/cart", "/checkout", "/api/v1/items/{}", "/login")
MESSAGES = ("order placed", "cart updated", "search served", "profile viewed",
            "payment authorised", "payment declined", "session started", "cache miss")
KEEP = 3


class RotatingFile:
    def __init__(self, path: Path, rotate_lines: int):
        self.path = path
        self.rotate_lines = rotate_lines
        self.lines = 0
        self.f = open(path, "ab")

    def write(self, line: bytes) -> None:
        self.f.write(line)
        self.lines += 1
        if self.lines >= self.rotate_lines:
            self.rotate()

    def rotate(self) -> None:
        self.f.close()
        for i in range(KEEP - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self.f = open(self.path, "ab")
        self.lines = 0

    def flush(self) -> None:
        self.f.flush()


def app_event(rng: random.Random, now: datetime) -> dict:
    return {"ts": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": rng.choices(("INFO", "WARN", "ERROR"), (90, 8, 2))[0],
            "service": rng.choice(SERVICES), "user": f"u{rng.randrange(5000)}",
            "msg": rng.choice(MESSAGES), "latency_ms": round(rng.lognormvariate(3, 0.6), 1)}


def access_event(rng: random.Random, now: datetime) -> dict:
    return {"ts": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "user": f"u{rng.randrange(5000)}", "method": rng.choice(("GET", "GET", "POST")),
            "path": rng.choice(PATHS).format(rng.randrange(10_000)),
            "status": rng.choices((200, 304, 404, 500), (85, 8, 5, 2))[0],
            "bytes": rng.randrange(200, 40_000)}


def payment_event(rng: random.Random, now: datetime) -> dict:
    return {"ts": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "user": f"u{rng.randrange(5000)}", "txn": f"t{rng.getrandbits(48):012x}",
            "amount_cents": rng.randrange(100, 50_000), "currency": rng.choice(("EUR", "USD")),
            "outcome": rng.choices(("authorised", "declined"), (95, 5))[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.generator")
    p.add_argument("dir", type=Path)
    p.add_argument("--rate", type=float, default=200.0, help="lines per second, both files")
    p.add_argument("--rotate-lines", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    stop, rotate = [], []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: rotate.append(1))
    rng = random.Random(args.seed)
    files = [(RotatingFile(args.dir / name, args.rotate_lines), make, share)
             for name, make, share in (("access.log", access_event, 0.5),
                                       ("app.log", app_event, 0.35),
                                       ("payments.log", payment_event, 0.15))]
    start, n = time.monotonic(), 0
    while not stop:
        now = datetime.now(UTC)
        out, make, _ = rng.choices(files, [share for *_, share in files])[0]
        out.write(json.dumps(make(rng, now)).encode() + b"\n")
        n += 1
        if n % 50 == 0:
            for f, *_ in files:
                f.flush()
            if rotate:
                rotate.clear()
                for f, *_ in files:
                    f.rotate()
            ahead = n / args.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    for f, *_ in files:
        f.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
