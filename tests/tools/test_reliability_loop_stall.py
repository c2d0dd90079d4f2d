"""The loop_stall_huge_prompts scenario's rules, fed crafted facts: the neighbour's gap must stay
within 200 ms of its baseline and must have been measured across the burst; prompts are sized by
the server's max_body_bytes, and a server that does not say it (or allows too little) is skipped."""
from __future__ import annotations

import dataclasses
import json

from tests.tools.test_reliability_fakes import done
from tools.reliakit import observation as o
from tools.reliakit.limits import Limits
from tools.reliakit.scenarios import loop_stall_huge_prompts as stall

LIMITS = Limits("tiny", "local", "production", 1, 4, 8, 512, 1 << 20)
GOOD = {"baseline_gap_ms": 14.0, "burst_gap_ms": 40.0, "burst_s": 0.1, "prompt_chars": 1_000_000,
        "huge_prompts": 8, "neighbour_spanned_burst": True}


def failing(facts: dict) -> bool:
    [check] = stall.checks([], facts, LIMITS)
    return check.failed


def test_gap_rule():
    assert not failing(GOOD)
    assert not failing({**GOOD, "burst_gap_ms": 213.9})
    assert failing({**GOOD, "burst_gap_ms": 214.1})
    assert failing({**GOOD, "burst_gap_ms": 6280.0})  # the frozen stream
    assert failing({**GOOD, "burst_gap_ms": None})  # not measured: never a pass
    assert failing({**GOOD, "neighbour_spanned_burst": False})


def test_huge_prompts_expect_a_400_or_completion_and_fit_the_body_limit():
    neighbour, *huge = stall.plan(LIMITS)
    assert neighbour.expect.outcome == o.COMPLETED and len(huge) == stall.HUGE
    for x in huge:
        assert len(x.body) <= LIMITS.max_body_bytes
        assert len(json.loads(x.body)["prompt"]) == stall.PROMPT_CHARS
        assert x.expect.status == 400 and x.expect.error_code == "context_length_exceeded"
        assert x.expect.either.status == 200  # a server whose context holds it completes it
        assert done(x.label, x.expect, status=200, outcome=o.COMPLETED, tokens=1).resolved() is x.expect.either
    assert len({x.body for x in huge}) == stall.HUGE
    small = dataclasses.replace(LIMITS, max_body_bytes=300_000)
    assert all(len(x.body) <= 300_000 for x in stall.plan(small)[1:])


def test_skipped_where_the_body_limit_is_unknown_or_small():
    assert stall.skip_if(LIMITS) is None
    assert "max_body_bytes" in stall.skip_if(dataclasses.replace(LIMITS, max_body_bytes=None))
    assert "too small" in stall.skip_if(dataclasses.replace(LIMITS, max_body_bytes=64 << 10))
