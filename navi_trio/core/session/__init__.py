"""The live session: one actor per session, started on demand by the registry.

The actor takes messages (enqueue, steer, interrupt), keeps the durable queue, runs turns
one at a time and publishes their frames through the session's broadcast.
"""
