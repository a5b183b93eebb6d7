"""``docket-agent``: run, validate a configuration, show a running agent's status."""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import urllib.error
import urllib.request
from importlib.metadata import version

from docket_common.errors import print_error
from docket_common.formats import utc_text

from .buffer import PoolError, PoolFormatError, PoolGeometryMismatch
from .config import EX_CONFIG, ConfigError, default_toml, load
from .state.journal import read_entries

DEFAULT_CONFIG = "/etc/docket/agent.toml"           # where the package installs it


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-agent",
        description="The docket host agent: tails application event files into a crash-safe "
        "mmap'd buffer pool and ships them to Kafka.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run in the foreground (systemd Type=notify)")
    run.add_argument("--config", default=DEFAULT_CONFIG,
                     help=f"the agent's TOML configuration (default {DEFAULT_CONFIG})")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    run.add_argument("--log-format", default="text", choices=("text", "json"),
                     help="text lines, or one JSON object per line for log pipelines")
    val = sub.add_parser("validate", help="check a configuration, the producer settings, the "
                         "state folder and the disk; exit 0, or 78 with the key")
    val.add_argument("--config", default=DEFAULT_CONFIG,
                     help=f"the agent's TOML configuration (default {DEFAULT_CONFIG})")
    st = sub.add_parser("status", help="rates, pool, backlog, files and broker of a running agent")
    st.add_argument("--config", help="read status.listen from this configuration")
    st.add_argument("--url", help="status address, default http://127.0.0.1:9464")
    st.add_argument("--json", action="store_true", help="print the JSON as served")
    sub.add_parser("default-config", help="print the configuration a package installs: every "
                   "setting with its default and meaning, one source to edit")
    loc = sub.add_parser("locate", help="where events came from, by record number (docket-seq)")
    loc.add_argument("--config", default=DEFAULT_CONFIG,
                     help=f"the agent's TOML configuration (default {DEFAULT_CONFIG})")
    loc.add_argument("--seq", required=True, type=_seq_range,
                     help="a record number N, or a range A-B (inclusive)")
    loc.add_argument("--json", action="store_true", help="one JSON object per run of records")
    return p


