"""engine/kernels/sample_split.py: the sampler with each row split over a fixed number of programs
(KernelConfig.sample.chunks) gives engine.sampler.sample's tokens and, bit for bit, the one-program
kernel's tokens, log-probs and top-N (same tiles, same folds in tile order), alone and in crowds;
its draws follow the masked softmax; the edges hold where a row's work crosses tiles and programs
(V not a multiple of the tile, a program holding several tiles and the last fewer, top-k larger
than a tile, top-p near 1, min-p's second race, everything but one token masked by logit_bias,
penalties, kept sets beyond CAP that go to the one-program code). Small vocabularies with small
tiles on the CPU (Triton's interpreter); the GPU variants run lite's 102,400 at batches 1-256."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.contract import SamplingParams  # noqa: E402
from pegainfer.engine.sampler import Draw  # noqa: E402
from tests.engine.kernels.route_crowds import SIZES  # noqa: E402
from tests.engine.kernels.sample_cases import SPECS, crowd_draws, kernel_inputs, mixed_draws  # noqa: E402
from tests.engine.kernels.test_sample import quick_interpreter, reference, run  # noqa: E402, F401
from tests.engine.test_sampler import LOGITS, chi_square_p, expected  # noqa: E402

P_MIN = 1e-3


def assert_same_bits(a, b) -> None:
    """Two SampleOuts equal bit for bit (tokens, chosen log-probs, top ids, top log-probs)."""
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y), (x, y)


def both(logits: torch.Tensor, draws: list[Draw], logprobs: int | None = None, misses: int = 0, **kw):
    """(one program per row, split over kw's chunks): checked against each other bit for bit and
    against the sampler's tokens (at most `misses` rows apart: the GPU variants, where the
    one-program kernel already chose another token than torch on 1 row of 256 in sample_bench,
    undiagnosed; the two kernels must still agree)."""
    chunks = kw.pop("chunks")
    one, split = run(logits, draws, logprobs, **kw), run(logits, draws, logprobs, chunks=chunks, **kw)
    assert_same_bits(split, one)
    want = reference(logits, draws, logprobs).tokens
    apart = (split.tokens != want).nonzero().flatten().tolist()
    assert len(apart) <= misses, (apart, split.tokens[apart].tolist(), want[apart].tolist())
    return split


# ---- CPU (Triton's interpreter) ----

@pytest.mark.parametrize("cap", [32, 256], ids=["beyond_cap", "gathered"])
def test_a_mixed_batch_gives_the_one_program_bits(triton_interpreter, cap):
    """V 1000 in tiles of 128 (8 tiles, the last partial): 3 programs of 3, 3 and 2 tiles. cap 32:
    the large kept sets and the top-N with ties go to the one-program code inside the last launch."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(SPECS), 1000, generator=gen) * 3
    both(logits, mixed_draws(len(SPECS), 1000, seed=1), 5, block_v=128, cap=cap, chunks=3)
    # one tile per program, and V = 257 (a last tile of one column); no log-probs
    both(logits[:, :257], mixed_draws(len(SPECS), 257, seed=2), None, block_v=64, cap=cap, chunks=64)


def test_a_rows_bits_are_the_same_in_any_crowd(triton_interpreter):
    gen = torch.Generator().manual_seed(1)
    probe = Draw(0, SamplingParams(temperature=0.9, top_k=30, top_p=0.85, presence_penalty=0.3,
                                   logit_bias=((4, 2.0),), logprobs=3), -77, 1, 9, [1, 2, 3], [4, 4, 5])
    row = torch.randn(1, 300, generator=gen) * 2
    alone = run(row, [probe], 3, cap=64, block_v=64, chunks=4)
    for size in (2, 7):
        pos = int(torch.randint(size, (1,), generator=gen))
        logits = torch.randn(size, 300, generator=gen) * 2
        logits[pos] = row[0]
        got = run(logits, crowd_draws(probe, size, pos, 300, seed=size), 3, cap=64, block_v=64, chunks=4)
        assert_same_bits([t[pos] for t in got], [t[0] for t in alone])


