"""benchkit.workload.closed_loop: the wall-clock window it reports is the duration's own interval (first
send to last completion), not the client's set-up and teardown around it (issue 29: the device-busy
share is taken over that window), and each record knows when it was sent from the level's start."""
from __future__ import annotations

import asyncio
import time

from tools.benchkit.metrics import RequestRecord
from tools.benchkit.workload import PromptSpec, closed_loop


def test_the_window_is_first_send_to_last_completion_and_records_carry_their_send_offset():
    prompts = [PromptSpec(i, 1, "x") for i in range(6)]

    async def one(p: PromptSpec) -> RequestRecord:
        rec = RequestRecord(index=p.index, start=time.perf_counter())
        await asyncio.sleep(0.02)
        rec.chunk_times = [0.02]
        return rec

    async def level():
        await asyncio.sleep(0.2)  # set-up before the level: not in its window
        window: list[int] = []
        got = await closed_loop(prompts, 2, one, window=window)
        await asyncio.sleep(0.2)  # teardown after it: not in its window either
        return got, window

    before = time.time_ns()
    (records, duration), window = asyncio.run(level())
    after = time.time_ns()
    assert len(window) == 2 and window[1] - window[0] == round(duration * 1e9)
    assert window[0] - before >= 0.19e9 and after - window[1] >= 0.19e9  # set-up and teardown left out
    assert duration >= 0.05  # three rounds of at least 20 ms
    sent = sorted(r.to_dict()["sent_ms"] for r in records)
    assert sent[0] >= 0 and sent[-1] >= 35 and sent[-1] <= duration * 1e3  # the third round waited for two
    assert asyncio.run(closed_loop(prompts[:1], 1, one))[0][0].sent_s is not None  # no window asked: fine
