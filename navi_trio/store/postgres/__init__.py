"""The PostgreSQL session store (`NAVI_DB=postgresql://…`): several daemons, one database.

`PostgresStore` (store.py) is a `SessionStore` with psycopg 3 and a
psycopg_pool pool on worker threads; the schema is the numbered migrations in
``migrations/`` (_migrate.py). Imported only when NAVI_DB names a server
(store/factory.py): psycopg stays out of a start-up on a SQLite file.
"""

from navi_trio.store.postgres.store import PostgresStore as PostgresStore

__all__ = ["PostgresStore"]
