"""The named choices of a run: recipes, encodings and attention variants, one registry each.

Each maps a name to the config fields it sets. Everything that offers the choices reads them
from here: the Hydra groups ``recipe``, ``pos`` and ``attention`` (``scripts/_hydra_cli.py``), the
labs' rows, the bench's rows and the generic tests. So adding one is one line here, and a new
encoding of ``nanoattn.positional.REGISTRY`` is a ``pos`` option with no line at all. A registry
is read when it is asked, never copied at import, so an entry added at run time is an option too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from nanoattn.positional import REGISTRY

Fields = dict[str, Any]

# What a run trains with, as the config sections' fields over the dataclasses' defaults
# (``RunConfig()``, with the ``llama-tiny`` model preset the scripts start from).
RECIPES: dict[str, dict[str, Fields]] = {
    # `make train`: Muon for the blocks' matrices, AdamW for the rest with the token table at 10x the
    # rate and an untied head at 0.3x (modded-nanogpt's practice), token shift, a short schedule, on a
    # compiled step where Inductor's compiler is: in no more time than the eager step's 1,300 took.
    "default": {
        "model": dict(tie_embeddings=False, token_shift=True),
        "train": dict(optimizer="muon", lr=0.01, embedding_lr_scale=10.0, head_lr_scale=0.3,
                      max_steps=1700, warmup_steps=50, compile="auto"),
    },
    # The labs': the default's optimizer and rates without token shift, a position signal of its
    # own (each token sees its predecessor), so a lab measures each encoding alone.
    "labs": {
        "model": dict(tie_embeddings=False),
        "train": dict(optimizer="muon", lr=0.006, embedding_lr_scale=10.0, head_lr_scale=0.3),
    },
    # One GPU node at GPT-2 small's shape (model=gpt2-small or model=llama-124m); not yet run on a GPU.
    # GPT-2's step of about 0.5M tokens (512 sequences of 1,024, as nanoGPT and llm.c train it), held
    # whatever the number of processes; the peak rate llm.c found for AdamW at this size, 1.8e-3, which
    # Muon with its update matched to AdamW's RMS takes over (Liu et al. 2025, "Muon is Scalable");
    # warmup-stable-decay over 10,000 steps (5.2B tokens), the last fifth decaying (Hägele et al. 2024).
    "gpu": {
        "train": dict(optimizer="muon", lr=1.8e-3, batch_size=32, global_batch=512, max_steps=10000,
                      warmup_steps=250, schedule="wsd", compile="auto"),
    },
    # The classic baseline: the dataclasses' defaults (AdamW on every parameter, tied embeddings). It
    # states its optimizer, the key it is named after, so an experiment that sets another is refused with it.
    "adamw_baseline": {"train": dict(optimizer="adamw")},
}

# Encodings in a form with parameters of its own, beside every registry encoding's plain form.
NAMED_ENCODINGS: dict[str, Fields] = {
    "rope_partial": dict(pos="rope", rope_fraction=0.25),  # GPT-NeoX's rotary_pct: a quarter rotates
    "p_rope": dict(pos="rope", rope_p=0.75),  # Barbero et al. 2024: the lowest quarter of frequencies dropped
    # Llama 4's iRoPE: every 4th layer NoPE with its query temperature; floor_scale is the labs'
    # training length, as Llama 4's 8192 is its attention chunk, so it acts past the training length.
    "irope": dict(pos=["rope", "rope", "rope", "nope"], temperature_floor_scale=128,
                  temperature_attn_scale=0.1),
    # McLeish et al. 2024: Abacus embeddings (each digit's index in its number, model.abacus) with no
    # other position, and with FIRE or RoPE in attention, the paper's three forms.
    "abacus": dict(pos="nope", abacus=True),
    "abacus_fire": dict(pos="fire", abacus=True),
    "abacus_rope": dict(pos="rope", abacus=True),
}

# Attention variants, each the ModelConfig fields that switch it on, at the labs' shape (128 tokens).
ATTENTION_VARIANTS: dict[str, Fields] = {
    "plain": {},  # fused QKV and softmax attention: the reference row
    "qk_norm": dict(qk_norm="before_rope"),  # OLMo 2, Qwen 3: RMSNorm of each query and key head
    "qk_norm_after": dict(qk_norm="after_rope"),  # nanochat: the same norm after the rotation
    "softcap": dict(attn_softcap=50.0, logit_softcap=30.0),  # Gemma 2's caps
    "sinks": dict(attn_sinks=True),  # gpt-oss: a learned logit per head that takes mass and no value
    "window": dict(sliding_window=64),  # Mistral: every layer sees its 64 latest tokens
    "local_global": dict(sliding_window=[64, None]),  # Gemma 2: local and global layers alternate
    "diff": dict(diff_attn=True),  # Ye et al. 2024: each head the difference of two softmax maps
    # DeepSeek-V2: a joint key/value latent of rank 32 and one shared 16-dim rotary key, over all heads.
    "mla": dict(mla_kv_rank=32, mla_rope_dim=16, n_kv_head=None),
    "value_embeds": dict(value_embeds=2),  # modded-nanogpt: token tables mixed into the values
    "token_shift": dict(token_shift=True),  # RWKV, modded-nanogpt's smear: a gated copy of the predecessor
    "gate": dict(attn_gate="elementwise"),  # Qiu et al. 2025 (G1), Qwen3-Next: sigmoid gates on the heads
    "ssmax": dict(ssmax=True),  # Nakanishi 2025: logits times a learned s_h log(keys seen)
    "xsa": dict(xsa=True),  # Zhai 2026: each output minus its projection on the token's own value
    "talking_heads": dict(talking_heads=True),  # Shazeer et al. 2020: the heads' logits and weights mixed
    # Allen-Zhu 2025 at placement A only (a width-4 causal depthwise convolution with a residual on each
    # attention's input); the paper's placements B-D, inside attention and around the MLP, are left out.
    "canon": dict(canon=4),
    # FoX (Lin et al. 2025): a data-dependent forget gate decays the scores; NoPE, the paper's setting.
    "fox": dict(forget_gate=True, pos="nope"),
    # FoX Pro (Lin et al. 2025's Pro block): FoX with an output gate, output norm, QK-norm and the key/value
    # shift; their MLP narrowed to 3.5 d_model to pay for the gates is left out.
    "fox_pro": dict(forget_gate=True, pos="nope", attn_gate="elementwise", attn_output_norm=True,
                    qk_norm="before_rope", kv_shift=True),
    # Tan et al. 2025: each earlier key takes sigma(s) of what the nearer keys left; NoPE, as the paper.
    "stick_breaking": dict(attn_fn="stick_breaking", pos="nope"),
    # Ramapuram et al. 2024: sigma(s - log n) per key, unnormalised, with QK-norm as in every config of
    # theirs; the LayerScale and hybrid-norm their 1B runs add are left out.
    "sigmoid": dict(attn_fn="sigmoid", qk_norm="before_rope"),
    "selective": dict(selective_attn=True),  # Leviathan et al. 2024: head 0's logits mask tokens for later
}


def encoding_options() -> dict[str, Fields]:
    """Every ``pos`` option: each registry encoding as itself, then the named forms."""
    return {**{name: dict(pos=name) for name in REGISTRY}, **NAMED_ENCODINGS}


def recipe_conflicts(recipe: str, experiment: Mapping[str, Any],
                     given: Collection[str] = ()) -> dict[str, tuple[Any, Any]]:
    """{"section.key": (the recipe's value, the experiment's)} for every key recipe ``recipe`` sets
    that an experiment's own sections (its YAML file's ``model:``, ``train:``...) set to another
    value, less the keys ``given`` on the command line (which override both)."""
    conflicts = {}
    for section, fields in RECIPES[recipe].items():
        theirs = experiment.get(section) or {}
        for key, value in fields.items():
            if key in theirs and theirs[key] != value and f"{section}.{key}" not in given:
                conflicts[f"{section}.{key}"] = (value, theirs[key])
    return conflicts


def check_recipe_choice(recipe: str, experiment_name: str, experiment: Mapping[str, Any],
                        given: Collection[str] = ()) -> None:
    """The rule for a recipe chosen on the command line with an experiment: the recipe is applied
    whole, or the run is refused. An experiment's keys come after the recipe's, so a key both set
    would silently drop the recipe's value: refused in one line naming both and the keys, unless
    the command line sets the key itself."""
    conflicts = recipe_conflicts(recipe, experiment, given)
    if conflicts:
        said = ", ".join(f"{key}={theirs!r} (the recipe: {ours!r})"
                         for key, (ours, theirs) in conflicts.items())
        raise ValueError(f"recipe={recipe} is invalid with experiment={experiment_name}: the experiment sets "
                         f"{said}; set each on the command line to choose, or drop recipe= to train the "
                         "experiment's own")


def as_overrides(sections: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Config sections as ``key=value`` overrides (``train.lr=0.01``), in the registry's order."""
    def text(value: Any) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    return [f"{section}.{key}={text(value)}" for section, fields in sections.items()
            for key, value in fields.items()]
