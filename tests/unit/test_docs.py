"""Docs cannot drift: every command and option of the CLIs appears in the docs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.cli import _parser as agent_parser
from agent.config import reference_markdown
from agent.telemetry import METRICS
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


@pytest.mark.parametrize("command,options", list(_commands(broker_parser())))
def test_every_docket_broker_command_and_option_is_documented(command, options):
    text = (DOCS / "broker.md").read_text()
    assert f"docket-broker {command}" in text, f"`docket-broker {command}` is not in docs/broker.md"
    for opt in options:
        assert opt in text, f"{opt} of `docket-broker {command}` is not in docs/broker.md"


@pytest.mark.parametrize("command,options", list(_commands(agent_parser())))
def test_every_docket_agent_command_and_option_is_documented(command, options):
    text = (DOCS / "agent.md").read_text()
    assert f"docket-agent {command}" in text, f"`docket-agent {command}` is not in docs/agent.md"
    for opt in options:
        assert opt in text, f"{opt} of `docket-agent {command}` is not in docs/agent.md"


def test_the_config_reference_is_generated_from_the_declarations():
    assert (DOCS / "config.md").read_text() == reference_markdown(), \
        "regenerate it: python -m agent.config > docs/config.md"


def test_every_metric_is_in_the_telemetry_spec():
    text = (DOCS / "telemetry.md").read_text()
    for name, (kind, _help) in METRICS.items():
        assert f"| `{name}` | {kind} |" in text, f"{name} is not in docs/telemetry.md"
