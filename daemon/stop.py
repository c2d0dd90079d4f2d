"""Stop strings in one choice's growing text: the text is released as it arrives, except a tail that
could still turn into a stop string; when a stop string appears (whichever tokens its characters
came from) everything before it is released and the rest, the stop string included, never is (with
`include`, vLLM's include_stop_str_in_output: the stop string is released too, and what follows it
never is)."""
from __future__ import annotations


class StopText:
    __slots__ = ("held", "include", "stopped", "stops")

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.held = ""  # text not released yet: a suffix that is a prefix of some stop string
        self.stopped = False

    def push(self, delta: str) -> str:
        """Take new text; return what may be released now. Sets `stopped` once a stop string is found."""
        if self.stopped:
            return ""
        if not self.stops:  # nothing to watch for (the common case): all of it goes out
            return delta
        text = self.held + delta
        hits = [(i, i + len(s)) for s, i in ((s, text.find(s)) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            start, end = min(hits)  # the first to start (of those, the shortest)
            return text[:end if self.include else start]
        keep = self._prefix_tail(text)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The text ended without a stop string: release the held tail."""
        held, self.held = self.held, ""
        return held

    def _prefix_tail(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
