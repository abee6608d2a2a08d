"""The attention variants the generic tests run over: the registry's, at the tests' size.

Read from ``nanoattn.config.options.ATTENTION_VARIANTS``, so a new variant is tested with no line
here; the values that act at the tests' small size are the reference checks' own
(``nanoattn.references.fixtures.at_test_size``). ``STAGES`` says where each field a variant sets
acts, so that the pair test of cached decoding decodes the pairs acting on a common stage.
"""

from nanoattn.config.options import ATTENTION_VARIANTS
from nanoattn.mechanisms import REGISTRY as MECHANISMS
from nanoattn.references.fixtures import at_test_size

VARIANTS = {name: at_test_size(name) for name in ATTENTION_VARIANTS if name != "plain"}
# Variants defined only for encodings without an attention bias, or only for RoPE: refused otherwise.
NO_BIAS = {"diff"}
ONLY_ROPE = {"mla"}

# Where each ModelConfig field a variant sets acts, for the pair test of cached decoding
# (test_generate.py): the block's input before the projections, the queries, keys and values, the
# scores and what turns them into weights, the heads' outputs before W_O, the state the KV cache
# keeps beside keys and values or how it advances, and the model's output logits.
INPUT, QKV, SCORES, OUTPUT, CACHE, LOGITS = "input", "qkv", "scores", "output", "cache", "logits"
STAGES: dict[str, frozenset[str]] = {
    "attn_softcap": frozenset({SCORES}),
    "logit_softcap": frozenset({LOGITS}),
    "attn_sinks": frozenset({SCORES}),
    "sliding_window": frozenset({SCORES, CACHE}),  # a mask, and a rolling buffer
    "diff_attn": frozenset({QKV, SCORES, OUTPUT}),  # heads paired, two maps subtracted, each pair normed
    "mla_kv_rank": frozenset({QKV, CACHE}),  # keys and values from a latent, which the cache holds
    "mla_q_rank": frozenset({QKV}),
    "mla_rope_dim": frozenset({QKV, CACHE}),
    "n_kv_head": frozenset({QKV, CACHE}),
    "value_embeds": frozenset({QKV}),
    "token_shift": frozenset({INPUT, CACHE}),  # the cache keeps the last embedding
    "kv_shift": frozenset({QKV, CACHE}),  # the cache keeps the newest raw key and value
    "canon": frozenset({INPUT, CACHE}),  # the cache keeps each layer's latest inputs
    "forget_gate": frozenset({SCORES, CACHE}),  # a decay of the scores, log gates in the cache
    "attn_fn": frozenset({SCORES}),
    "selective_attn": frozenset({SCORES, CACHE}),  # F on the scores, its column sums in the cache
    "pos": frozenset(),  # an encoding: every variant is decoded with each of several (test_generate.py)
}
EVERY_STAGE = frozenset({INPUT, QKV, SCORES, OUTPUT, CACHE, LOGITS})
# A registered mechanism's stages follow from the hooks it overrides (``nanoattn.mechanisms.base``): the
# projections act on the queries and keys, the queries and the scores on the scores, the weights on the
# scores' weights, and the heads' outputs on the output with each token's own value in hand.
HOOK_STAGES = {"before_rotation": {QKV}, "after_rotation": {QKV}, "queries": {SCORES}, "scores": {SCORES},
               "weights": {SCORES}, "heads": {OUTPUT, QKV}}


def mechanism_stages() -> dict[str, frozenset[str]]:
    """{field: stages} for every registered mechanism's fields, read from the hooks it overrides."""
    return {field: frozenset().union(*(where for hook, where in HOOK_STAGES.items()
                                       if mechanism.overrides(hook)))
            for mechanism in MECHANISMS.values() for field in mechanism.fields}


def stages(name: str) -> frozenset[str]:
    """Where variant ``name`` acts: its fields' stages. A field not in STAGES acts everywhere, so a
    new variant is paired with every other until its field is placed."""
    known = {**STAGES, **mechanism_stages()}
    return frozenset().union(*(known.get(field, EVERY_STAGE) for field in VARIANTS[name]))


def alternatives(first: str, second: str) -> bool:
    """Whether two variants set one field to different values (window and local_global, the two
    QK-norms, two score functions): two choices of one setting, never a pair."""
    a, b = VARIANTS[first], VARIANTS[second]
    return any(a[field] != b[field] for field in a.keys() & b.keys())
