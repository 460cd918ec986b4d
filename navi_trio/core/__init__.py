"""The core: what runs a session, in sub-packages by concept, from the bottom up.

- `checkpoints`: snapshots of folders, restored and kept; knows nothing of sessions.
- `jobs`: the background jobs of every session, their records and completion notes.
- `turn`: one run of the agent loop and all it runs with: the agent, the turn, the LLM
  call, context, tokens, compression, planning, steering, budgets, the tool executor,
  policy and approvals, and the session state, lease and roots a run holds.
- `session`: one actor per live session, its registry, durable queue and broadcast.
- `history`: where a session can go back to, and rewind and fork.
- `triggers`: runs that start without a user typing: schedules, and a finished
  background job that wakes the agent.
- `cluster`: several daemons on one database: routing, relayed frames, failover.

A package imports only the ones above it in this list, never one below.
"""
