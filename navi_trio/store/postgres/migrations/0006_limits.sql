-- Limits that hold across daemons: budget reservations, and why a schedule's run was
-- skipped. The same tables as the SQLite store's (store/_schema.py, store/_control.py).

-- What the budgets' calls under way hold (store/postgres/_control.py `reserve`): one row
-- per hold and key, until settled; a hold past expires_at (server clock), or of a dead
-- process on the reserving daemon's host, counts no more and is deleted.
CREATE TABLE usage_holds (
    hold text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    tokens double precision NOT NULL,
    tool_calls double precision NOT NULL,
    subagents double precision NOT NULL,
    wall_sec double precision NOT NULL,
    pid integer NOT NULL,
    host text NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (hold, key)
);
CREATE INDEX usage_holds_key ON usage_holds (key);

-- Why the last due time of a schedule ran nothing (its owner had as many sessions as
-- allowed); cleared by the next run.
ALTER TABLE schedules ADD COLUMN last_skip text;
ALTER TABLE schedules ADD COLUMN last_skip_at double precision;
