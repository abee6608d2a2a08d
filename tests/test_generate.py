"""KV-cached decoding equals recomputation; sampling options do what they say.

References: the full forward pass (logits at every position), per-step recomputation, the
definitions of top-k / top-p / min-p / CTRL's penalty, and transformers' logits processors.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from variants import NO_BIAS, ONLY_ROPE, VARIANTS, alternatives, stages

from nanoattn import GPT, KVCache, ModelConfig, generate
from nanoattn.config.options import encoding_options
from nanoattn.generate import (
    Decoding,
    apply_repetition_penalty,
    min_p_filter,
    sample_categorical,
    top_k_filter,
    top_p_filter,
)
from nanoattn.mechanisms import REGISTRY as MECHANISMS
from nanoattn.positional import REGISTRY
from nanoattn.text import TextStream, sample_text

generate_module = importlib.import_module("nanoattn.generate")  # `nanoattn.generate` is the function

# Every registered encoding, and a per-layer layout (Llama 4's RoPE/NoPE interleaving, with its
# query temperature switching on inside the decoded length).
ENCODINGS = [*REGISTRY, "rope,nope"]
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}
SCALINGS = ["linear", "ntk", "dynamic", "yarn", "llama3"]
MAX_SEQ_LEN = 16
PROMPT = 5
PENALTY = 3.0  # enough that greedy decoding of a random model does not repeat one token


def tiny_config(pos: str = "rope", n_kv_head: int = 2, rope_scaling=None, vocab_size: int = 64,
                **variant) -> ModelConfig:
    """A 2-layer model's config; pos "a,b" is the per-layer layout [a, b] (temperature from position 7
    on); ``variant``: further ModelConfig fields (attention variants)."""
    layout = dict(pos=pos.split(","), temperature_floor_scale=8) if "," in pos else dict(pos=pos)
    fields = dict(vocab_size=vocab_size, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_ff=64,
                  max_seq_len=MAX_SEQ_LEN, rope_scaling=rope_scaling, init_std=0.1, **layout)
    return ModelConfig(**{**fields, **variant})


def tiny(pos: str = "rope", n_kv_head: int = 2, rope_scaling=None, vocab_size: int = 64,
         **variant) -> GPT:
    """The model of ``tiny_config``, seeded, with what starts neutral moved off it."""
    torch.manual_seed(0)
    model = GPT(tiny_config(pos, n_kv_head, rope_scaling, vocab_size, **variant)).eval()
    with torch.no_grad():  # what starts neutral (learned table, sinusoid amplitude, norm gains) must act
        for p in [*model.pos.parameters(), *(p for name, p in model.named_parameters()
                                             if "qk_norm" in name or "sinks" in name)]:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
    return model


def prompt(batch: int = 2, length: int = PROMPT, vocab_size: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))


def new_tokens(pos: str) -> int:
    """Past max_seq_len wherever the encoding is defined there; up to the table for learned."""
    return MAX_SEQ_LEN - PROMPT if pos == "learned" else 2 * MAX_SEQ_LEN - PROMPT


def check_cached_decoding(model: GPT) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every cached step of greedy decoding (with a repetition penalty) has the logits of recomputing
    the whole sequence so far, so greedy decoding picks the tokens it would without the cache; seeded
    sampling gives the same tokens with and without the cache. Returns the greedy tokens [B, T] and
    each step's logits [B, V]."""
    idx, n = prompt(), new_tokens(model.cfg.pos)
    decoding = Decoding(model, idx, n, temperature=0, repetition_penalty=PENALTY)
    steps = []
    for step, _ in enumerate(decoding):
        with torch.no_grad():
            recomputed = model(decoding.idx[:, :PROMPT + step])[:, -1]  # [B, V]
        torch.testing.assert_close(decoding.last_logits, recomputed, atol=1e-5, rtol=1e-5)
        steps.append(decoding.last_logits)
    assert decoding.idx.shape == (2, PROMPT + n)
    sampled = [generate(model, idx, n, use_cache=use_cache, generator=torch.Generator().manual_seed(3))
               for use_cache in (True, False)]
    assert torch.equal(sampled[0], sampled[1])
    return decoding.idx, steps


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pos", ENCODINGS)
def test_cached_decoding_equals_recomputation(pos, layout):
    model = tiny(pos, LAYOUTS[layout])
    tokens, steps = check_cached_decoding(model)
    assert len(set(tokens[0, PROMPT:].tolist())) > 5  # a varied sequence, not one token repeated
    # For every encoding whose rotation does not depend on the length, a cached step also equals
    # one full forward pass of the final sequence at that position (causality).
    with torch.no_grad():
        full = model(tokens)  # [B, T, V]
    for step, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, PROMPT + step - 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi", "xpos", "rope,nope"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_with_attention_variants(variant, pos):
    # Each variant with each encoding: a variant's own pos (FoX, stick-breaking: nope) gives way.
    fields = {key: value for key, value in VARIANTS[variant].items() if key != "pos"}
    if variant in NO_BIAS and any(REGISTRY[name].adds_bias for name in pos.split(",")):
        with pytest.raises(ValueError, match="model.diff_attn=True is invalid: needs encodings without an "
                                             f"attention bias .*; pos='{pos}' adds {pos}$"):
            tiny(pos, **fields)
        return
    if variant in ONLY_ROPE and pos != "rope":
        with pytest.raises(ValueError, match="model.pos=.* is invalid: must be 'rope' with mla_kv_rank"):
            tiny(pos, **fields)
        return
    check_cached_decoding(tiny(pos, **fields))


