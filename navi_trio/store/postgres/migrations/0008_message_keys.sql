-- The client keys of a session's messages (the `message` frame's `key`): the same table
-- as the SQLite store's (store/_schema.py), written by store/statements.py `claim_key`
-- in the transaction that stores the message. `reply`: the ok's fields its sender got;
-- `seq`: the order they were taken in (the session keeps its newest).
CREATE TABLE message_keys (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    session_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    message_id text NOT NULL,
    reply text NOT NULL,
    at double precision NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX message_keys_order ON message_keys (session_id, seq);