def test_a_rows_bits_do_not_move_when_the_batch_changes_its_programs(triton_interpreter):
    """A row alone over 5 programs of 2 tiles, in a crowd of 7 over 2 of 5, in one of 33 over one of 10:
    the tiles' parts and folds are the same whichever program computes them, so are the bits."""
    chunks = {1: 8, 7: 2, 33: 1}  # programs per row (10 tiles of 32 columns)
    gen = torch.Generator().manual_seed(3)
    probes = [Draw(0, SamplingParams(temperature=0.9, top_k=30, top_p=0.85, presence_penalty=0.3, logprobs=3),
                   -5, 1, 2, [1, 2, 3], [4, 4, 5]),
              Draw(0, SamplingParams(temperature=1.1, top_p=0.97, min_p=0.01), 11, 0, 4, [7], [])]
    for probe in probes:
        row = torch.randn(1, 300, generator=gen)
        alone = run(row, [probe], 3, cap=64, block_v=32, chunks=chunks[1])
        for size in (7, 33):
            pos = int(torch.randint(size, (1,), generator=gen))
            logits = torch.randn(size, 300, generator=gen) * 2
            logits[pos] = row[0]
            got = run(logits, crowd_draws(probe, size, pos, 300, seed=size), 3, cap=64, block_v=32,
                      chunks=chunks[size])
            assert_same_bits([t[pos] for t in got], [t[0] for t in alone])


SPREAD = [0, 3, 6, 7, 9, 11, 12, 15]  # LOGITS' columns of a 16-wide row: two tiles of 8


