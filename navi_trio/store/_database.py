"""The SQLite connection as the store's modules use it: `execute`, `atomic`, `conn`.

What the store used of sqlite-utils, without importing it: sqlite-utils pulls in click,
pluggy, dateutil and a large verbose regex at import (50-70 ms, a fifth of `navi run`'s
way to its first request), for a wrapper whose few methods are these. They keep its
transaction rules: a statement run outside a transaction that opened one implicitly
(Python's sqlite3 does, before INSERT / UPDATE / DELETE) is committed at once, or
rolled back when it failed; `atomic` nests as a savepoint.
"""

from __future__ import annotations

import re
import secrets
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

# Statements that steer the transaction themselves: never committed behind their back.
_CONTROL = frozenset({"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"})
_FIRST_WORD = re.compile(r"[\s;\ufeff]*(\w*)")

Parameters = Sequence[Any] | Mapping[str, Any]


class Database:
    """One sqlite3 connection (legacy transaction control, as `sqlite3.connect` makes
    it), with recursive triggers on."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.execute("PRAGMA recursive_triggers=on;")

    def execute(self, sql: str, parameters: Parameters | None = None) -> sqlite3.Cursor:
        """Run one statement; outside a transaction a write is committed at once."""
        conn = self.conn
        was_in_transaction = conn.in_transaction
        try:
            cursor = conn.execute(sql) if parameters is None else conn.execute(sql, parameters)
        except Exception:
            if not was_in_transaction and conn.in_transaction:
                conn.execute("ROLLBACK")  # else it would capture every later write
            raise
        if (
            not was_in_transaction
            and conn.in_transaction
            and cursor.description is None
            and _first_word(sql) not in _CONTROL
        ):
            conn.execute("COMMIT")
        return cursor

    @contextmanager
    def atomic(self) -> Iterator[Database]:
        """One transaction (``BEGIN`` … ``COMMIT``); inside one, a savepoint."""
        conn = self.conn
        if conn.in_transaction:
            savepoint = f"navi_{secrets.token_hex(8)}"
            conn.execute(f"SAVEPOINT {savepoint}")
            try:
                yield self
            except BaseException:
                # A failure may have ended the whole transaction, savepoint and all:
                # rolling back to it then would hide the first error behind another.
                if conn.in_transaction:
                    conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                    conn.execute(f"RELEASE SAVEPOINT {savepoint}")
                raise
            conn.execute(f"RELEASE SAVEPOINT {savepoint}")
            return
        conn.execute("BEGIN")
        try:
            yield self
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def columns(self, table: str) -> set[str]:
        """The names of `table`'s columns (none when there is no such table)."""
        quoted = '"' + table.replace('"', '""') + '"'
        return {row[1] for row in self.conn.execute(f"PRAGMA table_info({quoted})")}

    def close(self) -> None:
        self.conn.close()


def _first_word(sql: str) -> str:
    found = _FIRST_WORD.match(sql)
    return found.group(1).upper() if found else ""