@pytest.mark.parametrize("layout", ["mha", "mqa"])
@pytest.mark.parametrize("variant", ["fox", "stick_breaking", "sigmoid"])
def test_cached_decoding_of_the_score_variants_with_each_layout(variant, layout):
    """The forget gates' cache and the score functions past the training length with one K/V head
    per query head and with one for all (the tests above run GQA)."""
    fields = dict(VARIANTS[variant])
    check_cached_decoding(tiny(fields.pop("pos", "rope"), LAYOUTS[layout], **fields))


@pytest.mark.parametrize("fields", [dict(forget_gate=True), dict(attn_fn="stick_breaking"),
                                    dict(attn_fn="sigmoid")], ids=["fox", "stick_breaking", "sigmoid"])
def test_cached_decoding_of_the_score_variants_with_latent_attention(fields):
    """Latent attention shares the score functions and the gates (its rows need RoPE, the pair test
    takes FoX and stick-breaking with their rows' NoPE)."""
    check_cached_decoding(tiny("rope", **VARIANTS["mla"], **fields))


# The pairs ModelConfig refuses (latent attention fixes its own queries, keys and values and needs
# RoPE, where FoX and stick-breaking rows take NoPE; a sink per differential map is undefined; a sink
# is a softmax column, and differential attention subtracts softmax maps; selective attention sums
# over every earlier query of one head's map); every other pair of variants works together.
REFUSED_PAIRS = {("qk_norm", "mla"), ("qk_norm_after", "mla"), ("sinks", "diff"), ("diff", "mla"),
                 ("mla", "value_embeds"), ("sinks", "stick_breaking"), ("sinks", "sigmoid"), ("diff", "fox"),
                 ("diff", "stick_breaking"), ("diff", "sigmoid"), ("mla", "fox"), ("mla", "stick_breaking"),
                 ("window", "selective"), ("local_global", "selective"),
                 ("diff", "selective"), ("diff", "fox_pro"), ("mla", "fox_pro"), ("mla", "sigmoid")}
# Every pair of variants, less two values of one field (window and local_global...), which are one choice.
PAIRS = [pair for pair in itertools.combinations(VARIANTS, 2) if not alternatives(*pair)]
# And a registered mechanism that says it cannot act on differential attention's pairs of heads, with it.

def switches_on(variant: str, capability: str) -> bool:
    """Whether variant ``variant`` switches on a registered mechanism with ``capability`` set."""
    fields = VARIANTS[variant].keys()
    return any(getattr(m, capability) and set(m.fields) & fields for m in MECHANISMS.values())


REFUSED_PAIRS |= {(first, second) for first, second in PAIRS
                  for one, other in ((first, second), (second, first))
                  if (VARIANTS[one].get("diff_attn") and switches_on(other, "paired_heads_refusal"))
                  or (VARIANTS[one].get("selective_attn") and switches_on(other, "mixes_heads"))}
