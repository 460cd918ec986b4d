"""The in-memory KV store for the background-task tests (see navi_trio.testing.memkv)."""

from navi_trio.testing.memkv import MemoryKV as MemoryKV
