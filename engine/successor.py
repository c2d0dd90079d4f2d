"""The step launched while another is in flight (overlapped scheduling, engine/batcher.py): its rows
and where their input ids come from.

- Every sequence of the step in flight (`prev`) that still wants a token after the one in flight gets
  a decode row whose input id is that token, taken on the device (feed: its index in the decode
  graphs' token buffer, which holds prev's one-token rows' tokens in order, then its prompt rows'
  first tokens: a prompt prefilled in prev decodes in the very next launch).
- With admission overlapped (Batcher.overlap_admission, the daemon's --async-admission): plain
  greedy sequences not in flight join too, their ids known on the host (feed -1). A decoding one
  whose first token came back with the step read last; a prompt's next chunk; requests admitted now
  (FCFS, capacity permitting, while the head of the queue is a plain greedy request of one choice),
  their first chunk within what the step's prompt budget has left (any prompt may be cut: a prompt's
  bits do not depend on its chunking); a prompt's next chunk, even with the one before
  in flight (its keys are written first, on the one stream).

Otherwise, while a request waits for capacity the successor is None and the GPU thread reads the step
in flight first (admission, prefill, forks and host-sampled steps run on their own). An overlapped
successor never preempts: when its rows need more pages than are free, it is not launched. Capacity
freed while a step is in flight may be handed to a newcomer: its writes are queued behind that step's
on the one device stream."""
from __future__ import annotations

import math

from pegainfer.engine.batch import RowInput
from pegainfer.engine.sampler import Draw
from pegainfer.engine.sequence import Sequence
from pegainfer.engine.step_plan import StepPlan

# b below is the engine.batcher.Batcher calling in (not imported here: it imports this module)


def successor(b, prev: StepPlan) -> tuple[StepPlan | None, list[tuple[str, int]]]:
    """(the step after prev, to launch before prev is read, or None; the requests it admitted, each
    with its prompt tokens found in the prefix cache)."""
    if not b.overlap:
        return None, []
    joining = b.overlap_admission and all(s.plain for s in prev.seqs)
    if b.can_admit() and not (joining and _plain_head(b)):
        return None, []  # it is admitted once prev is read
    running = b.running
    rows, seqs, feed, grow = [], [], [], []
    top = prefill = 0

    def decode_row(seq: Sequence, token: int, j: int) -> None:
        """seq's next one-token row: its id from the host (token, j -1) or fed from prev's tokens (j)."""
        nonlocal top
        start = seq.cached
        seqs.append(seq)
        rows.append(RowInput(seq.slot, [token], start))
        feed.append(j)
        seq.cached = start + 1
        top = max(top, start)
        if start >= seq.room:
            grow.append(seq)

    if prev.prefill_tokens:  # prompt rows beside (joined): feed indices run over prev's one-token rows, then them
        order = _fed_indices(prev)
    else:
        order = enumerate(prev.seqs)
    for j, seq in order:
        if running.get(seq.key) is seq and len(seq.output_ids) + 1 < seq.max_tokens:
            decode_row(seq, 0, j)  # the id comes from the feed
    admitted: list[tuple[str, int]] = []
    chunks: list[Sequence] = []  # prompts to continue (chunked prefill; the chunk before may be in flight)
    if joining:
        in_flight = {seq.key for seq in prev.seqs}
        for seq in running.values():
            if seq.slot < 0 or not seq.plain or seq.forks:
                continue
            if seq.prefilling:
                chunks.append(seq)
                continue
            # decoding, its last token read back already
            if (seq.key not in in_flight and not seq.replay
                    and seq.cached == len(seq.prompt_ids) + len(seq.output_ids) - 1):
                decode_row(seq, seq.output_ids[-1], -1)
    if grow and len(grow) > b.capacity.available:  # a preemption is due: not while in flight
        for seq in seqs:
            seq.cached -= 1
        return None, []
    for seq in grow:
        b.capacity.grow(seq, seq.cached)
    prompts: list[tuple[Sequence, int, int]] = []  # (sequence, start, end) of its prompt row
    if joining:
        budget = b.prompt_budget()
        room = b.max_step_prompts or math.inf  # prompt rows the step may take
        for seq in chunks:
            if budget <= 0 or len(prompts) == room:
                break
            budget -= _prompt_row(b, seq, budget, prompts)
        while budget > 0 and len(prompts) < room and b.can_admit() and _plain_head(b):
            seq = b.waiting.popleft()
            b.capacity.take(seq)
            running[seq.key] = seq
            admitted.append((seq.request_id, seq.cached))
            budget -= _prompt_row(b, seq, budget, prompts)
    owners, draw_rows = seqs, None  # every one-token row draws
    if prompts:  # a prompt draws from its last chunk only
        owners, draw_rows = list(seqs), list(range(len(rows)))
        for seq, start, end in prompts:
            if end == len(seq.prompt_ids):
                owners.append(seq)
                draw_rows.append(len(rows))
            seqs.append(seq)
            rows.append(RowInput(seq.slot, seq.prompt_ids[start:end], start, prompt=True))
            feed.append(-1)
            prefill += end - start
            top = max(top, end - 1)
    if not seqs:
        return None, admitted
    draws = None
    if prev.draws is not None and not all(s.plain for s in seqs):  # counting the token in flight
        draws = [Draw(i, s.sampling, s.seed, s.index, len(s.output_ids) + 1, s.prompt_ids, s.output_ids, s.params)
                 for i, s in enumerate(seqs)]
    return StepPlan(rows, draws=draws, draw_rows=draw_rows, feed=feed, seqs=seqs, owners=owners,
                    decode_rows=len(rows) - len(prompts), prefill_tokens=prefill, positions_max=top,
                    launchable=True), admitted


def _fed_indices(prev: StepPlan) -> list[tuple[int, Sequence]]:
    """(feed index, sequence) of prev's rows that the next launch may feed: its one-token rows' tokens
    come first in the decode graphs' buffer, then its prompt rows' (DecodeGraphs.follow); a chunk
    before a prompt's last has no token to feed (the prompt goes on as a prompt row)."""
    out, one, first = [], 0, prev.decode_rows
    for r, seq in zip(prev.rows, prev.seqs):
        if not r.prompt:
            out.append((one, seq))
            one += 1
            continue
        if r.start_pos + len(r.token_ids) == len(seq.prompt_ids):
            out.append((first, seq))
        first += 1
    return out


def _plain_head(b) -> bool:
    """The first waiting request may join a launched step: plain greedy, one choice, never preempted."""
    head = b.waiting[0]
    return head.plain and not head.forks and not head.preemptions and not head.output_ids


def _prompt_row(b, seq: Sequence, budget: int, prompts: list) -> int:
    """Schedule seq's next prompt chunk (at most budget tokens); returns its length."""
    start = seq.cached
    end = min(start + budget, len(seq.prompt_ids))
    seq.cached = end
    if b.capacity.caching:
        b.capacity.written(seq, end)
    prompts.append((seq, start, end))
    return end - start
