"""One gateway to the reconciler's database: of the audit's and the dashboard's modules, only
the store (``audit/reconcile/store/``) sends SQL to it; the metrics, ``show``, ``watermark``,
the dashboard (``store/reads.py``), the alert lifecycle (``store/alerts.py``) and the outbox
(``store/deliveries.py``) ask the store. Read from the source with ``ast``: a call of
``execute``, ``executemany``, ``executescript`` or ``query`` whose statement is written in the
module (a string, an f-string, or strings added together) is SQL sent from it.

One module beside the store sends SQL, on purpose, listed below with why: a new one fails
here, and so does the listed one once it sends none (its line must go). The count job's tallies
are a database of their own, listed apart."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("audit", "dashboards")
GATEWAY = "audit.reconcile.store"
SENDS = {"execute", "executemany", "executescript", "query"}
SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "PRAGMA", "REPLACE", "ALTER",
             "DROP", "WITH")

# Modules beside the store that send SQL, and why.
BESIDE = {
    "audit.reconcile.figures": "the plain windows' figures, read in a process of its own at "
                               "every large evaluation: it imports the standard library only "
                               "(the store package would bring sqlite-utils and pandas, 0.6 s "
                               "a start); its one statement is the store's PLAIN_QUERY",
}

# Modules that send SQL to a database of their own, not the reconciler's.
OWN_DATABASE = {
    "audit.jobs.tally": "the count job's tallies, in count-tally.sqlite beside its checkpoint",
}


def _text(node: ast.AST) -> str:
    """The literal text of a statement argument (an f-string's parts, strings added)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + " " + _text(node.right)
    return ""


def sql_senders(source: str) -> list[int]:
    """The lines of ``source`` that send SQL written in it."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in SENDS and node.args:
            words = _text(node.args[0]).upper().split()
            if any(w in SQL_WORDS for w in words[:1]) or "FROM" in words:
                out.append(node.lineno)
    return out


def modules() -> dict[str, Path]:
    out = {}
    for top in SCOPE:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def test_only_the_store_sends_sql_to_the_reconcilers_database():
    senders = {name: lines for name, path in modules().items()
               if (lines := sql_senders(path.read_text()))
               and not (name == GATEWAY or name.startswith(GATEWAY + "."))
               and name not in OWN_DATABASE}
    assert set(senders) == set(BESIDE), {n: senders.get(n) for n in set(senders) ^ set(BESIDE)}


def test_the_store_does_send_its_sql_from_where_it_is_found():
    found = {name for name, path in modules().items() if sql_senders(path.read_text())}
    assert {GATEWAY, f"{GATEWAY}.reads", f"{GATEWAY}.alerts", f"{GATEWAY}.deliveries",
            *BESIDE, *OWN_DATABASE} <= found


def test_a_module_sending_sql_is_found_in_each_way_it_is_written():
    assert sql_senders('c.execute("SELECT 1 FROM t")') == [1]
    assert sql_senders('c.execute(f"SELECT {x} FROM t")') == [1]
    assert sql_senders('c.execute("SELECT a " + w + " FROM t", p)') == [1]
    assert sql_senders('db.query("select * from windows")') == [1]
    assert sql_senders('c.executemany("DELETE FROM snoozes WHERE key = ?", rows)') == [1]
    assert sql_senders('c.execute(query, (1,))') == []          # not written here
    assert sql_senders('pool.query("a name")') == []