INTERACTING = [(first, second) for first, second in PAIRS if stages(first) & stages(second)]


def pair_fields(first: str, second: str) -> tuple[str, dict]:
    """(the pair's encoding: a variant's own (FoX, stick-breaking: NoPE), else RoPE; its other fields)."""
    fields = {**VARIANTS[first], **VARIANTS[second]}
    return fields.pop("pos", "rope"), fields


def test_the_refused_pairs_are_pairs():
    assert REFUSED_PAIRS <= set(PAIRS), REFUSED_PAIRS - set(PAIRS)


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_every_pair_of_variants_builds_or_is_refused_in_one_line(first, second):
    """Exhaustive, as it builds only the config: a pair is refused exactly when REFUSED_PAIRS lists it."""
    pos, fields = pair_fields(first, second)
    if (first, second) in REFUSED_PAIRS:
        with pytest.raises(ValueError, match="^model\\.[a-z_]+=.* is invalid: [^\n]*$"):
            tiny_config(pos, **fields)
    else:
        tiny_config(pos, **fields)


@pytest.mark.parametrize(("first", "second"), [pair for pair in INTERACTING if pair not in REFUSED_PAIRS])
def test_each_pair_of_variants_acting_on_one_stage_decodes_exactly(first, second):
    """Cached decoding of two variants together, for each pair that acts on a common stage
    (tests/variants.py's STAGES: the block's input, the queries, keys and values, the scores and their
    weights, the heads' outputs, the cache's own state). That covers the interactions cached decoding
    can get wrong: each variant alone decodes exactly (with four encodings, and the score variants with
    each layout: the tests above), and two variants on disjoint stages compose as functions, each exact
    given an exact input and owning no state the other advances, so the pair is exact too. Two on one
    stage (a window and a decay over the same scores, a gate and the exclusion on the same outputs,
    canon and token shift on the input, two states the cache advances together) can disagree in an
    order, an index or a slot, and each such pair is decoded. A new variant's field not placed in STAGES
    acts on every stage, so it is paired with every other until placed."""
    pos, fields = pair_fields(first, second)
    check_cached_decoding(tiny(pos, **fields))


@pytest.mark.parametrize("kind", SCALINGS)
def test_cached_decoding_with_rope_scaling(kind):
    check_cached_decoding(tiny("rope", rope_scaling={"type": kind, "factor": 2.0}))


def test_dynamic_ntk_cache_goes_stale_when_the_base_changes():
    """Why Decoding starts its cache over under dynamic NTK: keys cached un-rotated keep the first
    layer exact, but deeper layers' cached K/V were computed under the old base."""
    model = tiny("rope", rope_scaling={"type": "dynamic", "factor": 2.0})
    assert model.pos.length_dependent_rotation
    assert not model.pos.rotation_changes(PROMPT, MAX_SEQ_LEN)  # the original base up to 16
    assert model.pos.rotation_changes(MAX_SEQ_LEN, MAX_SEQ_LEN + 1)
    length = MAX_SEQ_LEN + 4
    idx = prompt(length=length)
    cache = KVCache(model.cfg, 2, length)
    with torch.no_grad():
        one_pass = model(idx)
        model(idx[:, :MAX_SEQ_LEN], cache=cache)
        stale = model(idx[:, MAX_SEQ_LEN:], cache=cache)
    assert (stale - one_pass[:, MAX_SEQ_LEN:]).abs().max() > 1e-4
    # Decoding keeps its cache while the base holds and re-encodes at every step past it.
    within = Decoding(model, prompt(), MAX_SEQ_LEN - PROMPT)
    for _ in within:
        pass
    assert within.filled_at == PROMPT
    past = Decoding(model, prompt(), new_tokens("rope"))
    for _ in past:
        pass
    assert past.filled_at == past.length - 1