@pytest.mark.parametrize("kw", [{"temperature": 1.3, "top_k": 5, "top_p": 0.9, "min_p": 0.05},
                                {"temperature": 1.0, "min_p": 0.2}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_split_draws_follow_the_masked_softmax(triton_interpreter, kw):
    """LOGITS spread over two tiles (two programs), the other entries without mass."""
    logits = torch.full((1, 16), -1e4)
    logits[0, SPREAD] = torch.tensor(LOGITS)
    n = 200
    tokens = run(logits, [Draw(0, SamplingParams(**kw), 99, 0, i) for i in range(n)], block_v=8, chunks=2,
                 cap=16).tokens
    counts = torch.bincount(tokens, minlength=16)
    assert int(counts.sum()) == int(counts[SPREAD].sum()) == n
    probs = expected(LOGITS, kw["temperature"], kw.get("top_k", -1), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
    got = counts[SPREAD].tolist()
    assert all(c == 0 for c, p in zip(got, probs) if p == 0), (got, probs)
    assert chi_square_p(got, probs) > P_MIN, (got, [round(p * n) for p in probs])


def test_edges_across_tiles(triton_interpreter):
    gen = torch.Generator().manual_seed(4)
    v = 300  # 5 tiles of 64, the last of 44: 2 programs (3 tiles and 2)
    logits = torch.randn(6, v, generator=gen) * 2
    logits[5] = torch.randn(v, generator=gen) * 0.1  # flat: top-p 0.999's nucleus is nearly every entry
    specs = [SamplingParams(temperature=1.0, top_k=150),  # top-k larger than a tile and a program
             SamplingParams(temperature=0.8, top_p=0.999),  # top-p near 1
             SamplingParams(temperature=1.5, min_p=0.5),  # min-p: the race's winner often below the floor
             SamplingParams(temperature=1.0, repetition_penalty=1.5, frequency_penalty=0.7, presence_penalty=0.4,
                            top_p=0.8),
             SamplingParams(temperature=1.0, top_k=1),
             SamplingParams(temperature=1.0, top_p=0.95)]
    for seed in range(2):
        draws = [Draw(r, spec, 1000 * seed + r, 0, seed, [1, 70, 140], [200, 250, 250, 299]) for r, spec in
                 enumerate(specs)]
        for cap in (16, 256):  # 16: top-k 150 and the nuclei beyond it, through the one-program code
            sweeps = torch.zeros(6, dtype=torch.int32)
            both(logits, draws, 4, block_v=64, cap=cap, chunks=2, sweeps=sweeps)  # the split's passes last
            # the split's own passes (3) where the kept set fits, more where the one program took the row over
            assert (sweeps[:5] == 3).all() if cap == 256 else (sweeps[[0, 1, 3]] > 3).all(), (cap, sweeps)
            assert sweeps[5] > 3  # the flat row's nucleus: beyond either cap
    # everything but one token masked by logit_bias, that token in the last (partial) tile
    bias = tuple((c, -3e38) for c in range(v) if c != 297)
    for spec in (SamplingParams(temperature=1.0, logit_bias=bias), SamplingParams(temperature=2.0, top_p=0.5,
                                                                                    logit_bias=bias),
                 SamplingParams(temperature=0.7, top_k=40, min_p=0.1, logit_bias=bias)):
        draws = [Draw(r, spec, 7 * r, 0, 0) for r in range(2)]
        assert both(logits[:2], draws, 2, block_v=64, chunks=2).tokens.tolist() == [297] * 2


def test_kept_sets_beyond_cap_stay_split(triton_interpreter):
    """Flat logits (V 2000, 8 tiles, 4 programs) and cap 16: every kept set is beyond the cap. Top-k
    or top-p alone: a recount inside the first count's band, then the band around the boundary
    sorted (the entries above it raced where they lie: 4 passes) or, where the band is still beyond
    the cap, the exact rejection rounds: the race's winner among the entries above the first
    count's pivot if kept (4 passes), else the winner among those before it if kept (5); else, and
    with top-k and top-p both, the one-program code (more)."""
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(1, 2000, generator=gen) * 0.5).expand(9, 2000).contiguous()
    seeds = [*range(1000, 1008), 1033]
    draws = [Draw(r, SamplingParams(temperature=1.0, top_p=0.3), seed, 0, 3) for r, seed in enumerate(seeds)]
    sweeps = torch.zeros(9, dtype=torch.int32)
    both(logits, draws, None, block_v=256, cap=16, chunks=4, sweeps=sweeps)
    # the first winner kept; the second; neither (seed 1033: the one program's further rounds)
    assert set(sweeps[:8].tolist()) == {4, 5} and sweeps[8] > 5, sweeps
    specs = [SamplingParams(temperature=1.0, top_k=300), SamplingParams(temperature=0.7, top_p=0.95),
             SamplingParams(temperature=1.0, top_k=200, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.05),
             SamplingParams(temperature=1.0, top_p=0.5, min_p=0.5, presence_penalty=1.0)]
    draws = [Draw(r, spec, 50 + r, 0, 1, [3, 4], [7, 7, 8]) for r, spec in enumerate(specs)]
    both(logits[:5], draws, 3, block_v=256, cap=16, chunks=4, sweeps=sweeps)
    assert (sweeps[[0, 1, 3, 4]] <= 5).all() and sweeps[2] > 5, sweeps  # both cuts: the one program


def test_extreme_shaping_across_tiles(triton_interpreter):
    """test_sample.py's extremes (+-1e30 from bias and penalties, a top_p of 1e-300, huge penalties)
    over tiles of 2 columns (3 tiles: 2 programs, and 3) and one program of 2 tiles."""
    logits = torch.tensor([[0.0, 5.0, -5.0, 1e-3, 2.0]])
    specs = [SamplingParams(temperature=1e-5, repetition_penalty=1e-300, frequency_penalty=-2, presence_penalty=2),
             SamplingParams(temperature=2.0, logit_bias=((2, 100.0), (1, -100.0)), top_p=1e-300),
             SamplingParams(temperature=1.0, logit_bias=((0, 3e38), (4, 3e38)), repetition_penalty=1e-40),
             SamplingParams(temperature=1.0, logit_bias=((0, -3e38), (1, -3e38), (2, -3e38)), top_k=2),
             SamplingParams(logit_bias=((3, 3e38),), frequency_penalty=3e38)]
    draws = [Draw(0, s, i, 0, 3, [0, 1], [1, 3, 3]) for i, s in enumerate(specs)]
    for block_v, chunks in ((2, 2), (2, 64), (4, 1)):
        got = both(logits, draws, 2, block_v=block_v, chunks=chunks, cap=8)
        assert torch.isfinite(got.logprobs).all() and torch.isfinite(got.top_logprobs).all()


def test_raw_logprobs_and_ties_across_tiles(triton_interpreter):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 700, generator=gen) * 4
    logits[1, [9, 300, 650]] = logits[1].max() + 1  # tied maxima in three tiles
    logits[2] = -3.0
    logits[2, :10] = torch.linspace(9, 5, 10)
    logits[2, 100:] = 0.5  # 600 ties across the 20th entry, in every tile
    draws = [Draw(r, SamplingParams(temperature=0.0 if r % 2 else 1.0, top_k=7, logprobs=20), r, 0, 0)
             for r in range(3)]
    for cap in (32, 1024):
        got = both(logits, draws, 20, block_v=128, cap=cap, chunks=3)
        assert got.top_ids[1, :3].tolist() == [9, 300, 650] and got.tokens[1] == 9
    lp = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(got.logprobs, lp.gather(1, got.tokens[:, None])[:, 0], atol=1e-5, rtol=0)


def test_passes_record_and_the_program_count(triton_interpreter):
    from pegainfer.engine.kernels.sample import sample
    from pegainfer.engine.kernels.sample_split import programs_per_row
    assert programs_per_row(102400, 2048, 64) == (50, 1, 50)  # lite: a program per tile
    assert programs_per_row(102400, 2048, 32) == (50, 2, 25)
    assert programs_per_row(102400, 1024, 32) == (100, 4, 25) and programs_per_row(1000, 256, 0) == (4, 4, 1)
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(6)) * 3
    specs = [SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, min_p=0.1),
             SamplingParams(temperature=0.8, top_p=0.8, frequency_penalty=0.2),
             SamplingParams(temperature=0.7, top_k=40, presence_penalty=0.5)]
    draws = [Draw(r, spec, r, 0, 0, [], [r, 3]) for r, spec in enumerate(specs)]
    rows, history, _ = kernel_inputs(draws, 1000, "cpu")
    before = history.clone()
    sweeps = torch.zeros(5, dtype=torch.int32)
    tickets = torch.zeros(8, dtype=torch.int32)  # the last launch's: who picks each row, left at zero
    out = sample(logits, rows, history=history, record=True, sweeps=sweeps, cap=256, block_v=256, chunks=4,
                 tickets=tickets)
    assert sweeps.tolist() == [1, 1, 2, 3, 3]  # the launches that read the row
    assert torch.equal(out.tokens, reference(logits, draws).tokens) and not tickets.any()
    before[[0, 1], out.tokens[3:]] += 1  # the penalised draws (history slots 0 and 1) count their tokens
    assert torch.equal(history, before)
    again = sample(logits, rows, history=before.clone(), sweeps=sweeps, cap=256, block_v=256, chunks=4, tickets=tickets)
    assert not tickets.any() and sweeps.tolist() == [1, 1, 2, 3, 3]  # the same tickets, reused
    assert torch.equal(again.tokens[[0, 1, 2]], out.tokens[[0, 1, 2]])  # the unpenalised rows: same draw


