"""Tokenizers: byte-level BPE, characters or raw bytes, each an HF ``tokenizers.Tokenizer``.

Every kind is saved as one ``tokenizer.json`` that ``tokenizers.Tokenizer.from_file`` loads, so a
checkpoint carries its tokenizer and needs no nanoattn code to decode. Each has the special token
``<|endoftext|>`` (EOT), which the prepare step appends after every document; ``decode`` skips it by
default, like any special token.

- ``bpe``: GPT-2-style byte-level BPE (ByteLevel pre-tokenizer, no prefix space), trained on the
  training split only. The 256 byte symbols are always in the vocabulary, so any text encodes and
  ``decode(encode(text)) == text``. A ``vocab_size`` that training cannot reach (it runs out of
  pairs to merge) is an error, not a silently smaller vocabulary.
- ``char``: one token per Unicode code point of the training split; EOT is id 0, the unknown token
  id 1, then the characters in code-point order. The unknown token is U+FFFD, the Unicode
  replacement character: a character never seen in training encodes to it and decodes as "\\ufffd",
  one character for one, so text length and alignment survive. Known characters round-trip.
- ``byte``: ids 0..255 are the UTF-8 bytes themselves, EOT is 256; nothing to train.
- ``file``: a saved tokenizer (``data.tokenizer.path``, the ``tokenizers`` JSON format, a pretrained
  one from the hub included) holding ``<|endoftext|>``; nothing to train.

``bpe`` and ``char`` learn from the first ``sample_chars`` characters of the training split
(``sample_texts``), so a streamed corpus of any size trains its tokenizer in bounded memory.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from nanoattn.config import TokenizerConfig
from nanoattn.data.errors import DataError

EOT = "<|endoftext|>"
UNK_CHAR = "\ufffd"


def build_tokenizer(cfg: TokenizerConfig, train_texts: Iterable[str]) -> Tokenizer:
    """A tokenizer of kind ``cfg.type``, fitted to the training texts where the kind learns (the
    others never read them)."""
    return _BUILDERS[cfg.type](cfg, train_texts)


def sample_texts(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    """The texts in order until ``max_chars`` characters, the last one cut to fit."""
    left = max_chars
    for text in texts:
        yield text[:left]
        left -= len(text)
        if left <= 0:
            return


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A saved tokenizer: a ``tokenizer.json`` file, or a folder holding one (prepared data, checkpoint)."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: no such tokenizer file")
    return Tokenizer.from_file(str(file))


def eot_id(tokenizer: Tokenizer) -> int:
    found = tokenizer.token_to_id(EOT)
    if found is None:
        raise DataError(f"the tokenizer has no {EOT} token")
    return found


def digit_ids(tokenizer: Tokenizer) -> list[int]:
    """The token ids of '0' .. '9' (what ``model.abacus`` counts): each digit must be one token that
    decodes back to it, as in the byte and byte-level BPE tokenizers; a DataError otherwise."""
    ids = []
    for digit in "0123456789":
        encoded = tokenizer.encode(digit).ids
        if len(encoded) != 1 or tokenizer.decode(encoded) != digit:
            raise DataError(f"model.abacus needs every digit as one token; the tokenizer makes {digit!r} "
                            f"into {encoded} (a byte tokenizer has them all: data=shakespeare_byte)")
        ids.append(encoded[0])
    return ids


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id: uint16 up to 65,536 tokens, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _bpe(cfg: TokenizerConfig, train_texts: Iterable[str]) -> Tokenizer:
    train_texts = list(train_texts)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Progress only on a terminal: piped, tokenizers' bar degrades into blank lines on stdout.
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=[EOT],
                                  show_progress=sys.stdout.isatty(),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(train_texts, trainer, length=len(train_texts))
    reached = tokenizer.get_vocab_size()
    if reached < cfg.vocab_size:
        raise DataError(f"data.tokenizer.vocab_size={cfg.vocab_size} is more than the training text supports "
                        f"(BPE ran out of merges at {reached}); lower it or add text")
    return tokenizer


def _char(cfg: TokenizerConfig, train_texts: Iterable[str]) -> Tokenizer:
    chars: set[str] = set()
    for text in train_texts:
        chars.update(text)
    vocab = {EOT: 0, UNK_CHAR: 1}
    for ch in sorted(chars - {UNK_CHAR}):
        vocab[ch] = len(vocab)
    # BPE without merges and without a pre-tokenizer maps each code point to its id, or to UNK_CHAR.
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_CHAR))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(EOT, special=True)])
    return tokenizer


def _byte(cfg: TokenizerConfig, train_texts: Iterable[str]) -> Tokenizer:
    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}
    vocab[EOT] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOT, special=True)])
    return tokenizer


def _byte_symbols() -> list[str]:
    """The character the ByteLevel pre-tokenizer uses for each byte 0..255, in byte order.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, soft hyphen...)
    take the code points 256, 257, ... in byte order, so every byte has a visible symbol.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def _file(cfg: TokenizerConfig, train_texts: Iterable[str]) -> Tokenizer:
    tokenizer = load_tokenizer(Path(cfg.path).expanduser())
    if tokenizer.token_to_id(EOT) is None:
        raise DataError(f"data.tokenizer.path={cfg.path}: the tokenizer has no {EOT} token, which "
                        "separates documents; add it as a special token, or use type=bpe|char|byte")
    return tokenizer


_BUILDERS: dict[str, Callable[[TokenizerConfig, Iterable[str]], Tokenizer]] = {
    "bpe": _bpe, "char": _char, "byte": _byte, "file": _file,
}
