"""Abacus embeddings (McLeish et al. 2024): each digit's index within its number, written out by hand,
the training offset, exact cached decoding beside every attention-level form the paper combines it
with, and one-line refusals.

References: the paper's definition (index 1, 2, ... from a number's first written digit, reset at every
number, 0 elsewhere; one offset k in [0, max] added to the digits' indices in training) written out
per example, and the model's own full forward pass for cached decoding.
"""

from __future__ import annotations

import pytest
import torch

from nanoattn import GPT, ModelConfig, generate
from nanoattn.generate import Decoding
from nanoattn.hf import export_hf
from nanoattn.model.abacus import digit_indices

DIGITS = list(range(48, 58))  # the byte tokenizer's ids of '0'..'9'
EOT = 256
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}


def ids(text: str) -> torch.Tensor:
    return torch.tensor([[EOT, *text.encode()]])


def test_the_indices_of_123_plus_45_and_its_answer():
    """Each number counts its digits from its first written one; '+', '=' and EOT are 0."""
    row = ids("123+45=861")  # 123 + 45 = 168, its answer written reversed
    assert digit_indices(row, torch.tensor(DIGITS)).tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]]
    # In the paper's format every number is reversed, so one index is one significance in all three:
    # 3 (units), 5 and 8 are 1; 2, 4 and 6 are 2; the hundreds 1 and 1 are 3.
    reversed_row = ids("321+54=861")
    assert digit_indices(reversed_row, torch.tensor(DIGITS)).tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]]


def test_a_cached_chunk_continues_the_run_it_starts_in():
    row, digits = ids("12+3456=9"), torch.tensor(DIGITS)
    whole = digit_indices(row, digits)
    for cut in range(1, row.shape[1]):
        head = digit_indices(row[:, :cut], digits)
        tail = digit_indices(row[:, cut:], digits, previous=head[:, -1])
        assert torch.equal(torch.cat([head, tail], dim=1), whole), cut


def tiny(pos="nope", n_kv_head=2, **fields) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(vocab_size=260, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_ff=64,
                                max_seq_len=16, init_std=0.1, pos=pos, abacus=True, abacus_max_offset=20,
                                abacus_digits=DIGITS), **fields})
    return GPT(cfg).eval()


def test_training_adds_one_offset_to_every_digit_and_evaluation_none():
    model, row = tiny(), ids("12+345=")
    index = digit_indices(row, torch.tensor(DIGITS))
    table = model.abacus.table
    torch.testing.assert_close(model.abacus(row), table(index))  # evaluation: no offset
    model.train()
    offsets = set()
    for seed in range(12):
        torch.manual_seed(seed)
        k = int(torch.randint(0, 21, ()))  # what the forward pass draws: uniform in [0, abacus_max_offset]
        torch.manual_seed(seed)
        torch.testing.assert_close(model.abacus(row), table(torch.where(index > 0, index + k, 0)))
        offsets.add(k)
    assert len(offsets) > 4


def test_the_abacus_adds_to_the_token_embeddings():
    model, row = tiny(), ids("12+345=")
    plain = tiny(abacus=False)
    with torch.no_grad():
        plain.load_state_dict(model.state_dict(), strict=False)
        shifted = model(row)
        assert (shifted - plain(row)).abs().max() > 1e-3
        model.abacus.table.weight.zero_()
        torch.testing.assert_close(model(row), plain(row))


def digit_prompt(batch: int = 2) -> torch.Tensor:
    """Numbers and operators from the addition alphabet, so runs of digits cross the prompt's end."""
    alphabet = torch.tensor([*DIGITS, ord("+"), ord("=")])
    return alphabet[torch.randint(0, 12, (batch, 6), generator=torch.Generator().manual_seed(1))]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pos", ["nope", "fire", "rope"])
def test_cached_decoding_equals_recomputation(pos, layout):
    """Abacus alone, Abacus+FIRE and Abacus+RoPE decode exactly with the cache, past max_seq_len
    where the attention-level encoding is defined, the index continuing the cached run."""
    model, idx = tiny(pos, LAYOUTS[layout]), digit_prompt()
    vocab_limit = 58  # decode digits and punctuation only, so digit runs keep growing
    decoding = Decoding(model, idx, 20, temperature=0, repetition_penalty=3.0, vocab_limit=vocab_limit)
    steps = [decoding.last_logits for _ in decoding]
    with torch.no_grad():
        full = model(decoding.idx)
    for step, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, 5 + step], atol=1e-5, rtol=1e-5)
    assert torch.equal(decoding.idx, generate(model, idx, 20, temperature=0, repetition_penalty=3.0,
                                              vocab_limit=vocab_limit, use_cache=False))
    assert digit_indices(decoding.idx, torch.tensor(DIGITS)).max() >= 2  # runs crossed steps


def test_attention_maps_path_equals_the_fast_path():
    model, row = tiny("fire"), ids("12+345=54")
    with torch.no_grad():
        logits, weights = model.attention_maps(row)
        torch.testing.assert_close(logits, model(row), atol=1e-5, rtol=1e-5)
    assert len(weights) == 2


def test_refusals_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="^model.abacus_digits=\\[1, 2\\] is invalid: must be null or the 10 "
                                         "distinct token ids of the digits 0-9, each below vocab_size=260$"):
        tiny(abacus_digits=[1, 2])
    with pytest.raises(ValueError, match="^model.abacus_max_offset=-1 is invalid"):
        tiny(abacus_max_offset=-1)
    with pytest.raises(ValueError, match="^model.abacus_digits=None is invalid for a forward pass: the "
                                         "abacus needs the token ids of the digits 0-9 \\(the trainer"):
        tiny(abacus_digits=None)(ids("1+2="))
    long_number = ids("1" * 40)  # 40 digits: past the table's 16 + 20 + 1 rows
    with pytest.raises(ValueError, match="^abacus index 40 is past the abacus table of 37 rows \\(model\\."):
        tiny("rope")(long_number)
    with pytest.raises(ValueError, match="^model.abacus=True has no counterpart in transformers' Llama"):
        export_hf(tiny("rope", abacus_max_offset=0), tmp_path / "hf")
