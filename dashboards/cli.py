"""``docket-dashboard --db FILE [--listen 127.0.0.1:8642] [--config reconcile.toml]``: the
audit dashboard over the reconciler's database (and, with ``--config``, its tier graph).

It listens on 127.0.0.1 unless told otherwise, and refuses an address other machines can reach
unless every request must carry a token (``--token-file``, or ``DOCKET_DASHBOARD_TOKEN``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from importlib.metadata import version
from pathlib import Path

from docket_common.errors import DocketError, print_error
from docket_common.settings import EX_CONFIG, ConfigError, host_port, is_loopback

DEFAULT_LISTEN = "127.0.0.1:8642"


class DashboardError(DocketError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-dashboard",
        description="The docket audit dashboard: completeness per topic, window and tier, "
        "from the reconciler's database.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    p.add_argument("--db", type=Path, required=True, help="the reconciler's SQLite database")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT (default %(default)s)")
    p.add_argument("--token-file", type=Path, default=None,
                   help="a file holding the token every request must carry (Bearer, or the "
                   "basic-auth password); or set DOCKET_DASHBOARD_TOKEN")
    p.add_argument("--config", type=Path, default=None,
                   help="the reconciler's config: what feeds each tier (the hops' names, the "
                   "tiers' order), and a hand resolution notifies its channels")
    return p


def listen_address(text: str) -> tuple[str, int]:
    address = host_port(text)
    if address is None or address[1] == 0:
        raise DashboardError(f"--listen {text!r}: expected HOST:PORT",
                             hint=f"e.g. --listen {DEFAULT_LISTEN}")
    return address[0].strip("[]") or "0.0.0.0", address[1]


def read_token(path: Path | None) -> str | None:
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise DashboardError(f"--token-file {path}: {exc.strerror}") from None
    else:
        token = os.environ.get("DOCKET_DASHBOARD_TOKEN", "").strip()
        if not token:
            return None
    if len(token) < 16:
        raise DashboardError(f"the token ({path or 'DOCKET_DASHBOARD_TOKEN'}) is shorter than "
                             "16 characters")
    return token


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    try:
        host, port = listen_address(args.listen)
        token = read_token(args.token_file)
        if not is_loopback(host) and not token:
            raise DashboardError(
                f"--listen {args.listen} can be reached from other machines, and no token is set",
                hint="give --token-file FILE (or DOCKET_DASHBOARD_TOKEN), or listen on 127.0.0.1")
        if not args.db.is_file():
            raise DashboardError(f"no reconciler database at {args.db}",
                                 hint="name the --db of docket-audit reconcile")
        import uvicorn

        from .app import LOOPBACK_HOSTS, create_app

        app = create_app(args.db, token=token, config=args.config,
                         hosts=sorted({*LOOPBACK_HOSTS, host}))
    except ConfigError as exc:           # the reconciler's config
        print_error(exc, f"docket-dashboard --config {args.config}")
        return EX_CONFIG
    except DocketError as exc:
        print_error(exc, "docket-dashboard")
        return EX_CONFIG
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    # SIGTERM/SIGINT: finish the requests in progress and exit 0 (uvicorn's own handling
    # raises the signal again once stopped, which ends the process with -15).
    server.capture_signals = contextlib.nullcontext
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    print(f"docket dashboard on http://{host}:{port}/ (database {args.db})", flush=True)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
