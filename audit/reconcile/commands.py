"""The reconciler's commands in ``docket-audit``: reconcile, watermark, validate, alerts."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path

from audit.contract.errors import AuditError
from docket_common.formats import utc_iso as _iso
from docket_common.settings import EX_CONFIG, ConfigError

from . import config as rconfig
from .store import Store
from .watermark import watermark

DURATION = re.compile(r"\+(\d+)([smhd])")
UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def add_parsers(sub) -> None:
    r = sub.add_parser("reconcile", help="consume the audit topic into SQLite, judge windows, "
                       "raise and deliver alerts")
    r.add_argument("--db", required=True, type=Path, help="the reconciler's SQLite database")
    r.add_argument("--config", type=Path, default=None, help="the reconciler's TOML config")
    r.add_argument("--bootstrap-servers", default=None,
                   help="where the audit topic lives (overrides reconcile.bootstrap_servers)")
    r.add_argument("--audit-topic", default=None, help="overrides reconcile.audit_topic")
    r.add_argument("--once", action="store_true", help="read the audit topic to its current "
                   "end, evaluate, deliver due notifications once, and exit")
    w = sub.add_parser("watermark", help="the completeness watermark of a topic at a tier: "
                       "every window before it is final and complete")
    w.add_argument("--db", required=True, type=Path)
    w.add_argument("--topic", required=True)
    w.add_argument("--tier", required=True)
    w.add_argument("--json", action="store_true")
    v = sub.add_parser("validate", help="check a reconciler config file (exit 78 when wrong)")
    v.add_argument("--config", required=True, type=Path)
    a = sub.add_parser("alerts", help="list alerts; snooze or resolve one")
    a.add_argument("--db", required=True, type=Path)
    a.add_argument("--config", type=Path, default=None,
                   help="routes the resolved notification of `resolve`")
    a.add_argument("--status", default="open", choices=("open", "resolved", "all"))
    a.add_argument("--json", action="store_true")
    a.add_argument("--snooze", type=int, metavar="ID", help="snooze alert ID's condition")
    a.add_argument("--until", default="+1h", help="snooze until: +30m, +2h, +1d or an ISO time")
    a.add_argument("--resolve", type=int, metavar="ID", help="resolve alert ID by hand")
    a.add_argument("--by", default="cli", help="who snoozes or resolves (recorded)")


def _config(path: Path | None) -> rconfig.ReconcileConfig:
    return rconfig.load(path) if path is not None else rconfig.parse({})


def run(args) -> int:
    if args.command == "validate":
        try:
            cfg = rconfig.load(args.config)
            cfg.security.check_files()
        except ConfigError as exc:
            print(exc.render(), file=sys.stderr)
            return EX_CONFIG
        print(f"{args.config}: OK ({len(cfg.owners)} owners, {len(cfg.channels)} channels)")
        return 0
    if args.command == "reconcile":
        return _reconcile(args)
    if args.command == "watermark":
        return _watermark(args)
    return _alerts(args)


def _reconcile(args) -> int:
    from .service import Reconciler

    try:
        cfg = _config(args.config)
        cfg.security.check_files()
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EX_CONFIG
    if args.bootstrap_servers:
        cfg.values["reconcile.bootstrap_servers"] = args.bootstrap_servers
    if args.audit_topic:
        cfg.values["reconcile.audit_topic"] = args.audit_topic
    # Asked to stop while it opens its database: it stops cleanly once open (exit 0), not
    # killed by the signal's default action half-way.
    stop = threading.Event()
    if not args.once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    rec = Reconciler(cfg, args.db, stop_event=stop)
    if args.once:
        result = rec.run_once()
        print(json.dumps({"windows": result.windows, "fired": result.fired,
                          "resolved": result.resolved, "applied": rec.applied}))
        return 0
    rec.run()
    return 0


def _watermark(args) -> int:
    store = Store(args.db)
    try:
        mark = watermark(store, args.topic, args.tier)
    finally:
        store.close()
    iso = None if mark is None else _iso(mark)
    if args.json:
        print(json.dumps({"topic": args.topic, "tier": args.tier, "watermark": mark,
                          "watermark_iso": iso}))
    else:
        print(iso or "none: no window of this topic is final and complete at this tier yet")
    return 0


def _alerts(args) -> int:
    store = Store(args.db)
    now = int(time.time() * 1000)
    try:
        if args.snooze is not None:
            from .alerts.lifecycle import snooze
            until = _until(args.until, now)
            try:
                snooze(store, args.snooze, until, args.by, now)
            except LookupError as exc:
                raise AuditError(str(exc), hint="list them with docket-audit alerts --db FILE") \
                    from None
            print(f"alert {args.snooze} snoozed until {_iso(until)}")
            return 0
        if args.resolve is not None:
            from .alerts.lifecycle import resolve_by_hand
            try:
                resolve_by_hand(store, _config(args.config), args.resolve, args.by, now)
            except LookupError as exc:
                raise AuditError(str(exc), hint="list them with docket-audit alerts --db FILE") \
                    from None
            print(f"alert {args.resolve} resolved")
            return 0
        from .alerts.lifecycle import alerts
        rows = alerts(store, args.status, now, newest_first=False)
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        print(f"#{r['id']} {r['status']:8} {r['kind']:17} {_iso(r['fired_at'])}  {r['summary']}")
    if not rows:
        print(f"no {args.status if args.status != 'all' else ''} alerts".replace("  ", " "))
    return 0


def _until(text: str, now_ms: int) -> int:
    m = DURATION.fullmatch(text)
    if m:
        return now_ms + int(m.group(1)) * UNIT_MS[m.group(2)]
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise AuditError(f"--until {text!r} is neither +N[smhd] nor an ISO time",
                         hint="e.g. --until +2h or --until 2026-11-24T08:00Z") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)
