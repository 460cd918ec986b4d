-- Several daemons on one database (core/cluster.py, store/postgres/_bus.py).

-- The daemons: each renews its row (expires_at) while it runs, and expires it when it
-- stops. A row past its expiry is a dead daemon: its queued messages and background jobs
-- are taken over (a process with no row, such as `navi run`, is never presumed dead).
CREATE TABLE daemons (
    owner text COLLATE "C" PRIMARY KEY,  -- the runtime's lease owner id
    pid integer NOT NULL,
    host text NOT NULL,
    started_at double precision NOT NULL,
    expires_at double precision NOT NULL
);

-- Which daemons have clients following a session: its owner publishes the session's
-- frames (NOTIFY) only while some other daemon follows it.
CREATE TABLE follows (
    session_id text COLLATE "C" NOT NULL,
    owner text COLLATE "C" NOT NULL,
    PRIMARY KEY (session_id, owner)
);

-- A frame too large for one NOTIFY (8000 bytes): the notification carries its id.
CREATE TABLE frames (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text COLLATE "C" NOT NULL,
    data text NOT NULL,
    created_at double precision NOT NULL
);
CREATE INDEX frames_age ON frames (created_at);

-- Counted limits shared by every daemon (core/cluster.py `take`): one row per slot taken
-- (a background job, a connection), released by deleting it; a dead daemon's slots
-- stop counting with its heartbeat. `started_at` also counts starts in a rate window.
CREATE TABLE slots (
    key text COLLATE "C" NOT NULL,  -- one slot counts in each of its scopes
    kind text COLLATE "C" NOT NULL,
    scope text COLLATE "C" NOT NULL,
    owner text COLLATE "C" NOT NULL,
    started_at double precision NOT NULL,
    released boolean NOT NULL DEFAULT false,
    PRIMARY KEY (key, scope)
);
CREATE INDEX slots_scope ON slots (kind, scope);
