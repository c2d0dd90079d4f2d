"""The most input characters one token of a tokenizer can stand for, read from its tokenizer.json.

A prompt of C characters then has at least ceil(C / that) tokens, so the daemon can refuse a prompt
that cannot fit the context before it spends time tokenising it. The bound must never be too
small (that would refuse a prompt that fits), so it is derived only for pipelines where every
stage keeps a token's share of the input short:

- the normalizer may expand text but shrinks it by at most a known factor (NFC folds at most 4
  characters into one: a character's canonical decomposition has at most 4; NFKC at most 18);
- the pre-tokenizer drops nothing (ByteLevel turns a character into 1-4 byte symbols, Metaspace
  swaps a space for "▁"; Whitespace, BERT's splitter or a "Removed" split drop text);
- the model turns an unknown character into at most one token per character or byte (BPE without
  fused unknowns; a byte-level BPE whose vocabulary has all 256 byte symbols; byte fallback);
  WordPiece and WordLevel give one [UNK] for a whole word of any length;
- added tokens (matched in the raw text) strip no neighbouring whitespace;
- there is no truncation.

A vocabulary token of k symbols then covers at most k * factor input characters (a byte-level
symbol is one byte, at most one character), and an added token len(content) (times the factor
when it is matched after normalisation). Anything else gives no bound (None, with the reason)."""
from __future__ import annotations

import dataclasses

import orjson

# Longest canonical (NFD) and compatibility (NFKD) decomposition of one character, Unicode 14:
# tests/engine/test_token_bound.py checks them against unicodedata.
NFD_MAX = 4
NFKD_MAX = 18

# Normalizers and how many input characters may become one output character.
_NORMALIZER_FACTOR = {"NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1,
                      "NFC": NFD_MAX, "NFKC": NFKD_MAX}
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts", "Split"})
_BYTE_SYMBOLS = 256


class NoBound(Exception):
    """This tokenizer can make one token out of arbitrarily many characters."""


@dataclasses.dataclass(frozen=True, slots=True)
class TokenBound:
    chars_per_token: int | None  # None: no safe bound for this tokenizer
    reason: str  # why there is none (or what the bound came from)

    def min_tokens(self, chars: int) -> int:
        """The fewest tokens a text of `chars` characters can encode to (0 without a bound)."""
        if self.chars_per_token is None:
            return 0
        return -(-chars // self.chars_per_token)


def token_bound(tokenizer_json: str | bytes) -> TokenBound:
    """The bound for the tokenizer serialised as `tokenizer_json` (a tokenizer.json file's text, or
    HF tokenizers' to_str())."""
    spec = orjson.loads(tokenizer_json)
    try:
        if spec.get("truncation"):
            raise NoBound("the tokenizer truncates its output")
        factor = _normalizer_factor(spec.get("normalizer"))
        byte_level = _pre_tokenizer_byte_level(spec.get("pre_tokenizer")) or _is(spec.get("normalizer"), "ByteLevel")
        longest = _longest_model_token(spec["model"], byte_level) * factor
        for added in spec.get("added_tokens") or []:
            if added.get("lstrip") or added.get("rstrip"):
                raise NoBound(f"added token {added['content']!r} strips neighbouring whitespace")
            length = len(added["content"]) * (factor if added.get("normalized") else 1)
            longest = max(longest, length)
    except NoBound as e:
        return TokenBound(None, str(e))
    return TokenBound(max(1, longest), f"{spec['model']['type']} tokenizer, normalizer factor {factor}")


def _is(node: dict | None, kind: str) -> bool:
    return node is not None and (node.get("type") == kind or any(_is(n, kind) for n in _children(node)))


def _children(node: dict) -> list[dict]:
    return node.get("normalizers") or node.get("pretokenizers") or []


def _normalizer_factor(node: dict | None) -> int:
    if node is None:
        return 1
    kind = node.get("type")
    if kind == "Sequence":
        factor = 1
        for child in node.get("normalizers") or []:
            factor *= _normalizer_factor(child)  # a chain: each stage may shrink what the last gave it
        return factor
    if kind == "Replace":
        pattern, content = node.get("pattern") or {}, node.get("content") or ""
        if "String" not in pattern or not content:
            raise NoBound(f"the Replace normalizer ({pattern}) may delete or fold text")
        return max(1, -(-len(pattern["String"]) // len(content)))
    if kind not in _NORMALIZER_FACTOR:
        raise NoBound(f"the {kind} normalizer may delete characters")
    return _NORMALIZER_FACTOR[kind]


def _pre_tokenizer_byte_level(node: dict | None) -> bool:
    """Whether the pre-tokenizer maps text to byte symbols; raises NoBound when it drops text."""
    if node is None:
        return False
    kind = node.get("type")
    if kind == "Sequence":
        return any([_pre_tokenizer_byte_level(child) for child in node.get("pretokenizers") or []])
    if kind not in _KEEPING_PRE_TOKENIZERS or node.get("behavior") == "Removed":
        raise NoBound(f"the {kind} pre-tokenizer may drop characters")
    return kind == "ByteLevel"


def _longest_model_token(model: dict, byte_level: bool) -> int:
    kind, vocab = model.get("type"), model.get("vocab") or {}
    if kind == "BPE":
        if not (model.get("byte_fallback") and _has_byte_tokens(vocab)):
            # An unknown symbol is not spelled out in bytes: it is fused with its unknown neighbours
            # into one token, or silently dropped when there is no unknown token.
            if model.get("unk_token") is not None and model.get("fuse_unk"):
                raise NoBound("BPE fuses a run of unknown characters into one token")
            if model.get("unk_token") is None and not (byte_level and _has_byte_alphabet(vocab)):
                raise NoBound("BPE without an unknown token drops characters missing from its vocabulary")
        pieces = list(vocab)
    elif kind == "Unigram":
        if not model.get("byte_fallback"):
            raise NoBound("Unigram fuses a run of unknown characters into one token")
        pieces = [piece for piece, _score in vocab]
        if not _has_byte_tokens(set(pieces)):
            raise NoBound("Unigram falls back to bytes it does not have, and fuses unknown characters")
    else:
        raise NoBound(f"a {kind} model gives one token for a whole word of any length")
    if not pieces:
        raise NoBound("the model has an empty vocabulary")
    return max(map(len, pieces))


def _has_byte_alphabet(vocab: dict) -> bool:
    from tokenizers.pre_tokenizers import ByteLevel  # the 256 symbols byte-level BPE spells bytes with
    return all(symbol in vocab for symbol in ByteLevel.alphabet())


def _has_byte_tokens(vocab) -> bool:
    """SentencePiece-style byte fallback: <0x00> ... <0xFF>, one token per byte."""
    return all(f"<0x{b:02X}>" in vocab for b in range(_BYTE_SYMBOLS))
