"""Test support: the fake LLM server (`FakeLLMServer`, `open_fake_llm`: real HTTP on
127.0.0.1) and a harness that drives a whole runtime (`open_harness`).

Names are imported lazily so that ``python -m navi_trio.testing.fake_llm`` does not
import the module twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, typed, for mypy (tests and scripts use them)
    from navi_trio.testing.fake_llm import FakeLLMServer as FakeLLMServer
    from navi_trio.testing.fake_llm import open_fake_llm as open_fake_llm
    from navi_trio.testing.harness import Harness as Harness
    from navi_trio.testing.harness import SessionDriver as SessionDriver
    from navi_trio.testing.harness import open_harness as open_harness
    from navi_trio.testing.harness import test_config as test_config
    from navi_trio.testing.harness import virtual_wall as virtual_wall

_EXPORTS = {
    "FakeLLMServer": "navi_trio.testing.fake_llm",
    "open_fake_llm": "navi_trio.testing.fake_llm",
    "Harness": "navi_trio.testing.harness",
    "SessionDriver": "navi_trio.testing.harness",
    "open_harness": "navi_trio.testing.harness",
    "test_config": "navi_trio.testing.harness",
    "virtual_wall": "navi_trio.testing.harness",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'navi_trio.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
