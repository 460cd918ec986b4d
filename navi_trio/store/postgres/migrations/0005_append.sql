-- An append (store/postgres/_history.py `append`) in one statement: one round trip and
-- one transaction of its own (the statement's, on the pool's autocommit connections),
-- where a transaction of several statements cost four round trips and a worker thread
-- that gave up and took back Python's GIL at each of them.
--
-- The same steps as before, in order, each statement with a snapshot of its own (a
-- VOLATILE function under READ COMMITTED): the fence (navi_fence, NV001 when lost); the
-- session's row locked by its UPDATE (NV002 when there is no such session); the queued
-- message it ran, deleted; then each INSERT reads the last position once the lock was
-- granted, so it sees the rows of the writer before. `durable` false: the commit does
-- not wait for the WAL flush (set_config's third argument: this transaction only).
CREATE FUNCTION navi_append(
    want_session text, fence_owner text, fence_generation bigint, now_at double precision,
    dequeue_key text, durable boolean,
    m_role text[], m_content text[], m_is_plan boolean[], m_data text[],
    c_role text[], c_content text[], c_is_plan boolean[], c_data text[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF fence_owner IS NOT NULL THEN
        PERFORM navi_fence(want_session, fence_owner, fence_generation);
    END IF;
    UPDATE sessions SET updated_at = now_at WHERE id = want_session;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no session % in the store', want_session USING ERRCODE = 'NV002';
    END IF;
    IF dequeue_key IS NOT NULL THEN
        DELETE FROM queued WHERE key = dequeue_key;
    END IF;
    IF cardinality(m_role) > 0 THEN
        INSERT INTO messages (session_id, position, role, content, is_plan, data, created_at)
        SELECT want_session,
               (SELECT COALESCE(MAX(position), 0) FROM messages
                 WHERE session_id = want_session) + t.ord,
               t.role, t.content, t.is_plan, t.data, now_at
          FROM unnest(m_role, m_content, m_is_plan, m_data)
               WITH ORDINALITY AS t(role, content, is_plan, data, ord);
    END IF;
    IF cardinality(c_role) > 0 THEN
        INSERT INTO context (session_id, position, role, content, is_plan, data, created_at)
        SELECT want_session,
               (SELECT COALESCE(MAX(position), 0) FROM context
                 WHERE session_id = want_session) + t.ord,
               t.role, t.content, t.is_plan, t.data, now_at
          FROM unnest(c_role, c_content, c_is_plan, c_data)
               WITH ORDINALITY AS t(role, content, is_plan, data, ord);
    END IF;
END $$;
