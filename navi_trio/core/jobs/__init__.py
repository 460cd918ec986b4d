"""Background jobs: the supervisor that owns them, their records, their completion notes.

A job lives in the supervisor's nursery, not in the run that started it, so it outlives a
stop; its result reaches the agent's next turn as a note.
"""