def test_cache_is_sized_to_the_request_and_shrinks_with_kv_heads():
    sizes = {}
    for layout, n_kv in LAYOUTS.items():
        model = tiny("rope", n_kv)
        decoding = Decoding(model, prompt(), 7)
        next(decoding)
        cfg = model.cfg
        assert decoding.cache.capacity == PROMPT + 7
        sizes[layout] = decoding.kv_cache_bytes
        assert sizes[layout] == 2 * cfg.n_layer * 2 * n_kv * (PROMPT + 7) * cfg.head_dim * 4  # K and V, fp32
    assert sizes["mha"] == 2 * sizes["gqa"] == 4 * sizes["mqa"]
    assert Decoding(tiny(), prompt(), 7, use_cache=False).kv_cache_bytes == 0


def test_cache_dtype_follows_the_compute_dtype():
    model, idx = tiny(), prompt()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        decoding = Decoding(model, idx, 4)
        next(decoding)
        with torch.no_grad():
            activation = model.blocks[0].attn.qkv(model.tok_emb(idx))
    assert decoding.cache.dtype == activation.dtype == torch.bfloat16
    assert Decoding(model, idx, 4).cache.dtype == torch.float32
    assert Decoding(tiny().to(torch.bfloat16), idx, 4).cache.dtype == torch.bfloat16


def test_bf16_cached_decoding_stays_close_to_recomputation():
    model = tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        decoding = Decoding(model, prompt(), 8, temperature=0)
        for step, _ in enumerate(decoding):
            with torch.no_grad():
                recomputed = model(decoding.idx[:, :PROMPT + step])[:, -1].float()
            torch.testing.assert_close(decoding.last_logits, recomputed, atol=0.05, rtol=0.05)


def test_learned_positions_stop_at_the_table_unless_sliding():
    model = tiny("learned")
    idx = prompt()
    with pytest.raises(ValueError, match=r"prompt \(5\) \+ max_new_tokens \(12\) = 17 tokens.*sliding"):
        generate(model, idx, MAX_SEQ_LEN - PROMPT + 1)
    for use_cache in (True, False):
        with pytest.raises(ValueError, match="learned position table"):
            generate(model, idx, 20, use_cache=use_cache)
    # Sliding: each step past the table re-encodes the last max_seq_len tokens, which the
    # reference below does by hand; the first steps still use the cache.
    out = generate(model, idx, 20, temperature=0, repetition_penalty=PENALTY, sliding_window=True)
    assert out.shape == (2, PROMPT + 20)
    expected = idx
    for _ in range(20):
        with torch.no_grad():
            logits = model(expected[:, -MAX_SEQ_LEN:])[:, -1]
        token = apply_repetition_penalty(logits, expected, PENALTY).argmax(-1, keepdim=True)
        expected = torch.cat([expected, token], dim=1)
    assert torch.equal(out, expected)
    long_prompt = prompt(length=MAX_SEQ_LEN + 3)
    assert generate(model, long_prompt, 3, sliding_window=True).shape == (2, MAX_SEQ_LEN + 6)


def test_greedy_is_argmax_of_the_full_forward():
    model, idx = tiny(), prompt()
    out = generate(model, idx, 6, temperature=0)
    with torch.no_grad():
        argmax = model(out[:, :-1]).argmax(-1)[:, PROMPT - 1:]
    assert torch.equal(out[:, PROMPT:], argmax)


# ----------------------------------------------------------------------------- filters


def random_logits(batch: int = 8, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return 3 * torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 5, 49, 50, 80])
def test_top_k_matches_definition_and_transformers(k):
    logits = random_logits()
    kept = top_k_filter(logits, k).isfinite()
    assert (kept.sum(-1) == min(k, 50)).all()
    best = logits.topk(min(k, 50), dim=-1).indices
    assert kept.gather(-1, best).all()
    ours = top_k_filter(logits, k)
    assert torch.equal(ours, TopKLogitsWarper(top_k=k)(None, logits.clone()))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_with_mass_p(p):
    logits = random_logits()
    kept = top_p_filter(logits, p).isfinite()
    probs = logits.softmax(-1)
    for row in range(logits.shape[0]):
        ranked = probs[row].sort(descending=True).values
        smallest = int((ranked.cumsum(0) < p).sum()) + 1  # the first prefix whose mass reaches p
        assert kept[row].sum() == min(smallest, 50)
        dropped = torch.cat([probs[row][~kept[row]], probs.new_zeros(1)])
        assert probs[row][kept[row]].min() >= dropped.max()
    assert torch.equal(kept, TopPLogitsWarper(top_p=p)(None, logits.clone()).isfinite())


