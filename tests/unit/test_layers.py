"""The layers of docs/architecture.md ("Layers"), checked on the source: every module's imports
are read with ``ast`` (nothing is imported) and each edge is held against the forbidden ones.

An edge that breaks a rule today and waits for its fix in a file of its own is in ``KNOWN``,
with why; any other breaks the test, and so does a ``KNOWN`` entry whose edge is gone (delete it
then, so that putting the edge back fails again). ``tests/`` is not a layer: a test imports
what it tests.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every top-level package of the repository but the tests: what is installed, and the demo.
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


@dataclass(frozen=True)
class Edge:
    importer: str       # the importing module, dotted
    target: str         # the module imported from (a submodule when the name is one)
    name: str | None    # the name taken with ``from target import name``, else None
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of ``PACKAGES``, by dotted name (a package by its ``__init__``'s name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = modules()


def _edges(name: str, path: Path) -> Iterator[Edge]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(name, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in MODULES:              # ``from pkg import module``: an edge to it
                    yield Edge(name, sub, None, node.lineno)
                else:
                    yield Edge(name, source, alias.name, node.lineno)


@functools.cache
def edges() -> tuple[Edge, ...]:
    return tuple(e for name, path in MODULES.items() for e in _edges(name, path))


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _cli_modules() -> set[str]:
    """The console scripts' modules, and the command module ``audit.cli`` delegates to."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {target.partition(":")[0] for target in scripts.values()} | \
        {"audit.reconcile.commands"}


CLI_MODULES = _cli_modules()


# -- the floors (docs/architecture.md, "Layers"): every import points down ----------------------
# Each room and its floor; a module is in the longest room its name starts with. Rooms of one
# floor stand beside each other and import nothing of each other.
FLOORS = {
    "docket_common": 0,          # the ground floor: errors, settings, security, names, formats
    "broker": 1,                 # a Kafka cluster's tooling
    "audit.contract": 1,         # the audit record, its delivery and collection: all an agent needs
    "agent": 2,                  # the producer host's agent
    "audit": 2,                  # the Spark jobs, the reconciler, the alerts, docket-audit
    "dashboards": 3,
    "demo": 4,
}


def room_of(module: str) -> str | None:
    """The room ``module`` is in (None: not docket's)."""
    rooms = [r for r in FLOORS if _within(module, r)]
    return max(rooms, key=len) if rooms else None


# -- the rules: each says whether an edge breaks it ---------------------------------------------
def every_import_points_down(e: Edge) -> bool:
    """An import reaches a lower floor or its own room: never up, never sideways to another
    room of the same floor (``broker`` and ``audit.contract``; ``agent`` and the audit)."""
    here, there = room_of(e.importer), room_of(e.target)
    if here is None or there is None or here == there:
        return False
    return FLOORS[there] >= FLOORS[here]


def nothing_builds_on_the_agent(e: Edge) -> bool:
    """The agent runs alone on producer hosts, the other tools elsewhere: only the demo (which
    runs agents) imports it — not the dashboards either, though they stand a floor higher."""
    return _within(e.target, "agent") and not _within(e.importer, "agent", "demo")


def sources_and_drain_stand_apart(e: Edge) -> bool:
    """``agent.tail`` (what reads) and ``agent.drain`` (what sends) meet only in the pool and
    the agent that wires them: neither imports the other."""
    return (_within(e.importer, "agent.tail") and _within(e.target, "agent.drain")) or \
        (_within(e.importer, "agent.drain") and _within(e.target, "agent.tail"))


def the_buffer_is_the_lowest_layer(e: Edge) -> bool:
    """Of docket, ``agent.buffer`` imports itself and ``docket_common.errors`` (``DocketError``,
    the base of every docket error, which the CLIs print alike; a standard-library module)."""
    docket = _within(e.target, *PACKAGES)
    return _within(e.importer, "agent.buffer") and docket and \
        not _within(e.target, "agent.buffer", "docket_common.errors")


def the_agent_config_is_data(e: Edge) -> bool:
    return e.importer == "agent.config" and \
        _within(e.target, "agent.tail", "agent.buffer", "agent.drain", "agent.service")


