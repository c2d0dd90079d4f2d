"""Every numeric field of a completions body is bounded at parse time, from the one table in
engine/contract.py: integers beyond int64 (orjson parses up to 2^64 - 1), booleans and floats where
an integer goes (a whole float is its integer, as in vLLM), NaN-like strings, penalties and logit_bias outside their ranges all get a 400
naming the field; the model-dependent bounds (token ids and top_k against the vocabulary) are
checked once the vocabulary is known; and the parse builds the engine's Admit, the contract's
SamplingParams inside it, with the values the body sent."""
from __future__ import annotations

import orjson
import pytest

from pegainfer.daemon.protocol import APIError, parse_completion, vocabulary_problem
from pegainfer.engine.contract import BOUNDS, Admit, SamplingParams

VOCAB = 1024
HUGE = [2**63, 2**64 - 1, -2**63 - 1, 10**30]


def parse(**fields):
    return parse_completion({"prompt": "hi", **fields}, max_tokens_default=16)


def refused(param: str, **fields) -> APIError:
    with pytest.raises(APIError) as e:
        parse(**fields)
    assert e.value.status == 400 and e.value.param == param, (fields, e.value)
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}
    return e.value


INTEGER_FIELDS = ["max_tokens", "top_k", "seed", "n", "best_of", "logprobs"]


@pytest.mark.parametrize("name", INTEGER_FIELDS)
@pytest.mark.parametrize("value", HUGE + [True, 2.5, 1e30, "5", "NaN", [1], {"a": 1}])
def test_integer_fields_refuse_huge_and_mistyped_values(name, value):
    refused(name, **{name: value})


def test_a_whole_float_is_taken_as_its_integer_as_vllm_does():
    """vLLM's pydantic fields (lax mode) take 5.0 where an integer goes; a fraction is still a 400,
    and a JSON integer past 64 bits (a float once parsed) is refused, not rounded to a valid one."""
    r = parse(max_tokens=5.0, n=2.0, best_of=3.0, top_k=40.0, seed=-7.0, logprobs=2.0)
    assert (r.max_tokens, r.n, r.best_of, r.sampling.top_k, r.sampling.seed, r.logprobs) == (5, 2, 3, 40, -7, 2)
    assert all(type(v) is int for v in (r.max_tokens, r.n, r.best_of, r.sampling.top_k, r.sampling.seed))
    for past in (b"1180591620717411303424", b"-9223372036854775809"):  # past 64 bits: floats, never rounded in
        message = refused("seed", seed=orjson.loads(past)).message
        assert "'seed' must be a signed 64-bit integer, got " in message and message.endswith("(out of range)")
    assert "integer, got float" in refused("max_tokens", max_tokens=5.5).message


def test_whole_floats_in_token_id_lists_are_their_integers_as_vllm_takes_them():
    """prompt and stop_token_ids (list[int] in vLLM's models, lax mode): 7.0 is 7 there too; a
    fraction, or a float past 2^53, is still a 400."""
    r = parse_completion({"prompt": [1.0, 2, 3.0], "stop_token_ids": [5.0, 6]}, max_tokens_default=16)
    assert r.prompts == [[1, 2, 3]] and all(type(t) is int for t in r.prompts[0])
    assert r.stop_token_ids == [5, 6] and all(type(t) is int for t in r.stop_token_ids)
    r = parse_completion({"prompt": [[1.0, 2.0], [3]]}, max_tokens_default=16)
    assert r.prompts == [[1, 2], [3]]
    for prompt in ([1.5, 2], [[1, 2.5]], [2.0 ** 60]):
        with pytest.raises(APIError) as e:
            parse_completion({"prompt": prompt}, max_tokens_default=16)
        assert e.value.status == 400 and e.value.param == "prompt", prompt
    assert refused("stop_token_ids", stop_token_ids=[1, 2.5]).status == 400
    assert parse(prompt="7.0").prompts == ["7.0"]  # text stays text


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty"])
@pytest.mark.parametrize("value", [2**64 - 1, -2**63 - 1, 1e308, -1e308, "NaN", "inf", True, [0.5],
                                   {"nested": [1, {"x": None}]}])
def test_number_fields_refuse_out_of_range_and_mistyped_values(name, value):
    refused(name, **{name: value})


def test_json_cannot_carry_nan_or_infinity():
    for raw in (b'{"prompt": "hi", "temperature": NaN}', b'{"prompt": "hi", "temperature": 1e400}'):
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
    assert isinstance(orjson.loads(b"18446744073709551616"), float)  # past 2^64 - 1: a float, refused as such
    refused("top_k", top_k=orjson.loads(b"18446744073709551616"))


