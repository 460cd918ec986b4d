-- What each run spent, for the accounts (`navi usage`, the `usage` frame): the same
-- table as the SQLite store's (store/_schema.py), written by store/statements.py.
CREATE TABLE run_usage (
    at double precision NOT NULL,
    day text NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    user_id text COLLATE "C" NOT NULL,
    profile text NOT NULL,
    model text NOT NULL,
    kind text NOT NULL,
    tokens_in bigint NOT NULL,
    tokens_out bigint NOT NULL,
    llm_sec double precision NOT NULL,
    tool_sec double precision NOT NULL
);
CREATE INDEX run_usage_user ON run_usage (user_id, at);
CREATE INDEX run_usage_session ON run_usage (session_id, at);
