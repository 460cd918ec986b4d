-- Fencing (store/fence.py): every lease has a generation, +1 at each takeover by another
-- owner; a released lease keeps its row (expired), so generations never go back.
ALTER TABLE leases ADD COLUMN generation bigint NOT NULL DEFAULT 0;

-- The check a fenced write makes first, in its own transaction: it raises NV001 unless
-- the lease row still names this owner with this generation. FOR SHARE: a takeover
-- (claim_lease's FOR UPDATE) waits for the write to commit, and a write after it fails.
CREATE FUNCTION navi_fence(want_session text, want_owner text, want_generation bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM leases
        WHERE session_id = want_session AND owner = want_owner
          AND generation = want_generation
        FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease of % lost', want_session USING ERRCODE = 'NV001';
    END IF;
END $$;
