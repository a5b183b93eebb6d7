"""``docket-agent``: command-line entry point."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-agent",
        description="The docket host agent: tails application event files into a crash-safe "
        "mmap'd buffer pool and ships them to Kafka.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    return p


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    _parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
