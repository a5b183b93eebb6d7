"""``docket-agent``: run, validate a configuration, show a running agent's status."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import version

from .buffer import PoolError
from .config import EX_CONFIG, ConfigError, load


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-agent",
        description="The docket host agent: tails application event files into a crash-safe "
        "mmap'd buffer pool and ships them to Kafka.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run in the foreground (systemd Type=notify)")
    run.add_argument("--config", required=True, help="the agent's TOML configuration")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    val = sub.add_parser("validate", help="check a configuration; exit 0, or 78 with the key")
    val.add_argument("--config", required=True)
    st = sub.add_parser("status", help="rates, pool, backlog, files and broker of a running agent")
    st.add_argument("--config", help="read status.listen from this configuration")
    st.add_argument("--url", help="status address, default http://127.0.0.1:9464")
    st.add_argument("--json", action="store_true", help="print the JSON as served")
    return p


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
    print(f"  pool      {pool['occupancy']:.1%} occupied: {pool['free_slots']} free, "
          f"{pool['filling_slots']} filling, {pool['sealed_slots']} sealed, "
          f"{pool['spilled_slots']} spilled of {pool['slot_count']} slots")
    age = backlog["oldest_unacked_event_age_s"]
    print(f"  backlog   {backlog['events']} events, {backlog['bytes']} bytes, oldest sealed "
          f"{backlog['oldest_unacked_age_s']:.1f} s ago"
          + (f", oldest event {age:.1f} s old" if age is not None else ""))
    print(f"  broker    {broker['state']} ({broker['bootstrap_servers']}), "
          f"{broker['outages']:.0f} outage(s)")
    journal = data["loss_journal"]
    print(f"  dropped   {data['dropped_events']:.0f} events; loss journal "
          f"{journal['entries']:.0f} entries ({journal['unknown_size']:.0f} of unknown size), "
          f"{journal['path']}")
    audit = data["audit"]
    if not audit["enabled"]:
        print("  audit     off ([audit] enabled = false)")
    else:
        last = audit["last_emission_ms"]
        when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last / 1000))
                if last else "none yet")
        print(f"  audit     to {audit['topic']}: last emission {when}, seq {audit['seq']}")
    for path, f in sorted(data["files"].items()):
        print(f"  file      {path}: {f['lag_bytes']} bytes behind")
    waiting = data["files_waiting"]
    for path, why in sorted(waiting["unreadable"].items()):
        print(f"  file      {path}: cannot be read ({why}); tried again at every scan")
    for o in waiting["orphans_waiting"]:
        state = "journaled, still matched" if o["journaled"] else "waiting"
        print(f"  orphan    {o['path']}: truncated or gone after {o['offset']} bytes read, "
              f"{o['unread_bytes']} unread; a copy of it is awaited ({state})")
    for path in waiting["copies_held"]:
        print(f"  copy      {path}: held until its original is truncated or left as is")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            cfg = load(args.config)
            print(f"{args.config}: ok ({len(cfg.sources)} source(s), agent id {cfg.agent_id})")
            return 0
        if args.command == "status":
            return _status(args)
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("apscheduler").setLevel(logging.WARNING)     # one line per job run
        from .service import Agent, StartupError

        cfg = load(args.config)
        try:
            agent = Agent(cfg)
            agent.install_signals()
            return agent.run()
        except (PoolError, StartupError) as exc:
            print(f"docket-agent: error: {exc}", file=sys.stderr)
            if exc.hint:
                print(f"  hint: {exc.hint}", file=sys.stderr)
            return 1
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EX_CONFIG


if __name__ == "__main__":
    sys.exit(main())
