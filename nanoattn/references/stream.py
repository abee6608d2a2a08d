"""Reference checks of what acts on the residual stream: value embeddings, token shift, Abacus, canon
layers."""

from __future__ import annotations

import torch

from nanoattn import GPT, ModelConfig
from nanoattn.config.options import encoding_options
from nanoattn.model.gates import Canon
from nanoattn.references.attention import TOKENS
from nanoattn.references.core import acts, difference, randn

# ----------------------------------------------------------------------------- the residual stream


def value_embeds_written_out() -> float:
    """The plain model with a hook rewriting the value slice of each fed layer's QKV projection to
    a v + b E[token]: the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=16,
                  qk_norm="before_rope")
    embedded = GPT(ModelConfig(**fields, value_embeds=1)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(embedded.state_dict(), strict=False)
    with torch.no_grad():
        embedded.blocks[0].attn.value_mix.copy_(torch.tensor([0.7, 1.3]))
        embedded.blocks[3].attn.value_mix.copy_(torch.tensor([-0.4, 2.0]))
        embedded.value_emb[0].weight.normal_()  # rows as large as the values, so the mix shows
    idx = torch.randint(0, 40, (2, 16))

    def mixing(block):
        a, b = block.attn.value_mix.tolist()

        def hook(module, inputs, out):
            q_k, v = out.split([32 + 16, 16], dim=-1)
            return torch.cat([q_k, a * v + b * embedded.value_emb[0](idx)], dim=-1)
        return hook

    with torch.no_grad():
        unhooked = plain(idx)
        for i in (0, 3):
            plain.blocks[i].attn.qkv.register_forward_hook(mixing(embedded.blocks[i]))
        expected = plain(idx)
        acts(expected, unhooked, "the value embeddings")
        return difference(embedded(idx), expected)


def token_shift_written_out() -> float:
    """The plain model with a hook on its token table rewriting each row e_t to e_t + g e_{t-1}
    (e_{-1} = 0): the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, pos="learned")
    shifted = GPT(ModelConfig(**fields, token_shift=True)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(shifted.state_dict(), strict=False)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        shifted.shift_gate.normal_()
        gate = shifted.shift_gate.clone()
        unhooked = plain(idx)
        plain.tok_emb.register_forward_hook(
            lambda module, inputs, e: e + gate * torch.nn.functional.pad(e[:, :-1], (0, 0, 1, 0)))
        expected = plain(idx)
        acts(expected, unhooked, "the token shift")
        return difference(shifted(idx), expected)


DIGITS = list(range(10))  # the digits' token ids; tokens drawn from 0-13, so most runs are several long


def abacus_indices(row: list[int], k: int) -> list[int]:
    """McLeish et al. 2024: each digit's index within its number, 1 at the number's first written digit,
    plus the offset k; 0 for every other token."""
    indices, run = [], 0
    for token in row:
        run = run + 1 if token in DIGITS else 0
        indices.append(run + k if run else 0)
    return indices


def abacus_written_out(name: str) -> float:
    """Option ``name``'s model with its abacus table drawn N(0, 1), and the model of its ``pos`` without
    the abacus (the same weights) with a hook rewriting each token's embedding to E[token] + A[i]: the
    logits at evaluation (k = 0), and in training over 3 forward passes, each row against the k in
    [0, abacus_max_offset] whose logits are nearest (the paper's one offset for every index of a row)."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=24,
                  abacus_max_offset=4, abacus_digits=DIGITS, **encoding_options()[name])
    abacus = GPT(ModelConfig(**fields))
    plain = GPT(ModelConfig(**{**fields, "abacus": False}))
    plain.load_state_dict(abacus.state_dict(), strict=False)
    idx = torch.randint(0, 14, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        abacus.abacus.table.weight.normal_()  # rows far apart, so an index off by one shows
        table = abacus.abacus.table.weight.clone()

    def logits(k: int, training: bool) -> torch.Tensor:
        index = torch.tensor([abacus_indices(row, k) for row in idx.tolist()])
        hook = plain.tok_emb.register_forward_hook(lambda module, inputs, e: e + table[index])
        try:
            return plain.train(training)(idx)
        finally:
            hook.remove()

    with torch.no_grad():
        expected = logits(0, training=False)
        acts(expected, plain.eval()(idx), "the abacus")
        worst, offsets = difference(abacus.eval()(idx), expected), set()
        candidates = [logits(k, training=True) for k in range(fields["abacus_max_offset"] + 1)]
        for seed in range(3):
            torch.manual_seed(seed)
            ours = abacus.train()(idx)
            for b in range(len(idx)):
                nearest, k = min((difference(ours[b], c[b]), k) for k, c in enumerate(candidates))
                worst, offsets = max(worst, nearest), offsets | {k}
        if offsets == {0}:
            raise AssertionError("every offset drawn in training was 0: the check compares no offset")
    return worst


def physicslm4_convolution(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """PhysicsLM4's canon layer (its ShortConvolution without the CUDA kernel) with taps ``weight``
    [d_model, width] on x [B, T, d_model]: a depthwise ``nn.Conv1d`` padded by width - 1 on both
    sides, cut to its first T outputs, plus the input."""
    D, width = weight.shape
    conv = torch.nn.Conv1d(D, D, width, groups=D, padding=width - 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(weight[:, None, :])
        return x + conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)


def canon_physicslm4() -> float:
    """The layer alone, widths 2 and 4, its taps as drawn."""
    worst = 0.0
    for width in (2, 4):
        torch.manual_seed(0)
        canon = Canon(ModelConfig(d_model=16, canon=width), layer=0)
        x = randn(2, TOKENS, 16)
        with torch.no_grad():
            worst = max(worst, difference(canon(x), physicslm4_convolution(canon.weight, x)))
    return worst


def canon_written_out() -> float:
    """The plain model with that convolution hooked onto each attention's input (the block's
    normalised input), taps from the canon model (width 3): the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    canon = GPT(ModelConfig(**fields, canon=3)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(canon.state_dict(), strict=False)
    idx = torch.randint(0, 40, (2, 16))

    def convolved(weight):
        def hook(module, args, kwargs):
            return (physicslm4_convolution(weight, args[0]), *args[1:]), kwargs
        return hook

    with torch.no_grad():
        unhooked = plain(idx)
        for block, ours in zip(plain.blocks, canon.blocks, strict=True):
            block.attn.register_forward_pre_hook(convolved(ours.canon.weight), with_kwargs=True)
        expected = plain(idx)
        acts(expected, unhooked, "the canon layers")
        return difference(canon(idx), expected)


# The layer's shifted sums against conv1d's, width products of values below 3 summed in another
# order: a few 2^-24.
CONVOLUTION = 1e-6

# The same float32 operations on both sides except where the hook computes a v + b e, e + g e' or
# E + A (one product and one sum, possibly fused differently): a few 2^-24 carried through the layers.
HOOKED = 1e-6


