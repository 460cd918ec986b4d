-- navi's PostgreSQL schema, version 1: the tables of the SQLite store (store/_schema.py).
-- Applied once per database by store/postgres/_migrate.py, under an advisory lock, and
-- recorded in schema_migrations. Never edit a migration that has shipped: add the next one.
--
-- Text that names things (ids, kv keys) uses the "C" collation, so that ORDER BY and
-- prefix matches compare bytes as SQLite does, whatever the database's locale.
-- Messages, context rows and kv values keep their JSON as text (`data`, `value`): it
-- comes back exactly as it was saved (jsonb would reorder keys and refuse \u0000).
-- Times are wall-clock seconds (double precision), as in the SQLite store.

CREATE TABLE sessions (
    id text COLLATE "C" PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,  -- creation order: the tie-break of listings
    profile_id text NOT NULL,
    title text NOT NULL,
    user_id text NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    meta text NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id, updated_at);

-- The display history, append-only: rows are added, never rewritten (placeholders of a
-- repair go between two rows, at a fractional position).
CREATE TABLE messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id),
    position double precision NOT NULL,
    role text,
    content text,
    is_plan boolean NOT NULL,
    data text NOT NULL,
    created_at double precision NOT NULL,
    UNIQUE (session_id, position)
);

-- What the model is sent: appended to, and rewritten only by compression.
CREATE TABLE context (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id),
    position double precision NOT NULL,
    role text,
    content text,
    is_plan boolean NOT NULL,
    data text NOT NULL,
    created_at double precision NOT NULL,
    UNIQUE (session_id, position)
);

CREATE TABLE kv (
    scope text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value text NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE TABLE users (
    id text PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL,
    token_sha256 text NOT NULL UNIQUE,  -- only a digest of the token is kept
    role text NOT NULL,
    created_at double precision NOT NULL
);

-- Who runs a session now. No foreign key: a run leases its session before the row exists.
CREATE TABLE leases (
    session_id text COLLATE "C" PRIMARY KEY,
    owner text NOT NULL,
    pid integer NOT NULL,
    host text NOT NULL,
    expires_at double precision NOT NULL
);

-- Queued user messages, kept until the transaction that appends one to the history
-- deletes it; `id` is the order they were queued in.
CREATE TABLE queued (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL UNIQUE,
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id),
    pid integer NOT NULL,
    host text NOT NULL,
    data text NOT NULL,
    created_at double precision NOT NULL
);
CREATE INDEX queued_session ON queued (session_id, id);
