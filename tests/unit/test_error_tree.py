"""The error tree drawn in ``docket_common/errors.py`` is the tree the classes make: every
``DocketError`` subclass of docket's packages drawn under its parent, in the module it lives
in, and nothing drawn that is not there."""

from __future__ import annotations

import ast
import importlib
import re

import docket_common.errors as errors
from docket_common.errors import DocketError

# "│   ├── Name      module.path" — the depth is where the name starts, four columns a level.
ROW = re.compile(r"^(?P<lead>[ │├└─]*)(?P<name>\w+)(?:\s+(?P<module>[\w.]+))?$")


def drawn() -> dict[str, tuple[str | None, str | None]]:
    """Name → (parent's name, module) as the docstring draws them."""
    text = errors.__doc__.split("::", 1)[1]
    out, path = {}, []
    for line in text.strip("\n").splitlines():
        row = ROW.match(line.strip("\n")[4:] if line.startswith("    ") else line)
        assert row, f"not a row of the tree: {line!r}"
        depth = len(row["lead"]) // 4
        path[depth:] = [row["name"]]
        out[row["name"]] = (path[depth - 1] if depth else None, row["module"])
    return out


def found() -> dict[str, tuple[str | None, str]]:
    """Name → (parent's name, module) of every subclass of ``DocketError``, the modules the
    drawing names imported first."""
    for _parent, module in drawn().values():
        if module:
            importlib.import_module(module)
    out, todo = {"DocketError": (None, DocketError.__module__)}, [DocketError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] in ("agent", "audit", "broker", "dashboards",
                                                "docket_common", "demo"):
                out[sub.__name__] = (cls.__name__, sub.__module__)
                todo.append(sub)
    return out


def defined() -> dict[str, str]:
    """Name → parent's name of every class in docket's source that derives, by the names of
    its bases, from ``DocketError`` (read with ``ast``, nothing imported)."""
    from tests.unit.test_layers import MODULES
    bases: dict[str, str] = {}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for b in node.bases:
                    name = b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                    if name:
                        bases.setdefault(node.name, name)
    out = {}
    for name in bases:
        chain, at = [name], name
        while at in bases and at not in chain[:-1]:
            at = bases[at]
            chain.append(at)
        if "DocketError" in chain[1:]:
            out[name] = bases[name]
    return out


def test_the_drawing_is_the_tree():
    want = {name: parent for name, (parent, _m) in drawn().items() if parent}
    assert want == {name: parent for name, (parent, _m) in found().items() if parent}
    assert want == defined()


def test_each_class_lives_where_the_drawing_says():
    modules = {name: m for name, (_p, m) in found().items()}
    for name, (_parent, module) in drawn().items():
        if module:
            assert modules[name] == module, name
