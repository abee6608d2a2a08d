"""GPT.loss: the chunked evaluation path equals the full logits' cross-entropy; ignored targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nanoattn.model.gpt as gpt_module
from nanoattn import GPT, ModelConfig
from nanoattn.model import IGNORE_INDEX

VOCAB = 50


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64)).eval()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_loss_equals_cross_entropy_of_the_full_logits(monkeypatch, reduction):
    model = tiny()
    idx, targets = torch.randint(0, VOCAB, (3, 20)), torch.randint(0, VOCAB, (3, 20))
    with torch.no_grad():
        logits = model(idx)  # [3, 20, V]
    reference = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), reduction=reduction)
    if reduction == "none":
        reference = reference.view(3, 20)

    heads = []
    model.lm_head.register_forward_hook(lambda module, args, out: heads.append(out.shape[0]))
    monkeypatch.setattr(gpt_module, "LOSS_CHUNK_ELEMENTS", 7 * VOCAB)  # 7 rows a chunk: 60 = 8 x 7 + 4
    with torch.no_grad():
        chunked = model.loss(idx, targets, reduction=reduction)
    assert heads == [7] * 8 + [4]
    torch.testing.assert_close(chunked, reference, atol=1e-5, rtol=1e-5)

    heads.clear()
    with_grad = model.loss(idx, targets, reduction=reduction)  # autograd: one block of all 60 rows
    assert heads == [60]
    torch.testing.assert_close(with_grad.detach(), reference, atol=1e-5, rtol=1e-5)


def test_loss_gradient_equals_the_plain_cross_entropy_gradient():
    model = tiny()
    idx, targets = torch.randint(0, VOCAB, (2, 16)), torch.randint(0, VOCAB, (2, 16))
    model.loss(idx, targets).backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    F.cross_entropy(model(idx).view(-1, VOCAB), targets.view(-1)).backward()
    for mine, theirs in zip(ours, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


def test_ignored_targets_add_no_loss_and_no_gradient_and_leave_the_mean_of_the_rest():
    model = tiny()
    idx, targets = torch.randint(0, VOCAB, (2, 16)), torch.randint(0, VOCAB, (2, 16))
    kept = torch.zeros(2, 16, dtype=torch.bool)
    kept[0, -3:], kept[1, 5] = True, True  # 4 scored targets out of 32
    masked = targets.masked_fill(~kept, IGNORE_INDEX)

    per_token = model.loss(idx, masked, reduction="none")
    assert torch.all(per_token[~kept] == 0)
    full = model.loss(idx, targets, reduction="none")
    torch.testing.assert_close(per_token[kept], full[kept])
    torch.testing.assert_close(model.loss(idx, masked, reduction="sum"), full[kept].sum())

    model.loss(idx, masked).backward()  # the mean over the 4 scored targets, not over all 32
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    F.cross_entropy(model(idx)[kept], targets[kept]).backward()
    for mine, theirs in zip(ours, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)
    everything_ignored = torch.full_like(targets, IGNORE_INDEX)
    assert model.loss(idx, everything_ignored).item() == 0.0


def test_unknown_reduction_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"reduction='avg' is invalid: allowed: mean \| sum \| none"):
        tiny().loss(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), reduction="avg")
