"""Every request carries an output cap (issue 7 #2): each planning phase, compression
and the answer, in both dialects (Ollama ``options.num_predict``, OpenAI ``max_tokens``),
from the settings or the profile's own fields. Checked on the request bodies the fake
LLM server received over real HTTP.

Rules: see tests/test_agent_basic.py (fake LLM over real HTTP, real SQLite, absolute
timeouts, no sleeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import seed

from navi_trio.core.turn.llm_call import chat_request, output_cap
from navi_trio.errors import ConfigError
from navi_trio.profiles import AgentProfile, parse_config
from navi_trio.settings import Settings
from navi_trio.testing import open_harness

TIMEOUT = 30
REQUEST = "Record the state, echo the value and summarise it"
PLAN = "Complexity: simple\nMilestones:\n- done\nSteps:\n1. Answer — SELF\n"


def cap_of(body: dict[str, Any], dialect: str) -> Any:
    if dialect == "ollama":
        return body.get("options", {}).get("num_predict")
    return body.get("max_tokens")


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_planning_compression_and_answer_requests_carry_their_caps(
    tmp_path: Path, dialect: str
) -> None:
    replies = [
        {"text": "Goal: x\nREFLECT: yes"},
        {"text": "Critic: fine\nPlan Adjustments: none"},
        {"text": PLAN},
        {"text": "the answer"},
        {"text": "THE SUMMARY"},
    ]
    profile = {
        "planning_phase2_enabled": True,
        "compression_keep_recent": 2,
        "compression_max_tokens": 200,
        "answer_max_tokens": 3000,
    }
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=replies,
            dialect=dialect,
            plan_max_tokens=700,
            answer_max_tokens=5000,  # the profile's 3000 wins
            profiles={"general": profile},
        ) as h:
            frames = await h.turn("s1", REQUEST)
            assert frames[-1]["reason"] == "complete"
            s = await h.session("s1")
            await s.idle()  # the turn's run has fully ended: compact is not refused as busy
            s.compact()
            await s.until_type("context_compressed")
            await s.idle()
            reqs = h.chat_requests
            assert len(reqs) == 5
            assert [cap_of(b, dialect) for b in reqs] == [700, 700, 700, 3000, 200]
            if dialect == "ollama":
                assert all(b["options"]["num_ctx"] == 8192 for b in reqs)


def test_every_request_has_a_cap_even_when_the_caller_names_none() -> None:
    settings = Settings.from_env({}, answer_max_tokens=1234)
    request = chat_request(settings, [{"role": "user", "content": "hi"}], "m")
    assert request.options["num_predict"] == 1234
    with pytest.raises(ValueError, match="max_tokens must be 1 or more"):
        chat_request(settings, [], "m", max_tokens=0)


def test_output_cap_per_purpose_with_profile_overrides() -> None:
    settings = Settings.from_env({})
    plain = AgentProfile()
    assert [output_cap(settings, plain, p) for p in ("analysis", "review", "plan")] == [1024] * 3
    assert output_cap(settings, plain, "compression") == settings.compression_max_tokens
    assert output_cap(settings, plain, "answer") == 4096
    own = AgentProfile(plan_max_tokens=300, answer_max_tokens=900, compression_max_tokens=50)
    assert [output_cap(settings, own, p) for p in ("plan", "compression", "answer")] == [
        300, 50, 900,
    ]  # fmt: skip


def test_cap_settings_come_from_the_environment_and_are_checked() -> None:
    env = {"NAVI_PLAN_MAX_TOKENS": "512", "NAVI_ANSWER_MAX_TOKENS": "2048"}
    settings = Settings.from_env(env)
    assert (settings.plan_max_tokens, settings.answer_max_tokens) == (512, 2048)
    for name in ("NAVI_PLAN_MAX_TOKENS", "NAVI_ANSWER_MAX_TOKENS"):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: "0"})
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: "lots"})


@pytest.mark.parametrize("field", ["plan_max_tokens", "answer_max_tokens"])
def test_a_profile_cap_below_one_is_refused_with_its_key(tmp_path: Path, field: str) -> None:
    data = {"default_profile": "p", "profiles": {"p": {field: 0}}}
    with pytest.raises(ConfigError, match=rf"\$\.profiles\['p'\]\.{field}: expected a number"):
        parse_config(data, tmp_path / "config.json")


async def test_a_turn_without_planning_caps_its_answer(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "ok"}]) as h:
            await seed(h)
            await h.turn("s1", "what time is it in Paris")
            assert [b["options"]["num_predict"] for b in h.chat_requests] == [4096]