# ---- GPU ----

def test_gpu_split_gives_the_one_program_bits(triton_gpu):
    gen = torch.Generator().manual_seed(10)
    # two row counts and two top-N: every variant is a Triton compile of the eight launches (the first
    # H100 run of four sizes and three top-N had not finished one test in 270 s)
    for size in (1, 256):
        logits = (torch.randn(size, 102400, generator=gen) * 3).cuda()
        for n_top, chunks in ((20, 64), (None, 64)):  # several tiles a program: the CPU tests
            both(logits, mixed_draws(size, 102400, seed=size + chunks), n_top, misses=size // 100, chunks=chunks)


def test_gpu_split_rows_are_the_same_in_any_crowd(triton_gpu):
    gen = torch.Generator().manual_seed(11)
    for k, probe_spec in enumerate(SPECS):
        probe = Draw(0, probe_spec, 1000 + k, 0, 7, [1, 2, 3], [4, 4, 5])
        row = (torch.randn(1, 102400, generator=gen) * 3).cuda()
        alone = run(row, [probe], 5, chunks=64)
        for size in SIZES[::3] + (256,):
            pos = int(torch.randint(size, (1,), generator=gen))
            logits = (torch.randn(size, 102400, generator=gen) * 3).cuda()
            logits[pos] = row[0]
            got = run(logits, crowd_draws(probe, size, pos, 102400, seed=size), 5, chunks=64)
            assert_same_bits([t[pos] for t in got], [t[0] for t in alone])


def test_gpu_split_draws_follow_the_masked_softmax(triton_gpu):
    for kw in ({"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.9}, {"temperature": 1.0, "min_p": 0.05},
               {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "min_p": 0.05}):
        logits = torch.full((1, 102400), -1e4)
        cols = [0, 3000, 20000, 40961, 51200, 77777, 99999, 102399]
        logits[0, cols] = torch.tensor(LOGITS)
        tokens = run(logits.cuda(), [Draw(0, SamplingParams(**kw), 5, 0, i) for i in range(20_000)], chunks=64).tokens
        counts = torch.bincount(tokens.cpu(), minlength=102400)
        probs = expected(LOGITS, kw["temperature"], kw.get("top_k", -1), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
        assert int(counts[cols].sum()) == 20_000 and chi_square_p(counts[cols].tolist(), probs) > P_MIN, kw


def test_gpu_split_replays_in_a_cuda_graph(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.sample import sample
    logits = (torch.randn(64, 102400, generator=torch.Generator().manual_seed(12)) * 3).cuda()
    draws = mixed_draws(64, 102400, seed=3)
    rows, history, bias = kernel_inputs(draws, 102400, "cuda")
    want = run(logits, draws, 5)  # one program per row
    out = sample(logits, rows, history=history, bias=bias, logprobs=5, chunks=64)
    graph, _ = capture(lambda: sample(logits, rows, history=history, bias=bias, logprobs=5, out=out, chunks=64), None)
    for _ in range(20):
        out.tokens.fill_(-1)
        graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(out, want)