def the_dashboard_uses_no_command_line_module(e: Edge) -> bool:
    return _within(e.importer, "dashboards") and e.target in CLI_MODULES and \
        e.target != e.importer


def private_names_stay_home(e: Edge) -> bool:
    if e.target == e.importer:
        return False
    if e.name is not None and _private(e.name):
        return True
    # a private module (``pkg._mod``) imported from outside ``pkg``
    parts = e.target.split(".")
    return any(_private(part) and not _within(e.importer, ".".join(parts[:i]))
               for i, part in enumerate(parts) if i)


RULES = [every_import_points_down, nothing_builds_on_the_agent, sources_and_drain_stand_apart,
         the_buffer_is_the_lowest_layer,
         the_agent_config_is_data, the_dashboard_uses_no_command_line_module,
         private_names_stay_home]

# -- the edges that break a rule today, each waiting for its fix -------------------------------
# (rule, importer, target, name)
KNOWN: set[tuple[str, str, str, str | None]] = set()     # none today


def breaking() -> dict[tuple[str, str, str, str | None], list[Edge]]:
    found: dict[tuple[str, str, str, str | None], list[Edge]] = {}
    for e in edges():
        for rule in RULES:
            if rule(e):
                found.setdefault((rule.__name__, e.importer, e.target, e.name), []).append(e)
    return found


def test_the_modules_are_found():
    assert {"agent.buffer.pool", "audit.contract.errors", "dashboards.app",
            "audit.reconcile.service", "broker.cli", "docket_common.dirs"} <= set(MODULES)


def test_every_package_has_a_floor():
    assert set(PACKAGES) <= set(FLOORS), set(PACKAGES) - set(FLOORS)
    assert all(room_of(m) is not None for m in MODULES)


@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_no_module_imports_across_a_forbidden_edge(rule):
    new = [f"{MODULES[e.importer].relative_to(ROOT)}:{e.line}: {e.importer} imports "
           f"{e.target}{'.' + e.name if e.name else ''}"
           for key, found in breaking().items() if key[0] == rule.__name__ and key not in KNOWN
           for e in found]
    assert not new, f"{rule.__name__} (docs/architecture.md, \"Layers\"):\n" + "\n".join(new)


def test_every_known_edge_is_still_there():
    gone = KNOWN - set(breaking())
    assert not gone, f"fixed: delete these from KNOWN, so that they cannot come back: {gone}"


# -- the rules catch what they are written for -------------------------------------------------
@pytest.mark.parametrize("rule,edge", [
    # every import points down: the agent takes only the contract of the audit ...
    (every_import_points_down, Edge("agent.service", "audit.jobs.run", "x", 1)),
    (every_import_points_down, Edge("agent.cli", "audit", None, 1)),
    # ... the ground floor imports nothing above it ...
    (every_import_points_down, Edge("docket_common.maven", "audit.contract.errors",
                                    "DocketError", 1)),
    (every_import_points_down, Edge("docket_common.settings", "agent.config", "x", 1)),
    # ... broker, the audit and the dashboards do not import the agent ...
    (every_import_points_down, Edge("broker.cli", "agent.config", "x", 1)),
    (every_import_points_down, Edge("audit.reconcile.store", "agent.state.db", "x", 1)),
    (nothing_builds_on_the_agent, Edge("dashboards.data", "agent.status", "x", 1)),
    (nothing_builds_on_the_agent, Edge("broker.cli", "agent", None, 1)),
    # ... broker does not depend on the audit, nor the audit's contract on broker ...
    (every_import_points_down, Edge("broker.admin", "audit.contract.record", "x", 1)),
    (every_import_points_down, Edge("broker.admin", "audit.reconcile.store", "x", 1)),
    (every_import_points_down, Edge("audit.contract.collect", "broker.admin", "x", 1)),
    # ... the contract does not pull in the Spark jobs (nor anything of the audit above it) ...
    (every_import_points_down, Edge("audit.contract.record", "audit.jobs.spark", "x", 1)),
    (every_import_points_down, Edge("audit.contract", "audit.reconcile", None, 1)),
    # ... and nothing imports the dashboards or the demo but themselves.
    (every_import_points_down, Edge("audit.reconcile.service", "dashboards.data", "x", 1)),
    (every_import_points_down, Edge("agent.cli", "demo.run", "x", 1)),
    (sources_and_drain_stand_apart, Edge("agent.tail.files", "agent.drain.drain", "x", 1)),
    (sources_and_drain_stand_apart, Edge("agent.drain.native", "agent.tail", None, 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer.pool", "agent.tail.files", "x", 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer.pool", "agent.drain", None, 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer.errors", "agent.config", "x", 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer", "audit.contract.record", "x", 1)),
    (the_agent_config_is_data, Edge("agent.config", "agent.drain.producer", "x", 1)),
    (the_dashboard_uses_no_command_line_module,
     Edge("dashboards.data", "audit.reconcile.commands", "watermark", 1)),
    (the_dashboard_uses_no_command_line_module, Edge("dashboards.app", "audit.cli", None, 1)),
    (the_dashboard_uses_no_command_line_module, Edge("dashboards.app", "dashboards.cli", "x", 1)),
    (private_names_stay_home, Edge("audit.reconcile.service", "audit.reconcile.alerts.lifecycle",
                                   "_notify_due", 1)),
    (private_names_stay_home, Edge("agent.service", "agent.tail._helpers", None, 1)),
])
def test_a_forbidden_edge_is_caught(rule, edge):
    assert rule(edge)


