"""The built-in tokenizer: exact round trips, English ratio, canonical output tokens."""
from __future__ import annotations

import random

import pytest

from blis_sim.emulator.tokenizer import VOCAB_SIZE, Tokenizer

PROSE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
    "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season "
    "of Light, it was the season of Darkness, it was the spring of hope, it was the winter of "
    "despair. The scheduler admits waiting requests in arrival order while the token budget lasts; "
    "cached blocks are reused when a new request shares the prefix of an earlier one, and evicted "
    "in least-recently-used order when memory runs short."
)


@pytest.mark.parametrize("text", [
    PROSE, "", " ", "  leading and trailing  ", "CamelCase HTTPServer x86_64 3.14 \t\n tabs",
    "naïve café — ünïcode ✓ 日本語", "<|user|>\nhello\n<|assistant|>\n", "a" * 100,
])
def test_decode_inverts_encode(text: str) -> None:
    tok = Tokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert tok.decode(ids) == text


def test_english_prose_is_about_one_and_a_half_tokens_per_word() -> None:
    ratio = len(Tokenizer().encode(PROSE)) / len(PROSE.split())
    assert 1.3 <= ratio <= 1.7, ratio


def test_word_list_prompts_land_in_range() -> None:
    # The observe side builds prompts from word lists; a typical English list gives the same ratio.
    words = ("the of and to in is you that it he was for on are as with his they at be this have from "
             "or one had by word but not what all were we when your can said there use an each which she "
             "do how their if will up other about out many then them these so some her would make like "
             "him into time has look two more write go see number no way could people my than first water "
             "been call who oil its now find long down day did get come made may part").split()
    rng = random.Random(7)
    text = " ".join(rng.choice(words) for _ in range(2000))
    ratio = len(Tokenizer().encode(text)) / 2000
    assert 1.0 <= ratio <= 1.7, ratio


def test_output_tokens_reencode_to_themselves() -> None:
    tok = Tokenizer()
    ids = [tok.output_token(random.Random(s).getrandbits(31)) for s in range(500)]
    assert tok.encode(tok.decode(ids)) == ids  # so echoed outputs keep a multi-turn prefix


def test_encoding_is_deterministic_across_instances() -> None:
    assert Tokenizer().encode(PROSE) == Tokenizer().encode(PROSE)


def test_add_bos() -> None:
    tok = Tokenizer()
    assert tok.encode("hi", add_bos=True) == [tok.bos_token_id, *tok.encode("hi")]
    assert tok.decode([tok.bos_token_id, *tok.encode("hi")]) == "hi"


def test_fast_split_gives_the_regex_units() -> None:
    """The letters-and-spaces fast path of encode() splits exactly as the regex does."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from blis_sim.emulator.tokenizer import _SPLIT, _split

    @settings(max_examples=500, deadline=None)
    @given(st.text(alphabet="abZ  .é", max_size=40))
    def check(text: str) -> None:
        assert _split(text) == _SPLIT.findall(text)

    check()
    assert _split("  lead  and trail  ") == _SPLIT.findall("  lead  and trail  ")


def test_token_text_is_decode_of_one_token() -> None:
    tok = Tokenizer()
    ids = list(range(0, 400)) + [tok.output_token(s) for s in range(200)] + [tok.vocab_size - 1]
    assert all(tok.token_text(i) == tok.decode([i]) for i in ids)
