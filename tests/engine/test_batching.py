"""Batched rows give the same greedy tokens as each row alone, whatever the mix of prefill and
decode rows in a step; the GPU thread's continuous batching matches offline generation."""
from __future__ import annotations

import queue

import pytest

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, Cancel, Released, Shutdown, StepEvents

PROMPTS = [[5, 9, 200, 31], [7], list(range(40, 140)), [300, 301, 302, 303, 304, 305, 306], [12, 13]]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # no prefix caching: these tests count the chunks a prompt is fed in (tests/engine/test_prefix_cache.py)
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=8, prefix_caching=False))
    yield e
    e.close()


def test_batch_equals_alone(engine):
    alone = [generate(engine, [p], 12, ignore_eos=True)[0].token_ids for p in PROMPTS]
    together = [g.token_ids for g in generate(engine, PROMPTS, 12, ignore_eos=True)]
    assert together == alone


def _run_thread(engine, commands_by_step, **thread_kw):
    """Feed commands, collect StepEvents until every admitted request ended."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, **thread_kw)
    gpu.start()
    tokens, finished, records, released = {}, {}, [], set()
    for cmd in commands_by_step:
        gpu.submit(cmd)
    want = {c.request_id for c in commands_by_step if isinstance(c, Admit)}
    cancelled = {c.request_id for c in commands_by_step if isinstance(c, Cancel)}
    while set(finished) | released < want:
        ev = events.get(timeout=60)
        if isinstance(ev, StepEvents):
            for t in ev.tokens:
                tokens.setdefault(t.request_id, []).append(t.token_id)
            finished.update({f.request_id: f.reason for f in ev.finished})
            released |= {r.request_id for r in ev.released}
            if ev.record:
                records.append(ev.record)
        assert not released - cancelled
    gpu.submit(Shutdown())
    gpu.join(10)
    return tokens, finished, records


def test_continuous_batching_matches_offline(engine):
    """Requests of different lengths and max_tokens, admitted together: exact offline tokens, and
    the thread really decoded rows at different positions in one step."""
    maxes = [12, 5, 9, 20, 1]
    ref = [generate(engine, [p], m, ignore_eos=True)[0].token_ids for p, m in zip(PROMPTS, maxes)]
    cmds = [Admit(f"r{i}", p, m, ignore_eos=True) for i, (p, m) in enumerate(zip(PROMPTS, maxes))]
    tokens, finished, records = _run_thread(engine, cmds)
    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == ref
    assert all(r == "length" for r in finished.values())
    assert max(r.decode_rows for r in records) >= 4
    assert engine.cache.free_slots == engine.cache.num_slots


def test_cancel_frees_slot_and_stops_tokens(engine):
    tokens, finished, records = _run_thread(engine, [Admit("a", PROMPTS[0], 500, ignore_eos=True), Cancel("a")])
    assert "a" not in finished
    assert len(tokens.get("a", [])) <= 1
    assert engine.cache.free_slots == engine.cache.num_slots


def test_chunked_prefill_is_exact_and_keeps_streams_decoding(engine):
    """With a 16-token prefill budget a 100-token prompt is fed in chunks while the short requests
    keep decoding in the same steps; every request still gets exactly its offline tokens."""
    maxes = [12, 5, 9, 20, 6]
    ref = [generate(engine, [p], m, ignore_eos=True)[0].token_ids for p, m in zip(PROMPTS, maxes)]
    cmds = [Admit(f"r{i}", p, m, ignore_eos=True) for i, (p, m) in enumerate(zip(PROMPTS, maxes))]
    tokens, finished, records = _run_thread(engine, cmds, max_prefill_tokens=16)
    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == ref
    assert max(r.prefill_tokens for r in records) <= 16
    chunked = [r for r in records if "r2" in r.request_ids and r.prefill_tokens > 0]
    assert len(chunked) >= 100 // 16  # the long prompt took several steps
    assert any(r.decode_rows > 0 for r in chunked)  # and others decoded beside its chunks
    assert engine.cache.free_slots == engine.cache.num_slots


def test_a_prompt_is_cut_only_when_it_comes_first(engine):
    """Beside earlier prompts a prompt that would not fit whole waits for the next step (a cut
    prompt's later chunk would run eagerly, with the step's other prompts), and the prompts behind
    it wait too (FCFS); a prompt longer than the whole budget is still fed in chunks."""
    prompts = {"a": list(range(10, 20)), "b": list(range(30, 40)), "c": [50, 51], "long": list(range(60, 100))}
    ref = {k: generate(engine, [p], 4, ignore_eos=True)[0].token_ids for k, p in prompts.items()}
    cmds = [Admit(k, p, 4, ignore_eos=True) for k, p in prompts.items()]
    tokens, _, records = _run_thread(engine, cmds, max_prefill_tokens=16)
    assert tokens == ref
    fed = [(r.prefill_tokens, sorted(r.request_ids)) for r in records if r.prefill_tokens]
    assert fed[0] == (10, ["a"])  # b (10 tokens) would have been cut to 6: it waits, and c behind it
    assert fed[1][0] == 12 and {"b", "c"} <= set(fed[1][1])  # b and c whole, beside a's decode
    assert [n for n, _ in fed[2:]] == [16, 16, 8]  # the 40-token prompt, first in its steps: chunks


def test_one_launch_sizes_name_each_kernel_and_the_router_follows_the_backend(engine):
    # what the start-up log's decode_path event carries on CUDA; on CPU the local backend runs its
    # experts in a loop and reads no router listing, so the router's one-launch form does not apply
    import dataclasses

    from pegainfer.engine.engine import one_launch_sizes
    k = engine.spec.kernels
    assert not engine.model.kernels.triton and not engine.backend.caps.fused_alignment  # CPU: no Triton
    sizes = one_launch_sizes(k, engine.backend.caps.fused_alignment)
    assert sizes == dict(norm_proj_rows=k.norm_proj_rows, embedding_in_norm_proj=k.embed_in_norm,
                         norm_linear_rows=0, mla_output_rows=k.mla_output_rows, router_one_launch_rows=0,
                         dense_swiglu_rows=k.dense_rows, head_argmax_rows=k.head_argmax_rows, argmax_rows=k.argmax_rows)
    assert one_launch_sizes(dataclasses.replace(k, norm_linear_rows=1), False)["norm_linear_rows"] == 1
    assert one_launch_sizes(dataclasses.replace(k, norm_linear_rows=1, batch_invariant=False), False)[
        "norm_linear_rows"] == 0  # only batch-invariant mode runs it
    assert sizes["norm_proj_rows"] == sizes["head_argmax_rows"] == 1 and sizes["argmax_rows"] == 1024
    assert one_launch_sizes(k, True)["router_one_launch_rows"] == 16  # the fused expert kernels, as on CUDA
    assert one_launch_sizes(dataclasses.replace(k, router_one_launch=False), True)["router_one_launch_rows"] == 0
