"""The contract's one check of the sampling parameters (SamplingParams.checked against BOUNDS): the
defaults are greedy, every edge of every bound passes and the first value past it is refused with a
ParamError naming the field (a ParamTypeError, also a TypeError, for a wrong type), numbers become
floats, two bad fields always report the same one, logit_bias is bounded in size, ids and values;
and the finish reasons are the very strings a response carries."""
from __future__ import annotations

import pytest

from pegainfer.engine.contract import (
    BOUNDS,
    INT64_MAX,
    INT64_MIN,
    MAX_LOGIT_BIAS_ENTRIES,
    FinishReason,
    ParamError,
    ParamTypeError,
    SamplingParams,
    check,
)

EDGES = {  # field: (allowed at the edge, the first value past it)
    "temperature": (2.0, 2.5), "top_p": (1e-9, 0.0), "min_p": (1.0, 1.5), "presence_penalty": (-2.0, -2.5),
    "frequency_penalty": (2.0, 2.01), "repetition_penalty": (2.0, 0.0), "top_k": (INT64_MAX, INT64_MAX + 1),
    "seed": (INT64_MIN, INT64_MIN - 1), "logprobs": (5, 6), "prompt_logprobs": (0, -1),
}


def test_defaults_are_greedy_and_checked_defaults_are_the_defaults():
    assert SamplingParams.checked() == SamplingParams()
    assert SamplingParams().plain_greedy and SamplingParams.checked(temperature=None).temperature == 0.0
    assert SamplingParams.checked(top_k=-1).top_k == -1  # -1: off


@pytest.mark.parametrize("name", EDGES)
def test_each_bound_passes_its_edge_and_refuses_the_first_value_past_it(name):
    good, bad = EDGES[name]
    assert getattr(SamplingParams.checked(**{name: good}), name) == good
    with pytest.raises(ParamError) as e:
        SamplingParams.checked(**{name: bad})
    assert e.value.param == name and f"'{name}' must be" in str(e.value)
    assert name in BOUNDS


@pytest.mark.parametrize("name,value", [("temperature", "hot"), ("temperature", True), ("seed", 1.5),
                                        ("top_k", 2.0), ("logprobs", False), ("min_p", [0.5])])
def test_a_wrong_type_is_a_type_error_naming_the_field(name, value):
    with pytest.raises(ParamTypeError) as e:
        SamplingParams.checked(**{name: value})
    assert isinstance(e.value, TypeError) and e.value.param == name


def test_numbers_become_floats_and_integers_stay_integers():
    p = SamplingParams.checked(temperature=2, top_p=1, presence_penalty=-2, seed=7, top_k=3, logit_bias=((4, 1),))
    assert [type(v) for v in (p.temperature, p.top_p, p.presence_penalty)] == [float, float, float]
    assert (p.seed, p.top_k, p.logit_bias) == (7, 3, ((4, 1.0),)) and type(p.logit_bias[0][1]) is float


def test_two_bad_fields_report_the_first_in_field_order():
    for _ in range(3):
        with pytest.raises(ParamError) as e:
            SamplingParams.checked(logprobs=9, top_p=0, temperature=-1)
        assert e.value.param == "temperature"


@pytest.mark.parametrize("bias,message", [
    (((1, 101.0),), "must be in [-100, 100]"), (((-1, 1.0),), "must be >= 0"), (((1, 1.0), (1, 2.0)), "token 1 twice"),
    (((1, float("nan")),), "must be in"), (tuple((i, 1.0) for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)), "at most 300"),
    (((1, "x"),), "must be a number"), ((1, 2), "pairs"),
])
def test_logit_bias_is_bounded(bias, message):
    with pytest.raises(ParamError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        SamplingParams.checked(logit_bias=bias)
    assert e.value.param == "logit_bias"


def test_an_unknown_field_is_a_programming_error():
    with pytest.raises(TypeError):
        SamplingParams.checked(temprature=1.0)


def test_check_returns_the_value_and_names_the_bound_it_used():
    assert check("n", 16) == 16
    with pytest.raises(ParamError) as e:
        check("stop_token_ids", -1, "token_id")
    assert e.value.param == "stop_token_ids"


def test_finish_reasons_are_the_strings_a_response_carries():
    assert FinishReason("stop") is FinishReason.STOP and FinishReason.LENGTH == "length"
    assert f"{FinishReason.STOP}" == "stop"