@pytest.mark.parametrize("rule,edge", [
    (every_import_points_down, Edge("agent.config", "docket_common.settings", "Setting", 1)),
    (every_import_points_down, Edge("agent.audit_emitter", "audit.contract.record", "x", 1)),
    (every_import_points_down, Edge("agent.drain.producer", "broker.admin", "x", 1)),
    (every_import_points_down, Edge("broker.cli", "docket_common.kafka_security", "x", 1)),
    (every_import_points_down, Edge("audit.jobs.spark", "audit.contract.record", "x", 1)),
    (every_import_points_down, Edge("audit.reconcile.store", "audit.reconcile.alerts.outbox",
                                    "x", 1)),
    (every_import_points_down, Edge("dashboards.data", "audit.reconcile.store", "x", 1)),
    (every_import_points_down, Edge("demo.run", "agent.config", "x", 1)),
    (nothing_builds_on_the_agent, Edge("demo.run", "agent.config", "x", 1)),
    (nothing_builds_on_the_agent, Edge("agent.service", "agent.tail.files", "x", 1)),
    (every_import_points_down, Edge("agent.service", "numpy", None, 1)),
    (sources_and_drain_stand_apart, Edge("agent.tail.files", "agent.buffer.pool", "x", 1)),
    (sources_and_drain_stand_apart, Edge("agent.service", "agent.drain.native", "x", 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer.errors", "docket_common.errors",
                                          "DocketError", 1)),
    (the_buffer_is_the_lowest_layer, Edge("agent.buffer.pool", "numpy", None, 1)),
    (the_dashboard_uses_no_command_line_module,
     Edge("dashboards.data", "audit.reconcile.watermark", "watermark", 1)),
    (the_dashboard_uses_no_command_line_module, Edge("dashboards.cli", "dashboards.app", "x", 1)),
    (private_names_stay_home, Edge("audit.reconcile.commands", "audit.reconcile.verdict",
                                   "utc_iso", 1)),
    (private_names_stay_home, Edge("agent.tail.files", "agent.tail._helpers", "x", 1)),
    (private_names_stay_home, Edge("agent.cli", "agent", "__version__", 1)),
])
def test_an_allowed_edge_passes(rule, edge):
    assert not rule(edge)


def test_relative_imports_and_submodules_are_resolved():
    found = {(e.importer, e.target, e.name) for e in edges()}
    assert ("agent.buffer.pool", "agent.buffer.layout", None) in found      # from . import layout
    assert ("agent.buffer.errors", "docket_common.errors", "DocketError") in found
    assert ("dashboards.data", "audit.reconcile.watermark", "watermark") in found
