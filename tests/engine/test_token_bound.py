"""engine/token_bound.py: the character bound never claims more tokens than the tokenizer makes
(adversarial texts: one character repeated, CJK, emoji, combining marks, random bytes, the longest
tokens repeated), it is tight where it can be, and tokenizers that can fold a whole run of text
into one token get no bound at all."""
from __future__ import annotations

import random
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers

from pegainfer.engine.checkpoint_writer import CORPUS
from pegainfer.engine.token_bound import NFD_MAX, NFKD_MAX, token_bound
from pegainfer.engine.tokenizer import Tokenizer

BYTES = [f"<0x{b:02X}>" for b in range(256)]


def adversarial(hf: HFTokenizer) -> list[str]:
    rng = random.Random(32)
    vocab = hf.get_vocab(with_added_tokens=False)
    longest = sorted(vocab, key=len)[-5:]
    added = [t.content for t in hf.get_added_tokens_decoder().values()]
    texts = [c * n for c, n in [("a", 20000), (" ", 20000), ("\n", 5000), ("\t", 3000), ("é", 4000), ("谷", 4000),
                                ("😀", 3000), ("👨‍👩‍👧‍👦", 500), ("e\u0301", 3000), ("\u0000", 2000),
                                ("\ufffd", 2000), ("ﷺ", 500), ("\u1100\u1161\u11a8", 1000), ("ab", 8000)]]
    texts += ["山谷尽头的小港，从来都不大。" * 300, "🇯🇵🏳️‍🌈😮‍💨🫠" * 300]
    texts += ["".join(longest) * 300, "".join(added) * 40, "".join(added[:2]) * 500]
    texts += [rng.randbytes(20000).decode("utf-8", "replace"), rng.randbytes(20000).decode("latin-1")]
    texts += ["".join(chr(rng.choice([rng.randrange(0x20, 0xD800), rng.randrange(0xE000, 0x110000)]))
                      for _ in range(5000)) for _ in range(3)]
    return texts


def tokens(hf: HFTokenizer, text: str) -> int:
    return len(hf.encode(text, add_special_tokens=False).ids)


def assert_never_above(hf: HFTokenizer, texts: list[str]) -> None:
    bound = token_bound(hf.to_str())
    assert bound.chars_per_token is not None, bound.reason
    for text in texts:
        assert bound.min_tokens(len(text)) <= tokens(hf, text), (text[:40], bound)


def _trained_bpe(normalizer=None, pre_tokenizer=None, byte_fallback=False, unk=None, fuse_unk=False,
                 specials=()) -> HFTokenizer:
    tok = HFTokenizer(models.BPE(unk_token=unk, fuse_unk=fuse_unk, byte_fallback=byte_fallback))
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[*specials, *(BYTES if byte_fallback else [])],
                                  show_progress=False)
    tok.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(keepends=True), trainer)
    return tok


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer(tiny_model_dir)


def test_decomposition_constants_match_unicodedata():
    points = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]
    assert max(len(unicodedata.normalize("NFD", c)) for c in points) == NFD_MAX
    assert max(len(unicodedata.normalize("NFKD", c)) for c in points) == NFKD_MAX


def test_tiny_byte_level_bound_is_its_longest_token(tiny: Tokenizer):
    hf = tiny._tok
    longest_piece = max(map(len, hf.get_vocab(with_added_tokens=False)))
    longest_added = max(len(t.content) for t in hf.get_added_tokens_decoder().values())
    assert tiny.bound.chars_per_token == max(longest_piece, longest_added) == 21  # "<｜begin▁of▁sentence｜>"
    assert_never_above(hf, adversarial(hf))


def test_the_bound_is_tight_on_the_longest_token(tiny: Tokenizer):
    text = "<｜begin▁of▁sentence｜>" * 1000
    assert tiny.min_tokens(len(text)) == len(tiny.encode(text)) == 1001  # with BOS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300) | st.text(alphabet=st.sampled_from(list("谷é😀\u0301 a\n<|>_")), max_size=600))
