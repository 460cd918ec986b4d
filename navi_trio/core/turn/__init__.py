"""One run of the agent loop and everything it runs with.

The agent (`run_stream`, `compact_stream`, `run_ephemeral`) holds a session's lease and
roots and runs a turn: LLM calls, context and its compression, planning, steering, tool
calls under policy, approvals, budgets and a checkpoint before the first write. The
session's in-memory state and the lease live here because the turn is what holds them.
"""
