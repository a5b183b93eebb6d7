"""Docs cannot drift: every command and option of every console script appears in the docs, the
configuration references are generated, every metric is in the telemetry spec, every package's
docstring names its modules (one line each), and tests/README.md names every test file (one
line each)."""

from __future__ import annotations

import argparse
import ast
import re
import tomllib
from pathlib import Path

import pytest

from agent.cli import _parser as agent_parser
from agent.config import reference_markdown
from agent.telemetry import METRICS
from audit.cli import _parser as audit_parser
from audit.jobs.settings import reference_markdown as jobs_reference
from audit.reconcile.config import reference_markdown as reconcile_reference
from audit.reconcile.metrics import METRICS as RECONCILE_METRICS
from broker.cli import _parser as broker_parser
from dashboards.cli import _parser as dashboard_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TESTS = ROOT / "tests"


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
        ("docket-audit", audit_parser, "audit.md"),
        ("docket-dashboard", dashboard_parser, "dashboard.md")]


def test_every_console_script_is_checked_here():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts) == sorted(prog for prog, _parser, _doc in CLIS), \
        "a console script of pyproject.toml is not in CLIS (or CLIS names one that is not)"
    for prog, parser, _doc in CLIS:
        assert parser().prog == prog


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
    assert (DOCS / "jobs-config.md").read_text() == jobs_reference(), \
        "regenerate it: python -m audit.jobs.settings > docs/jobs-config.md"


@pytest.mark.parametrize("metrics", [METRICS, RECONCILE_METRICS], ids=["agent", "reconcile"])
def test_every_metric_is_in_the_telemetry_spec(metrics):
    text = (DOCS / "telemetry.md").read_text()
    for name, (kind, _help) in metrics.items():
        assert f"| `{name}` | {kind} |" in text, f"{name} is not in docs/telemetry.md"


# -- every package names its modules -----------------------------------------------------------
# Every top-level package of the repository but the tests: what is installed, and the demo.
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")

# Packages whose docstring does not name these modules yet, each on a line of its own. Their
# files are being changed elsewhere; name the modules there, then delete the entry here.
NOT_YET_NAMED: dict[str, set[str]] = {}          # none today


def _package_folders() -> list[Path]:
    """Every folder of ``PACKAGES`` holding Python modules (with an ``__init__.py`` or not)."""
    return sorted({p.parent for top in PACKAGES for p in (ROOT / top).rglob("*.py")})


def _unnamed(folder: Path) -> set[str]:
    """The modules and subpackages of ``folder`` its docstring does not name at the start of a
    line (``- ``name``: ...``). ``__main__`` is ``python -m`` of the package itself."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    names = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")} | \
        {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").is_file()}
    return {n for n in names if not re.search(rf"^\s*(- )?``{n}``", doc, re.MULTILINE)}


@pytest.mark.parametrize("folder", _package_folders(),
                         ids=lambda f: ".".join(f.relative_to(ROOT).parts))
def test_every_package_docstring_names_its_modules(folder):
    package = ".".join(folder.relative_to(ROOT).parts)
    assert (folder / "__init__.py").is_file(), \
        f"{package} has no __init__.py: give it one whose docstring names its modules"
    missing = _unnamed(folder) - NOT_YET_NAMED.get(package, set())
    assert not missing, f"the docstring of {package} does not name {sorted(missing)}: " \
        "add a line `- ``name``: what it does` for each"


def test_every_package_not_yet_named_still_misses_them():
    named = {package: NOT_YET_NAMED[package] - _unnamed(ROOT.joinpath(*package.split(".")))
             for package in NOT_YET_NAMED}
    assert not any(named.values()), \
        f"named now: delete these from NOT_YET_NAMED: {dict((k, v) for k, v in named.items() if v)}"


# -- tests/README.md names every test file -----------------------------------------------------
def _test_files() -> set[str]:
    return {str(p.relative_to(TESTS)) for p in TESTS.rglob("*")
            if p.suffix in (".py", ".c") and p.name != "__init__.py" and
            "__pycache__" not in p.parts}


def _readme_entries() -> list[str]:
    """The files tests/README.md lists, one a line: ``- `unit/test_x.py` — ...``."""
    return re.findall(r"^- `([\w./-]+\.(?:py|c))`", (TESTS / "README.md").read_text(),
                      re.MULTILINE)


def test_every_test_file_is_named_in_the_tests_readme():
    missing = _test_files() - set(_readme_entries())
    assert not missing, f"tests/README.md does not list {sorted(missing)}: add a line " \
        "`- `folder/file.py` — what it checks` for each"


def test_the_tests_readme_lists_each_file_once_and_only_files_that_are_there():
    entries = _readme_entries()
    twice = sorted({e for e in entries if entries.count(e) > 1})
    assert not twice, f"tests/README.md lists {twice} more than once"
    gone = set(entries) - _test_files()
    assert not gone, f"tests/README.md lists {sorted(gone)}, which are not in tests/"
