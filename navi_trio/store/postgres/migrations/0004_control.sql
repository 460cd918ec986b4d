-- Control of running agents: wake-ups, the budgets' usage counters, schedules.
-- The same tables as the SQLite store's (store/_schema.py, store/_control.py).

-- One row per wake-up a background job's note started: counted to bound them.
CREATE TABLE wakes (
    session_id text COLLATE "C" NOT NULL,
    at double precision NOT NULL
);
CREATE INDEX wakes_session ON wakes (session_id, at);

-- The budgets' counters: one row per key (session:<id>, user:<id>:<day>), added to in place.
CREATE TABLE usage (
    key text COLLATE "C" PRIMARY KEY,
    tokens double precision NOT NULL,
    tool_calls double precision NOT NULL,
    subagents double precision NOT NULL,
    wall_sec double precision NOT NULL,
    updated_at double precision NOT NULL
);

-- Scheduled runs; a claim moves next_due from the value it read (compare and set).
CREATE TABLE schedules (
    id text COLLATE "C" PRIMARY KEY,
    user_id text NOT NULL,
    session_id text COLLATE "C",
    profile_id text,
    kind text NOT NULL,
    spec text NOT NULL,
    message text NOT NULL,
    catch_up boolean NOT NULL,
    paused boolean NOT NULL,
    next_due double precision,
    created_at double precision NOT NULL,
    runs integer NOT NULL,
    last_run_at double precision,
    last_session_id text,
    budget text NOT NULL
);
CREATE INDEX schedules_user ON schedules (user_id);
