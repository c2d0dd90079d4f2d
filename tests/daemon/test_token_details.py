"""TokenDetails joins a chunked prompt's log-prob events (one per prompt chunk, each with where it
starts) into the whole prompt's entries, in order, whatever the chunk sizes."""
from __future__ import annotations

from daemon.token_details import TokenDetails
from engine.contract import PromptLogprobs


def test_chunk_events_join_into_the_prompts_entries():
    whole = [None] + [(-float(i), ((i, -float(i)),)) for i in range(1, 10)]
    for chunk in (1, 3, 4, 9, 10):
        details = TokenDetails()
        details.open("r")
        details.add_prompt(PromptLogprobs("r", whole[:chunk + 1], 0))  # first chunk: None + `chunk` entries
        start = chunk + 1
        while start < len(whole):
            details.add_prompt(PromptLogprobs("r", whole[start:start + chunk], start))
            start += chunk
        assert details.prompt("r") == whole
    details.add_prompt(PromptLogprobs("other", whole, 0))  # a request whose handler is gone: ignored
    assert details.prompt("other") is None
