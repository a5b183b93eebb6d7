"""``docket-dashboard``: command-line entry point."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-dashboard",
        description="The docket audit dashboard: completeness per topic, window and tier.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    return p


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    _parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
