"""``docket-audit``: command-line entry point."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-audit",
        description="The docket audit pipeline: Spark jobs that count every tier, and the "
        "reconciler that compares them.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    return p


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    _parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
