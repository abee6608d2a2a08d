"""Every positional encoding and attention layout learns: a tiny model overfits a fixed sequence."""

import pytest
import torch

from nanoattn import GPT, ModelConfig

# A random sequence of 24 tokens from a vocabulary of 32: the uniform loss is ln 32 = 3.47 nats.
# Memorising it needs the model to tell positions apart (NoPE does so through the causal mask).
LOSS_BOUND = 0.5
STEPS = 60


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi", "nope"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_tiny_model_overfits_a_fixed_sequence(pos, n_kv_head):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_ff=64,
                      max_seq_len=32, pos=pos)
    model = GPT(cfg)
    seq = torch.randint(0, 32, (1, 25))
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = model.loss(x, y).item()
    for _ in range(STEPS):
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 3.0
    assert model.loss(x, y).item() < LOSS_BOUND
