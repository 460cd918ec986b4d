"""The store's SQLite wrapper keeps the transaction rules the store's modules rely on.

A write outside a transaction is committed at once (Python's sqlite3 opens one
implicitly before it); a failed one leaves no transaction behind; `atomic` nests as a
savepoint, so an inner failure undoes the inner writes only. Seen from a second
connection to the same file, as another thread or daemon would see it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from navi_trio.store._database import Database


def _open(path: Path) -> Database:
    db = Database(sqlite3.connect(str(path)))
    db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)")
    return db


def _seen(path: Path) -> list[str]:
    other = sqlite3.connect(str(path))
    try:
        return [row[0] for row in other.execute("SELECT k FROM t ORDER BY k")]
    finally:
        other.close()


def test_a_write_outside_a_transaction_is_committed_at_once(tmp_path: Path) -> None:
    db = _open(tmp_path / "a.db")
    db.execute("INSERT INTO t VALUES (?)", ["one"])
    assert not db.conn.in_transaction
    assert _seen(tmp_path / "a.db") == ["one"]


def test_a_failed_write_leaves_no_transaction_open(tmp_path: Path) -> None:
    db = _open(tmp_path / "a.db")
    db.execute("INSERT INTO t VALUES (?)", ["one"])
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO t VALUES (?)", ["one"])
    assert not db.conn.in_transaction
    db.execute("INSERT INTO t VALUES (?)", ["two"])
    assert _seen(tmp_path / "a.db") == ["one", "two"]


def test_atomic_nests_as_a_savepoint(tmp_path: Path) -> None:
    db = _open(tmp_path / "a.db")
    with db.atomic():
        db.execute("INSERT INTO t VALUES (?)", ["outer"])
        with pytest.raises(sqlite3.IntegrityError), db.atomic():
            db.execute("INSERT INTO t VALUES (?)", ["inner"])
            db.execute("INSERT INTO t VALUES (?)", ["outer"])
        assert _seen(tmp_path / "a.db") == []  # not committed yet
    assert _seen(tmp_path / "a.db") == ["outer"]


def test_a_failure_in_atomic_rolls_it_all_back(tmp_path: Path) -> None:
    db = _open(tmp_path / "a.db")
    with pytest.raises(RuntimeError), db.atomic():
        db.execute("INSERT INTO t VALUES (?)", ["gone"])
        raise RuntimeError("stop")
    assert not db.conn.in_transaction
    assert _seen(tmp_path / "a.db") == []


def test_columns_names_a_tables_columns(tmp_path: Path) -> None:
    db = _open(tmp_path / "a.db")
    assert db.columns("t") == {"k"}
    assert db.columns("missing") == set()