def test_top_p_on_a_known_distribution():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_filter(logits, 0.8).isfinite().tolist() == [[True, True, False, False]]
    assert top_p_filter(logits, 0.81).isfinite().tolist() == [[True, True, True, False]]
    assert top_p_filter(logits, 0.4).isfinite().tolist() == [[True, False, False, False]]
    # p = 1 keeps every token, even where a float32 cumsum reaches 1 before the last one.
    assert top_p_filter(random_logits(), 1.0).isfinite().all()


@pytest.mark.parametrize("p", [0.0, 0.05, 0.2, 0.7, 1.0])
def test_min_p_matches_definition_and_transformers(p):
    logits = random_logits()
    probs = logits.softmax(-1)
    kept = min_p_filter(logits, p).isfinite()
    assert torch.equal(kept, probs >= p * probs.max(-1, keepdim=True).values)
    assert torch.equal(kept, MinPLogitsWarper(min_p=p)(None, logits.clone()).isfinite())


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_as_ctrl_and_transformers(penalty):
    logits = random_logits(batch=2, vocab=10)
    idx = torch.tensor([[1, 2, 2, 7], [0, 9, 3, 3]])
    ours = apply_repetition_penalty(logits, idx, penalty)
    expected = logits.clone()
    for row in range(2):
        for token in set(idx[row].tolist()):
            value = logits[row, token]
            expected[row, token] = value / penalty if value > 0 else value * penalty
    assert torch.equal(ours, expected)
    assert torch.equal(ours, RepetitionPenaltyLogitsProcessor(penalty=penalty)(idx, logits.clone()))


def test_repetition_penalty_covers_the_prompt():
    model, idx = tiny(), prompt()
    decoding = Decoding(model, idx, 1, temperature=0, repetition_penalty=1e6)
    token = next(decoding)
    for row in range(2):
        assert token[row].item() not in idx[row].tolist()


@pytest.mark.parametrize("option", [{"top_k": 3}, {"top_p": 0.5}, {"min_p": 0.3}])
def test_sampling_never_leaves_the_filtered_set(option):
    model = tiny()
    decoding = Decoding(model, prompt(batch=4), 30, temperature=1.0,
                        generator=torch.Generator().manual_seed(0), **option)
    name, value = next(iter(option.items()))
    reference = {"top_k": top_k_filter, "top_p": top_p_filter, "min_p": min_p_filter}[name]
    for token in decoding:
        allowed = reference(decoding.last_logits, value).isfinite()  # [B, V]
        assert allowed.gather(-1, token[:, None]).all()


