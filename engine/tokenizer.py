"""Text <-> token ids for a checkpoint folder (tokenizer.json + tokenizer_config.json), and the
per-request incremental detokenizer that turns a stream of ids into text deltas that never split a
UTF-8 character."""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from pegainfer.engine.token_bound import TokenBound, token_bound

REPLACEMENT = "\ufffd"  # what a byte-level decoder emits for bytes that are not (yet) a whole char


class TokenizerError(ValueError):
    """A checkpoint's tokenizer files are missing or do not name their special tokens."""


class Tokenizer:
    """The checkpoint's tokenizer. Decoding skips special tokens (BOS/EOS), like vLLM's default."""

    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: not found")
        self._tok = HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.bos_id = self._special_id(config, "bos_token", config_path)
        self.eos_id = self._special_id(config, "eos_token", config_path)
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.bound: TokenBound = token_bound(path.read_bytes())  # 0.2 s for 100k added tokens
        # The batch call releases the GIL while it works (encode() holds it: 0.6 s for a 1 MB prompt,
        # during which no other Python thread runs), and the fast variant skips the offsets we never
        # read (1 MB: 0.27 s instead of 0.61 s). Same ids (tests/engine/test_token_bound.py).
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        # token_bytes: a byte-level BPE vocabulary spells bytes; added tokens are their text as is
        self._byte_level = type(self._tok.decoder).__name__ == "ByteLevel"
        self._added = frozenset(self._tok.get_added_tokens_decoder())
        self._bytes: dict[int, bytes] = {}  # token_bytes, per id once (log-prob replies ask for N + 1 a token)

    def _special_id(self, config: dict, key: str, source: Path) -> int:
        token = config.get(key)
        if isinstance(token, dict):  # {"__type": "AddedToken", "content": ...}, as DeepSeek writes it
            token = token.get("content")
        if not isinstance(token, str):
            raise TokenizerError(f"{source}: {key} is not set")
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"{source}: {key} {token!r} is not in tokenizer.json")
        return token_id

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        # BOS is prepended here rather than by tokenizer.json's post-processor, so the result does
        # not depend on whether a checkpoint ships one.
        ids = self._encode_batch([text], add_special_tokens=False)[0].ids
        return [self.bos_id, *ids] if add_bos else ids

    def min_tokens(self, chars: int, add_bos: bool = True) -> int:
        """The fewest ids encode() can return for a text of `chars` characters (engine/token_bound.py)."""
        return self.bound.min_tokens(chars) + (1 if add_bos else 0)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def pieces(self, ids: list[int]) -> list[str]:
        """Each id's vocabulary entry as the tokenizer stores it (transformers' convert_ids_to_tokens:
        byte-level pieces such as "Ġthe", special tokens' own text)."""
        return [self._tok.id_to_token(i) or "" for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes, which may be part of a character (OpenAI's log-prob `bytes`: joined
        in order they give the text's UTF-8, where each token's decoded text would be U+FFFD). A
        byte-level BPE token's string spells its bytes in GPT-2's byte alphabet; any other token (an
        added or special one, another decoder's) is its decoded text's UTF-8."""
        known = self._bytes.get(token_id)
        if known is None:
            known = self._bytes[token_id] = self._spelled(token_id)
        return known

    def _spelled(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id) if self._byte_level else None
        if piece is not None and token_id not in self._added:
            table = _unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return self.decode([token_id]).encode()


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte alphabet, reversed: each of the 256 bytes is spelled by one printable character,
    the printable Latin-1 bytes by themselves and the rest by the characters from U+0100 on, in
    byte order (what the `tokenizers` ByteLevel pre-tokenizer writes into a vocabulary)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelled = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in spelled):
        spelled[b] = chr(256 + n)
    return {ch: b for b, ch in spelled.items()}


@dataclasses.dataclass(slots=True)
class IncrementalDetokenizer:
    """Text deltas for one request's output ids, one push per id, then one flush.

    Like SGLang's DecodeStatus / vLLM's detokenize_incrementally, only a short window of ids is
    re-decoded per push: `prefix_offset` is the first id of the window and always sits on a
    character boundary; `read_offset` counts the window's characters already returned. Text that
    ends in U+FFFD is held back (the next byte may complete the character); everything before that
    tail is stable and goes out at once. Joined deltas equal tokenizer.decode(all ids) exactly, for
    decoders that map each token to bytes independently (byte-level BPE, as DeepSeek's).
    """

    tokenizer: Tokenizer
    ids: list[int] = dataclasses.field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        stable = text.rstrip(REPLACEMENT)
        delta = stable[self.read_offset:]
        if len(stable) == len(text):
            # The window ends on a whole character: the next window starts after it.
            self.prefix_offset, self.read_offset = len(self.ids), 0
        else:
            self.read_offset = max(self.read_offset, len(stable))
        return delta

    def flush(self) -> str:
        """Whatever is still held back (a character the stream never completed decodes to U+FFFD)."""
        text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        delta = text[self.read_offset:]
        self.prefix_offset, self.read_offset = len(self.ids), 0
        return delta
