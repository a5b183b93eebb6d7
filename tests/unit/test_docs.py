"""Docs cannot drift: every command and option of the CLIs appears in the docs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.cli import _parser as agent_parser
from agent.config import reference_markdown
from agent.telemetry import METRICS
from audit.cli import _parser as audit_parser
from audit.reconcile.config import reference_markdown as reconcile_reference
from audit.reconcile.metrics import METRICS as RECONCILE_METRICS
from broker.cli import _parser as broker_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """Yield (command path, option strings) for every leaf command of an argparse tree."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        opts = [o for a in parser._actions for o in a.option_strings
                if o.startswith("--") and o not in ("--help", "--version")]
        yield prefix.strip(), opts
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, f"{prefix} {name}")


CLIS = [("docket-broker", broker_parser, "broker.md"), ("docket-agent", agent_parser, "agent.md"),
        ("docket-audit", audit_parser, "audit.md")]


@pytest.mark.parametrize("prog,command,options,doc", [
    (prog, command, options, doc) for prog, parser, doc in CLIS
    for command, options in _commands(parser())
])
def test_every_command_and_option_is_documented(prog, command, options, doc):
    text = (DOCS / doc).read_text()
    assert f"{prog} {command}" in text, f"`{prog} {command}` is not in docs/{doc}"
    for opt in options:
        assert opt in text, f"{opt} of `{prog} {command}` is not in docs/{doc}"


def test_the_config_reference_is_generated_from_the_declarations():
    assert (DOCS / "config.md").read_text() == reference_markdown(), \
        "regenerate it: python -m agent.config > docs/config.md"
    assert (DOCS / "reconcile-config.md").read_text() == reconcile_reference(), \
        "regenerate it: python -m audit.reconcile.config > docs/reconcile-config.md"


@pytest.mark.parametrize("metrics", [METRICS, RECONCILE_METRICS], ids=["agent", "reconcile"])
def test_every_metric_is_in_the_telemetry_spec(metrics):
    text = (DOCS / "telemetry.md").read_text()
    for name, (kind, _help) in metrics.items():
        assert f"| `{name}` | {kind} |" in text, f"{name} is not in docs/telemetry.md"