def test_signed_64_bit_edges_and_the_documented_ranges_pass():
    r = parse(seed=2**63 - 1, top_k=2**63 - 1, max_tokens=2**63 - 1, repetition_penalty=2.0, presence_penalty=-2,
              frequency_penalty=2.0, temperature=2, top_p=1e-9, min_p=1.0, logprobs=5, n=16, best_of=16)
    assert (r.sampling.seed, r.sampling.top_k, r.sampling.repetition_penalty) == (2**63 - 1, 2**63 - 1, 2.0)
    assert parse(seed=-2**63).sampling.seed == -2**63
    refused("repetition_penalty", repetition_penalty=2.01)
    refused("repetition_penalty", repetition_penalty=0)
    assert parse(top_k=0).sampling.top_k == parse(top_k=-1).sampling.top_k == -1  # both off, as in vLLM
    refused("top_k", top_k=-2)


@pytest.mark.parametrize("field,value", [
    ("prompt", [1, 2**63]), ("prompt", [1, 2**64 - 1]), ("prompt", [-1]), ("prompt", [1, 2.5]),
    ("stop_token_ids", [2**64 - 1]), ("stop_token_ids", [True]), ("stop_token_ids", [1.5]), ("stop_token_ids", [-3]),
    ("stop_token_ids", "7"), ("stop_token_ids", [[1]]), ("stop_token_ids", [None]),
])
def test_token_id_lists_refuse_anything_but_int64_ids(field, value):
    refused(field, **{field: value})


@pytest.mark.parametrize("bias", [
    [1, 2], "x", {"a": 1}, {"-1": 1}, {"1.5": 1}, {"１": 1}, {"99999999999999999999": 1}, {"5": 100.5},
    {"5": -101}, {"5": "1"}, {"5": True}, {"5": None}, {"5": [1]}, {"5": 2**64 - 1}, {"5": 1, "05": 2},
    {str(i): 1 for i in range(301)},
])
def test_logit_bias_shape_is_openais(bias):
    refused("logit_bias", logit_bias=bias)


def test_logit_bias_is_parsed_and_reaches_the_engine_parameters():
    r = parse(logit_bias={"5": 100, "7": -100.0, "9": 0.5})
    assert r.sampling.logit_bias == ((5, 100.0), (7, -100.0), (9, 0.5))
    assert r.admit("r", [1]).sampling.logit_bias == ((5, 100.0), (7, -100.0), (9, 0.5))


def test_stream_options_include_usage_is_a_boolean():
    with pytest.raises(APIError) as e:
        parse(stream=True, stream_options={"include_usage": 1})
    assert e.value.param == "stream_options"


def test_vocabulary_bounds_are_checked_once_the_model_is_known():
    ok = parse(top_k=VOCAB, logit_bias={str(VOCAB - 1): 1}, stop_token_ids=[VOCAB - 1])
    assert vocabulary_problem(ok, [0, VOCAB - 1], VOCAB) is None
    cases = [(parse(top_k=VOCAB + 1), [1], "top_k"), (parse(top_k=2**63 - 1), [1], "top_k"),
             (parse(logit_bias={str(VOCAB): 1}), [1], "logit_bias"),
             (parse(stop_token_ids=[VOCAB]), [1], "stop_token_ids"), (parse(), [1, VOCAB], "prompt")]
    for req, ids, param in cases:
        problem = vocabulary_problem(req, ids, VOCAB)
        assert problem is not None and problem.status == 400 and problem.param == param, (param, problem)


def test_every_bounded_field_is_in_the_one_table():
    for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "logprobs", "n", "best_of", "logit_bias"):
        assert name in BOUNDS
        refused(name, **{name: 10**30})


def test_the_parse_builds_the_engine_command_once():
    r = parse(max_tokens=7, temperature=1, top_k=4, seed=3, stop_token_ids=[9, 9, 2], n=2, best_of=3, ignore_eos=True)
    command = r.admit("cmpl-1", [1, 2])
    assert command == Admit("cmpl-1", [1, 2], 7, True, SamplingParams(temperature=1.0, top_k=4, seed=3, logprobs=0),
                            3, (9, 2))
    assert command.sampling is r.sampling and type(command.sampling.temperature) is float
    echo = parse(logprobs=2, echo=True)
    assert (echo.logprobs, echo.sampling.logprobs, echo.sampling.prompt_logprobs) == (2, 2, 2)
    plain = parse()
    assert plain.sampling == SamplingParams() and plain.sampling.plain_greedy and plain.logprobs is None


@pytest.mark.parametrize("role,shown", [(5, "got 5 (int)"), (None, "required"), (["user"], "got ['user'] (list)"),
                                        ("robot", "got 'robot'")])
def test_a_bad_chat_role_is_named_by_its_value_or_its_type(role, shown):
    from pegainfer.daemon.chat import parse_messages
    with pytest.raises(APIError) as e:
        parse_messages([{"role": role, "content": "hi"}])
    assert e.value.param == "messages" and shown in e.value.message