def test_tokenizer_min_tokens_never_exceeds_encode(tiny: Tokenizer, text: str):
    assert tiny.min_tokens(len(text)) <= len(tiny.encode(text))


def test_encode_gives_the_ids_of_hf_encode(tiny: Tokenizer):
    for text in adversarial(tiny._tok)[::3] + ["", "Hello, world!", "<|reserved_1002|> x"]:
        assert tiny.encode(text) == [tiny.bos_id, *tiny._tok.encode(text, add_special_tokens=False).ids]


def test_metaspace_byte_fallback_with_nfc_gets_a_scaled_bound():
    """A Llama-style SentencePiece BPE (Metaspace, byte fallback, fused unknowns) behind NFC: NFC may
    fold up to NFD_MAX characters into one, and the bound allows for it."""
    hf = _trained_bpe(normalizers.Sequence([normalizers.NFC(), normalizers.Replace(" ", "▁")]),
                      pre_tokenizers.Metaspace(), byte_fallback=True, unk="<unk>", fuse_unk=True, specials=["<unk>"])
    bound = token_bound(hf.to_str())
    assert bound.chars_per_token == NFD_MAX * max(map(len, hf.get_vocab(with_added_tokens=False)))
    assert_never_above(hf, adversarial(hf) + ["\u1100\u1161\u11a8" * 2000, "e\u0301\u0323" * 2000])


@pytest.mark.parametrize("make, reason", [
    (lambda: _trained_bpe(pre_tokenizer=pre_tokenizers.Whitespace(), unk="<unk>", specials=["<unk>"]),
     "Whitespace pre-tokenizer may drop"),
    (lambda: _trained_bpe(normalizers.Strip(), pre_tokenizers.ByteLevel()), "Strip normalizer"),
    (lambda: _trained_bpe(normalizers.StripAccents(), pre_tokenizers.ByteLevel()), "StripAccents normalizer"),
    (lambda: _trained_bpe(normalizers.Replace(" ", ""), pre_tokenizers.ByteLevel()), "Replace normalizer"),
    (lambda: _trained_bpe(pre_tokenizer=pre_tokenizers.Metaspace(), unk="<unk>", fuse_unk=True, specials=["<unk>"]),
     "fuses a run of unknown"),
    (lambda: _trained_bpe(pre_tokenizer=pre_tokenizers.Metaspace()), "drops characters"),
    (lambda: HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")), "whole word"),
    (lambda: HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")), "whole word"),
    (lambda: HFTokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)), "Unigram fuses"),
])
def test_tokenizers_that_fold_runs_of_text_get_no_bound(make, reason):
    bound = token_bound(make().to_str())
    assert bound.chars_per_token is None and reason in bound.reason
    assert bound.min_tokens(10**6) == 0


def test_whitespace_dropping_really_folds_text():
    """Why the rules above exist: each of these makes one token (or none) of a long run."""
    ws = _trained_bpe(pre_tokenizer=pre_tokenizers.Whitespace(), unk="<unk>", specials=["<unk>"])
    assert tokens(ws, " " * 10000) == 0
    fused = _trained_bpe(pre_tokenizer=pre_tokenizers.Metaspace(), unk="<unk>", fuse_unk=True, specials=["<unk>"])
    assert tokens(fused, "\u2603" * 10000) <= 2


def test_added_tokens_that_strip_whitespace_or_truncation_give_no_bound(tiny: Tokenizer):
    hf = HFTokenizer.from_str(tiny._tok.to_str())
    hf.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    assert token_bound(hf.to_str()).chars_per_token is None
    assert tokens(hf, " " * 5000 + "<mask>") == 1  # the token swallowed 5000 spaces
    hf = HFTokenizer.from_str(tiny._tok.to_str())
    hf.enable_truncation(64)
    assert "truncates" in token_bound(hf.to_str()).reason
