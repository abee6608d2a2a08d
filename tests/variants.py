"""The attention variants the generic tests run over: the registry's, at the tests' size.

Read from ``nanoattn.config.options.ATTENTION_VARIANTS``, so a new variant is tested with no line
here. The tests' models are smaller than the labs' (2 layers, 16 to 40 tokens, random weights), so
the variants whose values are sized for the labs take values that act at this size: a window
shorter than the input, caps where tanh is far from linear on random scores and logits, latent
ranks below d_model, one value table for two layers.
"""

from nanoattn.config.options import ATTENTION_VARIANTS

AT_TEST_SIZE = {
    "softcap": dict(attn_softcap=1.5, logit_softcap=1.5),
    "window": dict(sliding_window=6),
    "local_global": dict(sliding_window=[6, None]),  # a local layer of window 6, then a global one
    "mla": dict(mla_kv_rank=12, mla_q_rank=20, mla_rope_dim=4),
    "value_embeds": dict(value_embeds=1),  # one table, shared by the first and the last layer
}


def at_test_size(name: str) -> dict:
    """The registry's fields of variant ``name``, with the test-sized values above."""
    return {**ATTENTION_VARIANTS[name], **AT_TEST_SIZE.get(name, {})}


VARIANTS = {name: at_test_size(name) for name in ATTENTION_VARIANTS if name != "plain"}
# Variants defined only for encodings without an attention bias, or only for RoPE: refused otherwise.
NO_BIAS = {"diff"}
ONLY_ROPE = {"mla"}
