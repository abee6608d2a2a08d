"""Talking-heads attention (``nanoattn/mechanisms/talking_heads.py``): its start as plain attention,
its statistic and its refusal beside differential attention. Its paper's equations written out in
float64 and x-transformers' ``Attend`` with talking heads are its checks in nanoattn/references (the
reference table); cached decoding, chunked against explicit scores, head analysis and learning run
over the attention lab's rows in the generic tests (tests/variants.py, tests/mechanisms)."""


import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.eval.variant_heads import own_statistic, variant_statistics


def test_it_starts_as_plain_attention():
    """P_l = P_w = I at the start: the same weights give plain attention's outputs."""
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    torch.manual_seed(0)
    talking = GPT(ModelConfig(**fields, talking_heads=True)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    missing, unexpected = plain.load_state_dict(talking.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == [f"blocks.{i}.attn.talking_heads.{mix}" for i in range(2)
                                                  for mix in ("logits_mix", "weights_mix")]
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(talking(idx), plain(idx), atol=1e-5, rtol=1e-5)


def test_its_statistic_is_the_share_of_each_mix_off_its_own_head():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, d_model=32, n_layer=2, n_head=4, max_seq_len=16,
                            talking_heads=True)).eval()
    with torch.no_grad():
        model.blocks[0].attn.talking_heads.logits_mix.copy_(torch.full((4, 4), -0.5).fill_diagonal_(1.5))
    batches = [(torch.randint(0, 40, (2, 16)), None)]
    stats = variant_statistics(model, batches)["talking_heads"]
    assert stats["logits"][0] == pytest.approx([0.5] * 4)  # 3 * 0.5 of 3 * 0.5 + 1.5 off the diagonal
    assert stats["logits"][1] == stats["weights"][0] == [0.0] * 4
    assert own_statistic(model, batches) == ("share mixed", pytest.approx(0.5 / 4))


def test_it_is_refused_beside_differential_attention_in_one_line():
    with pytest.raises(ValueError, match=r"^model\.talking_heads=True is invalid: cannot be combined with "
                                         r"diff_attn=True: it mixes the scores of all heads[^\n]*$"):
        ModelConfig(d_model=32, n_head=4, diff_attn=True, talking_heads=True)