def _seq_range(text: str) -> tuple[int, int]:
    try:
        a, _, b = text.partition("-")
        first, last = int(a), int(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N or A-B (record numbers)") \
            from None
    if first < 0 or last < first:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A-B with 0 <= A <= B")
    return first, last


def _locate(args) -> int:
    """Read the agent's state database (read-only; the agent may be running)."""
    import sqlite3

    from .state.db import StateDB

    cfg = load(args.config)
    first, last = args.seq
    path = cfg.state_db_path
    if not path.exists():
        print(f"docket-agent: no state database at {path}", file=sys.stderr)
        return 3
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        incarnation = db.execute("SELECT incarnation, next_record FROM identity").fetchone()
        runs = StateDB.runs_between(db, first, last)
        floor = db.execute("SELECT MIN(first_record) FROM locate").fetchone()[0]
    except sqlite3.OperationalError as exc:
        print(f"docket-agent: {path} has no record-number map ({exc}); it was written by an "
              "agent that did not number records", file=sys.stderr)
        return 3
    finally:
        db.close()
    journal = [e for e in read_entries(cfg.journal_path)
               if e.get("records") and e["records"][0] <= last and e["records"][1] >= first]
    if args.json:
        for run in runs:
            print(json.dumps(run))
        for e in journal:
            print(json.dumps({"journal": e}))
        return 0
    inc, nxt = incarnation
    print(f"agent {cfg.agent_id}, incarnation {inc}: records {first}-{last} "
          f"(numbers given so far: 0-{nxt - 1})")
    for run in runs:
        a, b = run["first_record"], run["first_record"] + run["records"] - 1
        when = utc_text(run["sealed_ms"])
        if run["source_id"] is None:
            where = "a socket source"
        else:
            where = (f"{run['path']} (inode {run['ino']}, source {run['source_id']}) bytes "
                     f"[{run['start']}, {run['end']})")
            if not run["exact"]:
                where += " (somewhere in: the slot was found at start; its runs were not stored)"
        print(f"  {a}-{b}  topic {run['topic']}: {where}, sealed {when}")
    for e in journal:
        a, b = e["records"]
        print(f"  {a}-{b}  journalled: {e['reason']} ({e['detail']})")
    covered = sorted([(r["first_record"], r["first_record"] + r["records"] - 1) for r in runs]
                     + [tuple(e["records"]) for e in journal])
    gaps, at = [], first
    for a, b in covered:
        if a > at:
            gaps.append((at, min(a - 1, last)))
        at = max(at, b + 1)
    if at <= last:
        gaps.append((at, last))
    for a, b in gaps:
        if b >= nxt:
            why = "not given yet" if a >= nxt else f"{nxt}-{b} not given yet"
        elif floor is None or b < floor:
            why = "older than the map (agent.locate_retention_ms)"
        else:
            why = "not in the map"
        print(f"  {a}-{b}  {why}")
    return 0


def _status(args) -> int:
    url = args.url
    if url is None:
        listen = load(args.config)["status.listen"] if args.config else "127.0.0.1:9464"
        url = f"http://{listen}"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=5) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        print(f"docket-agent: no agent answers at {url}: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    pool, backlog, broker = data["pool"], data["backlog"], data["broker"]
    print(f"agent {data['agent_id']} (docket {data['version']}), up {data['uptime_s']:.0f} s")
    print(f"  rates     in {data['rates']['in_events_s']:.0f} events/s, "
          f"out {data['rates']['out_events_s']:.0f} events/s")
    totals = data["totals"]
    print(f"  totals    read {totals['read_events']:.0f} events ({totals['read_bytes']:.0f} "
          f"bytes), sent {totals['sent_events']:.0f}, retried {totals['retried_events']:.0f}")
    print(f"  pool      {pool['occupancy']:.1%} occupied: {pool['free_slots']} free, "
          f"{pool['filling_slots']} filling, {pool['waiting_slots']} sealed, "
          f"{pool['sending_slots']} sending of {pool['slot_count']} slots of "
          f"{pool['slot_size_bytes']} bytes; {pool['spilled_slots']} spilled; file "
          f"{pool['path']} {pool['file_bytes']} bytes")
    age = backlog["oldest_unacked_event_age_s"]
    print(f"  backlog   {backlog['events']} events not yet acknowledged ("
          f"{backlog['filling_events']} in filling slots), {backlog['bytes']} bytes, "
          f"oldest sealed {backlog['oldest_unacked_age_s']:.1f} s ago"
          + (f", oldest event {age:.1f} s old" if age is not None else ""))
    print(f"  broker    {broker['state']} ({broker['bootstrap_servers']}, "
          f"{broker.get('security', 'plaintext')}), {broker['outages']:.0f} outage(s)")
    stall = broker.get("stall")
    if stall is not None:
        print(f"  stall     nothing acknowledged since {stall['since']} while the cluster "
              f"answers: {stall['replacements']} producer(s) replaced")
    elif broker.get("unacknowledged_s", 0) >= 10:
        print(f"  waiting   nothing acknowledged for {broker['unacknowledged_s']:.0f} s")
    if not broker["topics_checked"]:
        print("  topics    not checked yet: the cluster has not answered a metadata request")
    for topic in broker["missing_topics"]:
        how = "created by its first event" if broker["auto_create_topics"] else \
            "its events wait in the pool until it is created"
        print(f"  topic     {topic}: not on the cluster; {how}")
    if broker["weakened_delivery"]:
        print(f"  delivery  WEAKENED by librdkafka_options "
              f"{', '.join(broker['weakened_delivery'])} (broker.unsafe_weaker_delivery)")
    journal = data["loss_journal"]
    print(f"  dropped   {data['dropped_events']:.0f} events; loss journal "
          f"{journal['entries']:.0f} entries ({journal['unknown_size']:.0f} of unknown size), "
          f"{journal['path']}")
    audit = data["audit"]
    if not audit["enabled"]:
        print("  audit     off ([audit] enabled = false)")
    else:
        last = audit["last_emission_ms"]
        when = (utc_text(last)
                if last else "none yet")
        print(f"  audit     to {audit['topic']}: last emission {when}, seq {audit['seq']}")
    for path, f in sorted(data["files"].items()):
        print(f"  file      {path}: {f['lag_bytes']} bytes behind")
    for s in data.get("listeners", []):
        if s["type"] == "journald":
            print(f"  journald  {s['journal']} -> {s['topic']}: {s['entries_read']} entries read "
                  f"since the start, journalctl {s['reader']}")
            continue
        where = s["path"] if s["type"] == "socket" else \
            f"{s['protocol']}{'+tls' if s['tls'] else ''} {s['listen']}"
        what = f"{s['udp_dropped']} datagram(s) dropped by the kernel" if "udp_dropped" in s \
            else f"{s['connections']} connection(s)"
        print(f"  {s['type']:<9} {where} -> {s['topic']}: {what}")
    waiting = data["files_waiting"]
    for path, why in sorted(waiting["unreadable"].items()):
        print(f"  file      {path}: cannot be read ({why}); tried again at every scan")
    for folder, why in sorted(waiting.get("folders_away", {}).items()):
        print(f"  folder    {folder}: {why}; its known files wait for it, resumed when it is back")
    for o in waiting["orphans_waiting"]:
        state = "journaled, still matched" if o["journaled"] else "waiting"
        print(f"  orphan    {o['path']}: truncated or gone after {o['offset']} bytes read, "
              f"{o['unread_bytes']} unread; a copy of it is awaited ({state})")
    for path in waiting["copies_held"]:
        print(f"  copy      {path}: held until its original is truncated or left as is")
    if waiting.get("ignored_older"):
        print(f"  files     {waiting['ignored_older']} not opened: last changed before "
              "ignore_older_ms; read once they change")
    for path in waiting.get("compressed", []):
        print(f"  file      {path}: compressed, not read as lines (exclude it from the globs)")
    return 0


def main(argv: list[str] | None = None, seams=None) -> int:
    """``seams``: a test's stand-ins for the agent's parts (``service.Seams``)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            from .preflight import check, describe_pool, send_path

            cfg = load(args.config)
            check(cfg)
            for where, message in cfg.warnings:
                print(f"{args.config}: warning: {where}: {message}", file=sys.stderr)
            path, why = send_path(cfg)
            print(f"{args.config}: ok ({len(cfg.sources)} source(s), agent id {cfg.agent_id}, "
                  f"{describe_pool(cfg)}; send path {path}: {why})")
            return 0
        if args.command == "default-config":
            print(default_toml(), end="")
            return 0
        if args.command == "status":
            return _status(args)
        if args.command == "locate":
            return _locate(args)
        from . import logs
        from .preflight import check

        logs.setup(args.log_level, args.log_format)
        from .errors import StartupError
        from .service import Agent
        from .state.diskguard import disk_full
        from .state.folder import StateFolderRefused

        cfg = load(args.config)
        check(cfg)                  # what would fail below fails here, as validate says it
        for where, message in cfg.warnings:
            logging.getLogger("docket.agent").warning("config %s: %s", where, message)
        agent = None

        def failed() -> str:        # an error out of it: at its start, or once it shipped
            return "stopped by an error" if agent is not None and agent.shipping \
                else "cannot start"

        try:
            agent = Agent(cfg, seams=seams)
            agent.install_signals()
            return agent.run()
        except (PoolFormatError, PoolGeometryMismatch, StateFolderRefused) as exc:
            # What only a person can settle (the pool's format or geometry, the state folder's
            # owner): 78, which systemd does not restart in a loop (RestartPreventExitStatus).
            print_error(exc, "docket-agent: error")
            return EX_CONFIG
        except (PoolError, StartupError) as exc:
            print_error(exc, "docket-agent: error")
            return 1
        except sqlite3.Error as exc:
            if not disk_full(exc):
                raise
            logging.getLogger("docket.agent").error(
                "%s: the state folder's file system is full (%s); free space there",
                failed(), exc)
            return 1
        except OSError as exc:      # the state folder or the pool file, refused by the system
            logging.getLogger("docket.agent").error(
                "%s: %s%s", failed(), exc.strerror or exc,
                f" ({exc.filename})" if getattr(exc, "filename", None) else "",
                exc_info=getattr(exc, "filename", None) is None)   # no file: where it came from
            return 1
    except ConfigError as exc:
        print_error(exc)
        return EX_CONFIG


if __name__ == "__main__":
    sys.exit(main())
