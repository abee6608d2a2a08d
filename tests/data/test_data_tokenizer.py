"""Tokenizers: exact round-trips on held-out text, the documented unknown-character rule, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from nanoattn.config import TokenizerConfig
from nanoattn.data import EOT, DataError, digit_ids, load_tokenizer
from nanoattn.data.tokenizer import UNK_CHAR, build_tokenizer, eot_id, token_dtype


@pytest.fixture
def texts(fake_text):
    """(training texts, held-out text): different documents drawn from the same alphabet."""
    return [fake_text(3000, seed) for seed in range(8)], fake_text(3000, seed=99) + "Thou, 'tis -- 12%!\n"


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
def test_decode_encode_round_trips_held_out_text(tmp_path, texts, kind):
    train, held_out = texts
    if kind == "char":
        known = set("".join(train))
        held_out = "".join(ch for ch in held_out if ch in known)  # only characters it has seen
    tokenizer = build_tokenizer(TokenizerConfig(type=kind, vocab_size=300), train)
    ids = tokenizer.encode(held_out).ids
    assert tokenizer.decode(ids) == held_out
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    reloaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert reloaded.encode(held_out).ids == ids
    assert load_tokenizer(tmp_path).encode(held_out).ids == ids  # a folder holding tokenizer.json works too
    assert reloaded.token_to_id(EOT) == eot_id(tokenizer)
    assert reloaded.decode([*ids, eot_id(tokenizer)]) == held_out  # EOT is special: decode skips it


def test_bpe_learns_the_requested_vocabulary_and_compresses(texts):
    train, held_out = texts
    tokenizer = build_tokenizer(TokenizerConfig(type="bpe", vocab_size=300), train)
    assert tokenizer.get_vocab_size() == 300
    assert len(tokenizer.encode(held_out).ids) < 0.6 * len(held_out.encode())
    unseen = "Ça va? Grüße, 東京 🙂"  # bytes never seen in training still encode and decode exactly
    assert tokenizer.decode(tokenizer.encode(unseen).ids) == unseen


def test_byte_ids_are_the_utf8_bytes():
    tokenizer = build_tokenizer(TokenizerConfig(type="byte"), [])
    text = "naïve 東京 🙂\n\t\x00"
    assert tokenizer.encode(text).ids == list(text.encode())
    assert (tokenizer.get_vocab_size(), eot_id(tokenizer)) == (257, 256)


def test_digit_ids_are_the_digits_own_tokens_or_refused(texts):
    """What model.abacus counts: '0'..'9', one token each (the byte tokenizer's ids are the bytes)."""
    assert digit_ids(build_tokenizer(TokenizerConfig(type="byte"), [])) == list(b"0123456789")
    bpe = build_tokenizer(TokenizerConfig(type="bpe", vocab_size=300), texts[0])
    assert [bpe.decode([i]) for i in digit_ids(bpe)] == list("0123456789")
    with pytest.raises(DataError, match="^model.abacus needs every digit as one token; the tokenizer makes"):
        digit_ids(build_tokenizer(TokenizerConfig(type="char"), ["abc\n"]))


def test_char_maps_unseen_characters_to_the_replacement_character():
    tokenizer = build_tokenizer(TokenizerConfig(type="char"), ["abc cab\n"])
    assert (eot_id(tokenizer), tokenizer.token_to_id(UNK_CHAR), tokenizer.get_vocab_size()) == (0, 1, 7)
    ids = tokenizer.encode("abz\n€a").ids
    assert ids[2] == ids[4] == 1
    assert tokenizer.decode(ids) == "ab\ufffd\n\ufffda"  # one character for one


def test_bpe_vocab_beyond_what_the_corpus_supports_fails_naming_the_value():
    with pytest.raises(DataError, match=r"data.tokenizer.vocab_size=5000 is more than .* ran out of merges"):
        build_tokenizer(TokenizerConfig(type="bpe", vocab_size=5000), ["to be or not to be\n"])


def test_token_dtype_is_uint16_while_every_id_fits():
    assert token_dtype(257) == np.uint16
    assert token_dtype(65_536) == np.uint16  # ids 0..65535
    assert token_dtype(65_537) == np.uint32
    assert token_dtype(200_000) == np.uint32
