"""What the token sink does not carry about a request's output: for each token its choice index,
log-probs and (on a choice's last token) the choice's finish reason, and the prompt's log-probs.

The bridge records the engine's Token and PromptLogprobs events here, on the loop, just before it
hands the same tokens to the scheduler; the completion handler, woken by its sink, takes everything
recorded so far. Both sides run on the asyncio loop, so this needs no lock. Only requests whose
handler opened an entry are recorded, and the handler closes it when its response ends.
"""
from __future__ import annotations

import dataclasses

from engine.contract import PromptLogprobs, Token, TopLogprobs


@dataclasses.dataclass(slots=True)
class _Entry:
    tokens: list[Token] = dataclasses.field(default_factory=list)
    prompt: list[tuple[float, TopLogprobs] | None] | None = None


class TokenDetails:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    # ---- the bridge ------------------------------------------------------------------------------
    def add_token(self, token: Token) -> None:
        entry = self._entries.get(token.request_id)
        if entry is not None:
            entry.tokens.append(token)

    def add_prompt(self, event: PromptLogprobs) -> None:
        """One chunk's prompt log-probs (a prompt fed in chunks sends one event per chunk, in order)."""
        entry = self._entries.get(event.request_id)
        if entry is not None:
            prompt = entry.prompt if entry.prompt is not None else []
            del prompt[event.start:]
            prompt.extend(event.entries)
            entry.prompt = prompt

    # ---- the completion handler ------------------------------------------------------------------
    def open(self, request_id: str) -> None:
        self._entries[request_id] = _Entry()

    def close(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def take(self, request_id: str) -> list[Token]:
        """The tokens recorded since the last take, in the order the engine produced them."""
        entry = self._entries.get(request_id)
        if entry is None:
            return []
        tokens, entry.tokens = entry.tokens, []
        return tokens

    def prompt(self, request_id: str) -> list[tuple[float, TopLogprobs] | None] | None:
        entry = self._entries.get(request_id)
        return entry.prompt if entry is not None else None

    def __len__(self) -> int:
        return len(self._entries)
