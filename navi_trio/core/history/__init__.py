"""A session's history: where it can go back to, rewind and fork.

Built on the checkpoint engine for files and on the store for the conversation; every
client reaches it through the session's actor.
"""
