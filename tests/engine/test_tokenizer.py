from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pegainfer.engine.checkpoint_writer import BOS_TOKEN, EOS_TOKEN, build_tokenizer, special_ids, tokenizer_config
from pegainfer.engine.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

SAMPLES = [
    "Hello, world! def f(x): return x ** 2",
    "山谷尽头的小港，从来都不大。",
    "谷の終わりの小さな港 カタカナ ひらがな",
    "안녕하세요, 만나서 반갑습니다.",
    "Zażółć gęślą jaźń — Príliš žluťoučký kůň, ça coûte déjà 5 €",
    "emoji 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 😮‍💨 🫠 and a tab\tand\nnewlines\r\n",
    "",
]
MULTIBYTE_TEXT = st.text(alphabet=st.sampled_from(list("谷港の港小さな안녕하세요éüß€😀👍🏽🇰🇷\u200d\ufffd a")), max_size=40)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def multibyte_ids(tok: Tokenizer) -> list[int]:
    """Trained tokens whose bytes are not plain ASCII: partial and whole CJK/emoji characters."""
    return [i for i in range(tok.bos_id) if any(ord(c) > 127 for c in tok.decode([i]))]


def test_special_ids_match_the_config(tok: Tokenizer, tiny_model_dir: Path):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert (tok.bos_id, tok.eos_id) == (config["bos_token_id"], config["eos_token_id"]) == (1000, 1001)
    assert tok.vocab_size == config["vocab_size"] == 1024


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_decode_round_trip(tok: Tokenizer, text: str):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and tok.encode(text, add_bos=False) == ids[1:]
    assert tok.decode(ids) == text


def test_byte_level_bpe_learned_multibyte_merges(tok: Tokenizer, multibyte_ids: list[int]):
    whole = [i for i in multibyte_ids if "\ufffd" not in tok.decode([i])]
    assert any(len(tok.decode([i])) >= 2 and ord(tok.decode([i])[0]) > 0x3000 for i in whole)  # CJK pairs
    assert len(tok.encode("山谷尽头的小港", add_bos=False)) < len("山谷尽头的小港".encode())


@pytest.mark.parametrize("text", SAMPLES)
def test_token_bytes_join_to_the_texts_utf8(tok: Tokenizer, text: str):
    """Each token's own bytes (OpenAI's log-prob `bytes`): joined, the text's UTF-8, although many of
    these tokens hold part of a character and decode alone to U+FFFD; special tokens hold none."""
    ids = tok.encode(text, add_bos=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert tok.token_bytes(tok.bos_id) == tok.token_bytes(tok.eos_id) == b""


def test_decode_skips_special_tokens(tok: Tokenizer):
    ids = tok.encode("hi")
    assert tok.decode([*ids, tok.eos_id, tok.bos_id]) == "hi"


def test_every_id_has_a_token(tok: Tokenizer):
    assert all(tok._tok.id_to_token(i) is not None for i in range(tok.vocab_size))
    assert tok.decode([1002, 1023]) == "<|reserved_1002|><|reserved_1023|>"


def test_missing_tokenizer_files_are_reported(tmp_path: Path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer(tmp_path)


def test_lite_vocabulary_fill_loads_quickly(tmp_path: Path):
    bos, eos = special_ids("lite", 102400)
    assert (bos, eos) == (100000, 100001)  # DeepSeek's ids, as in the published config.json
    build_tokenizer(102400, bos, eos).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    t0 = time.perf_counter()
    tok = Tokenizer(tmp_path)
    load_s = time.perf_counter() - t0
    assert load_s < 5.0, f"tokenizer with 102400 ids took {load_s:.2f} s to load"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (102400, 100000, 100001)
    assert tok._tok.id_to_token(bos) == BOS_TOKEN and tok._tok.id_to_token(eos) == EOS_TOKEN
    assert all(tok._tok.id_to_token(i) is not None for i in range(102400))
    assert tok.decode([99999, 100002, 102399]) == "<|reserved_99999|><|reserved_100002|><|reserved_102399|>"


# ---- incremental detokenization ------------------------------------------------------------------
def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_split_character_is_held_until_complete(tok: Tokenizer):
    e_acute = [tok._tok.token_to_id(t) for t in ("Ã", "©")]  # byte-level tokens for 0xC3, 0xA9
    assert stream(tok, e_acute) == ["", "é", ""]
    assert stream(tok, e_acute[:1]) == ["", "\ufffd"]  # a character never completed: flush gives U+FFFD


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(ids=st.lists(st.integers(0, 1023), max_size=40))
def test_deltas_join_to_decode_for_any_ids(tok: Tokenizer, ids: list[int]):
    assert "".join(stream(tok, ids)) == tok.decode(ids)


@_SETTINGS
@given(data=st.data())
def test_deltas_join_to_decode_for_multibyte_heavy_ids(tok: Tokenizer, multibyte_ids: list[int], data):
    pool = st.one_of(st.sampled_from(multibyte_ids), st.sampled_from([tok.bos_id, tok.eos_id, 32, 1010]))
    ids = data.draw(st.lists(pool, max_size=40))
    assert "".join(stream(tok, ids)) == tok.decode(ids)


@_SETTINGS
@given(text=MULTIBYTE_TEXT)
def test_valid_text_never_streams_half_a_character(tok: Tokenizer, text: str):
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    assert "".join(deltas) == text
    assert text.count("\ufffd") == sum(d.count("\ufffd") for d in deltas)