def test_categorical_sampling_draws_each_token_with_its_probability(monkeypatch):
    probs = torch.tensor([[0.1, 0.2, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [0.5, 0.0, 0.5, 0.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    n = 40_000
    draws = torch.stack([sample_categorical(probs, generator) for _ in range(n)])  # [n, 3]
    frequencies = torch.stack([torch.bincount(draws[:, row], minlength=5) for row in range(3)]).double() / n
    # 4 standard errors of a frequency near 0.5 over 40,000 draws: 0.01; zero mass is never drawn.
    torch.testing.assert_close(frequencies, probs.double(), atol=0.01, rtol=0)
    assert torch.all(frequencies[probs == 0] == 0)
    # A draw that rounds onto the top of the CDF lands on the last token with mass, not a trailing zero.
    monkeypatch.setattr(torch, "rand", lambda *shape, **options: torch.ones(*shape, dtype=torch.float64))
    assert sample_categorical(probs).tolist() == [3, 4, 2]


def test_seeded_sampling_reproduces_and_seeds_differ():
    model, idx = tiny(), prompt()

    def run(seed):
        return generate(model, idx, 20, top_k=20, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


def test_stop_tokens_end_each_sequence_and_pad_with_the_stop():
    model, idx = tiny(), prompt()
    free = generate(model, idx, 12, temperature=0, repetition_penalty=PENALTY)[:, PROMPT:]
    stop = free[0, 3].item()
    out = generate(model, idx, 12, temperature=0, repetition_penalty=PENALTY, stop_tokens=[stop])
    ends = []
    for row in range(2):
        hits = (free[row] == stop).nonzero()
        ends.append(int(hits[0]) + 1 if len(hits) else 12)
    assert out.shape == (2, PROMPT + max(ends))
    for row, end in enumerate(ends):
        assert torch.equal(out[row, PROMPT:PROMPT + end], free[row, :end])
        assert (out[row, PROMPT + end:] == stop).all()
    all_stop = generate(model, idx, 12, temperature=0, repetition_penalty=PENALTY,
                        stop_tokens=free[:, 0].tolist())
    assert all_stop.shape == (2, PROMPT + 1)


def test_compiled_decoding_matches_eager_in_one_graph_for_every_length():
    """compile=True: the same greedy tokens, and each step's logits equal to eager ones within
    float32 rounding (Inductor fuses the norms and sums in another order). One graph: the cache's
    length and size are symbolic, so later steps, other prompts and other totals compile nothing."""
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # the worker's earlier tests' too
    model, greedy = tiny(), dict(temperature=0, repetition_penalty=PENALTY)
    compiled = Decoding(model, prompt(), 9, compile=True, **greedy)
    eager = Decoding(model, prompt(), 9, **greedy)
    for token, reference in zip(compiled, eager, strict=True):
        assert torch.equal(token, reference)
        torch.testing.assert_close(compiled.last_logits, eager.last_logits, atol=1e-5, rtol=1e-5)
    for prompt_len, new in ((PROMPT + 2, 7), (PROMPT, 4)):
        idx = prompt(length=prompt_len)
        tokens = generate(model, idx, new, compile=True, **greedy)
        assert torch.equal(tokens, generate(model, idx, new, **greedy))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1


COMPILED_STEPS = 6


def fewest_layers(pos: str, fields: dict) -> int:
    """The fewest layers a variant's config accepts (a per-layer list or value embeddings need two):
    Dynamo's tracing, what a compile test pays for, grows with the layers."""
    for layers in (1, 2, 4):
        try:
            tiny_config(pos, n_layer=layers, **fields)
            return layers
        except ValueError:
            continue
    raise ValueError(f"no model of up to 4 layers takes {fields}")


@pytest.mark.parametrize("name", [*encoding_options(), *VARIANTS])
def test_compiled_decoding_compiles_nothing_after_its_first_steps(name, monkeypatch):
    """Every encoding and attention variant: the graphs of the first compiled steps (the cache's
    length symbolic) serve every later step, so decoding never compiles per token, and the tokens
    are eager decoding's. Dynamo alone decides the graphs (backend="eager"):
    Inductor would compile the same ones."""
    dynamo_only = torch.compile(generate_module.step_logits, backend="eager")
    monkeypatch.setattr(generate_module, "compiled_step_logits", lambda: dynamo_only)
    if name in VARIANTS:
        fields = dict(VARIANTS[name])
        pos = fields.pop("pos", "rope")
        model = tiny(pos, n_layer=fewest_layers(pos, fields), **fields)
    else:
        fields = encoding_options()[name]
        layers = len(fields["pos"]) if isinstance(fields["pos"], list) else 1  # iRoPE's layout has four
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(tiny_config(n_layer=layers, abacus_digits=list(range(10))),
                                        **fields)).eval()
    greedy = dict(temperature=0, repetition_penalty=PENALTY)
    torch._dynamo.reset()
    graphs = []
    compiled = Decoding(model, prompt(), COMPILED_STEPS, compile=True, **greedy)
    for _ in compiled:
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    # The prompt's step and the first token's run eagerly; the next compiles. An ordinary int
    # across a graph break (the abacus check's) turns symbolic at the next step; none after that.
    assert graphs[2] > graphs[1] and graphs[-1] == graphs[3], graphs
    assert torch.equal(compiled.idx, generate(model, prompt(), COMPILED_STEPS, **greedy))


def test_generate_returns_an_ordinary_tensor_and_restores_training_mode():
    model, idx = tiny(), prompt()
    model.train()
    out = generate(model, idx, 3)
    assert model.training and not out.is_inference() and not out.requires_grad
    assert generate(model, idx, 0).shape == idx.shape


@pytest.mark.parametrize("option, match", [
    ({"temperature": -1}, "generate.temperature=-1"),
    ({"top_k": 0}, "generate.top_k=0"),
    ({"top_p": 1.5}, "generate.top_p=1.5"),
    ({"min_p": -0.1}, "generate.min_p=-0.1"),
    ({"repetition_penalty": 0}, "generate.repetition_penalty=0"),
    ({"stop_tokens": [64]}, "generate.stop_tokens"),
    ({"max_new_tokens": -2}, "generate.max_new_tokens=-2"),
    ({"compile": "yes"}, "generate.compile='yes' is invalid: must be true or false"),
    ({"compile": True, "use_cache": False}, "generate.compile=True is invalid: .* needs use_cache=True"),
])
def test_bad_options_are_one_line_errors(option, match):
    kwargs = {"max_new_tokens": 4, **option}
    with pytest.raises(ValueError, match=match) as info:
        generate(tiny(), prompt(), **kwargs)
    assert "\n" not in str(info.value)


def test_bad_prompt_ids_are_refused():
    with pytest.raises(ValueError, match=r"generate.idx.*\[0, 64\)"):
        generate(tiny(), torch.tensor([[3, 64]]), 2)
    with pytest.raises(ValueError, match="int64 tensor"):
        generate(tiny(), torch.tensor([3, 4]), 2)


# ----------------------------------------------------------------------------- text

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"


def char_tokenizer() -> Tokenizer:
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return tokenizer


def test_stop_strings_end_the_text_before_them_and_streaming_agrees():
    model, tokenizer = tiny(vocab_size=len(CHARS) + 1), char_tokenizer()
    ids = tokenizer.encode("to be").ids
    options = dict(temperature=1.0, num_samples=3)
    free, _ = sample_text(model, tokenizer, ids, 40, generator=torch.Generator().manual_seed(0), **options)
    stop = free[0][10:13]  # three characters: three tokens
    pieces: dict[int, list[str]] = {0: [], 1: [], 2: []}
    texts, _ = sample_text(model, tokenizer, ids, 40, stop=[stop], generator=torch.Generator().manual_seed(0),
                           on_text=lambda b, piece: pieces[b].append(piece), **options)
    for b in range(3):
        cut = free[b].find(stop)
        assert texts[b] == (free[b] if cut < 0 else free[b][:cut])
        assert "".join(pieces[b]) == texts[b]
    assert len(texts[0]) == free[0].find(stop) <= 10


def test_text_stream_holds_back_partial_characters_and_stop_prefixes():
    tokenizer = char_tokenizer()
    stream = TextStream(tokenizer, stop=["ab."])
    pushed = [stream.push(tokenizer.token_to_id(c)) for c in "xa"]
    assert pushed == ["x", ""]  # "a" may start "ab."
    assert stream.push(tokenizer.token_to_id("c")) == "ac"
    assert [stream.push(tokenizer.token_to_id(c)) for c in "ab."] == ["", "", ""]
    assert stream.done and stream.text == "xac"

    # Byte-level symbols of the bytes 0xC3 0xA9 (UTF-8 of "é") and "!".
    byte = Tokenizer(models.BPE(vocab={"\u00c3": 0, "\u00a9": 1, "!": 2}, merges=[]))
    byte.decoder = decoders.ByteLevel()
    stream = TextStream(byte)
    assert [stream.push(t) for t in (0, 1, 2)] == ["", "\u00e9", "!"]


def test_stop_token_ends_text_and_is_not_printed():
    model, tokenizer = tiny(vocab_size=len(CHARS) + 1), char_tokenizer()
    ids = tokenizer.encode("ab").ids
    free = generate(model, torch.tensor([ids]), 20, temperature=0, repetition_penalty=PENALTY)[0, 2:].tolist()
    stop = free[4]
    texts, decoding = sample_text(model, tokenizer, ids, 20, temperature=0, repetition_penalty=PENALTY,
                                  stop_tokens=[stop])
    assert texts == [tokenizer.decode(free[:free.index(stop)])]
    assert decoding.finished.all()
