"""The attention variants the generic tests run over: the ModelConfig fields that switch each on.

The caps are small so that tanh is far from linear on a random model's scores and logits."""

VARIANTS = {
    "qk_norm_before_rope": dict(qk_norm="before_rope"),
    "qk_norm_after_rope": dict(qk_norm="after_rope"),
    "attn_softcap": dict(attn_softcap=1.5),
    "logit_softcap": dict(logit_softcap=1.5),
    "attn_sinks": dict(attn_sinks=True),
    "sliding_window": dict(sliding_window=[6, None]),  # a local layer of window 6, then a global one
    "diff_attn": dict(diff_attn=True),  # 4 heads and 2 K/V heads: 2 pairs over 1 K/V pair
    "mla": dict(mla_kv_rank=12, mla_q_rank=20, mla_rope_dim=4, n_kv_head=4),  # latent attention is MHA
    "value_embeds": dict(value_embeds=1),  # one table, shared by the first and the last layer
    "token_shift": dict(token_shift=True),
}
# Variants defined only for encodings without an attention bias, or only for RoPE: refused otherwise.
NO_BIAS = {"diff_attn"}
ONLY_ROPE = {"mla"}
