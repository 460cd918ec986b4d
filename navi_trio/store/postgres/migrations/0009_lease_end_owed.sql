-- Whether the holder of a session's lease owes the session's followers a turn's end
-- (core/turn/agent.py `Agent.end_dead_turn`): set by the save that starts a turn under
-- the lease, cleared by the commit that sends that turn's `stream_end` to the other
-- daemons (store/postgres/_bus.py `_notify`) and by the lease's release. A takeover of
-- a dead owner's lease keeps it: the new holder says that end when it is still owed.
ALTER TABLE leases ADD COLUMN end_owed boolean NOT NULL DEFAULT false;
