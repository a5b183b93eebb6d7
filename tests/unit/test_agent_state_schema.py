"""The state database's ``files`` table is created with plain ``sqlite3``; databases written
before — by agents that created it through sqlite-utils, or before some columns and state names
existed — open as they are and read the same."""

from __future__ import annotations

import sqlite3

import pytest
import sqlite_utils

from agent.state.db import ORPHANED, StateDB


def _schema(path) -> tuple[list, list]:
    """(each column's name, type, not-null, default and primary-key place; each index's name,
    uniqueness, origin and columns) of ``files``."""
    with sqlite3.connect(path) as conn:
        columns = [row[1:] for row in conn.execute("PRAGMA table_info(files)")]
        indexes = sorted(
            (index, [col[2] for col in conn.execute(f"PRAGMA index_info('{index[0]}')")])
            for index in [row[1:] for row in conn.execute("PRAGMA index_list(files)")])
    return columns, indexes


def test_a_state_database_whose_files_table_sqlite_utils_created_reads_the_same(tmp_path):
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        files = sqlite_utils.Database(conn)["files"]
        files.create({"source_id": int, "source_index": int, "dev": int, "ino": int,
                      "fingerprint": bytes, "path": str, "sealed_offset": int,
                      "acked_offset": int, "size_seen": int, "state": str, "tail": bytes,
                      "orphaned_ms": int, "orphan_reason": str, "updated_ms": int},
                     pk="source_id")
        files.create_index(["dev", "ino"])
        files.insert({"source_id": 7, "source_index": 1, "dev": 2, "ino": 3,
                      "fingerprint": b"abc", "path": "/var/log/app.log", "sealed_offset": 100,
                      "acked_offset": 90, "size_seen": 120, "state": "active",
                      "updated_ms": 5})
    fresh = StateDB(tmp_path / "fresh.db")
    fresh.close()
    db = StateDB(old)                 # gains the columns added since (``anchors``)
    assert _schema(old) == _schema(tmp_path / "fresh.db")
    row = db.get(7)
    assert (row["path"], row["fingerprint"], row["sealed_offset"], row["acked_offset"],
            row["tail"]) == ("/var/log/app.log", b"abc", 100, 90, None)
    assert db.rows(1, ["active"]) == db.rows_at(1, 2, 3) == db.all_files() == [row]
    assert db.add_file(1, 2, 4, b"def", "/var/log/app.log.1") == 8
    assert [r["source_id"] for r in db.all_files()] == [7, 8]
    db.close()


def test_a_files_table_of_the_first_version_gains_its_columns_and_todays_state_names(tmp_path):
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE files (source_id INTEGER PRIMARY KEY, source_index INTEGER, "
                     "dev INTEGER, ino INTEGER, fingerprint BLOB, path TEXT, "
                     "sealed_offset INTEGER, acked_offset INTEGER, size_seen INTEGER, "
                     "state TEXT, updated_ms INTEGER)")
        conn.execute("INSERT INTO files VALUES (1, 1, 2, 3, x'00', '/a', 10, 10, 10, "
                     "'truncated', 0)")
    db = StateDB(path)
    (row,) = db.all_files()
    assert row["state"] == ORPHANED
    assert (row["tail"], row["orphaned_ms"], row["orphan_reason"], row["anchors"]) == \
        (None, None, None, None)
    db.update(1, tail=b"xyz", orphan_reason="unaccounted_bytes")
    assert db.get(1)["tail"] == b"xyz"
    db.close()


def test_a_files_table_whose_index_a_stop_prevented_gets_it_at_the_next_start(tmp_path):
    path = tmp_path / "state.db"
    StateDB(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute('DROP INDEX "idx_files_dev_ino"')
    StateDB(path).close()
    assert _schema(path) == _schema_of_fresh(tmp_path)


def _schema_of_fresh(tmp_path) -> tuple[list, list]:
    StateDB(tmp_path / "fresh.db").close()
    return _schema(tmp_path / "fresh.db")


def test_a_generation_not_recorded_is_a_clear_error(tmp_path):
    db = StateDB(tmp_path / "state.db")
    with pytest.raises(KeyError, match="no file generation 3"):
        db.get(3)
    db.close()


def test_a_source_id_is_never_given_twice_not_even_a_deleted_rows(tmp_path):
    """SQLite gives a new row the highest id plus one: the id of a deleted last row would come
    back. The state database never gives an id twice, across a restart too."""
    db = StateDB(tmp_path / "state.db")
    first = db.add_file(0, 1, 10, b"a", "/a")
    second = db.add_file(0, 1, 11, b"b", "/b")
    db.delete(second)
    third = db.add_file(0, 1, 12, b"c", "/c")
    assert third not in (first, second)
    db.delete(third)
    db.close()
    db = StateDB(tmp_path / "state.db")
    assert db.add_file(0, 1, 13, b"d", "/d") not in (first, second, third)
    db.close()


def test_an_identity_table_of_an_earlier_version_gains_the_next_source_id(tmp_path):
    """A database whose ``identity`` has no ``next_source_id`` (before it was added) gets the
    column at start; ids go on after the highest one in ``files``."""
    path = tmp_path / "old.db"
    db = StateDB(path)
    db.add_file(0, 1, 10, b"a", "/a")
    db.add_file(0, 1, 11, b"b", "/b")
    inc, _ = db.identity()
    db.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE identity DROP COLUMN next_source_id")
    db = StateDB(path)
    assert db.identity()[0] == inc
    assert db.add_file(0, 1, 12, b"c", "/c") == 3
    db.close()


def test_content_is_known_only_by_a_whole_fingerprint_or_the_same_short_content(tmp_path):
    """``knows_content``: a fingerprint of all ``FINGERPRINT_BYTES`` the content starts with, or
    the very same short content; a shorter fingerprint (a header every file starts with, a file
    just made) says nothing."""
    from agent.state.db import FINGERPRINT_BYTES
    db = StateDB(tmp_path / "state.db")
    header = b"ts,level,message\n"
    body = header + b"".join(b"%06d,INFO,event\n" % i for i in range(200))
    db.add_file(0, 1, 10, header, "/logs/app.log")                    # just made: a header
    assert not db.knows_content(body[:FINGERPRINT_BYTES])
    own = db.add_file(0, 1, 11, body[:FINGERPRINT_BYTES], "/logs/app.log.1")
    assert db.knows_content(body[:FINGERPRINT_BYTES])
    assert not db.knows_content(body[:FINGERPRINT_BYTES], but=own)   # not by its own row
    short = b"one line\n"
    db.add_skipped(short)
    assert db.knows_content(short) and not db.knows_content(short + b"and more\n")
    db.close()


def test_a_database_without_the_skipped_table_says_so_once(tmp_path):
    """``skipped_new``: the table made by this open (a new database, or one of a version before
    it): the archives under the globs are not known yet."""
    path = tmp_path / "state.db"
    db = StateDB(path)
    assert db.skipped_new
    db.close()
    db = StateDB(path)
    assert not db.skipped_new
    db.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE skipped")
    db = StateDB(path)
    assert db.skipped_new
    db.close()
