"""The rows of the reference table: one per ``pos=`` option and per attention variant, each with its
paper and its checks."""

from __future__ import annotations

from transformers import (
    GPT2LMHeadModel,
    Llama4ForCausalLM,
    LlamaForCausalLM,
    MinistralForCausalLM,
    Qwen3ForCausalLM,
)

from nanoattn.config.options import encoding_options
from nanoattn.references.attention import (
    LAYER,
    diff_paper,
    mla_deepseek,
    qk_norm_after_written_out,
    selective_paper,
    selective_x_transformers,
    sinks_gpt_oss,
    softcap_gemma2,
)
from nanoattn.references.core import LOGITS, Check, Row, exported
from nanoattn.references.encodings import (
    BIAS,
    COPE,
    FIRE,
    KERPLE,
    POPE,
    ROTATION,
    SCALED_SINUSOID,
    SINUSOID,
    XPOS,
    alibi_x_transformers,
    cope_x_transformers,
    fire_paper,
    kerple_paper,
    pope_paper,
    pope_x_transformers,
    rope_against_llama,
    rope_partial_gpt_neox,
    rope_rotary_embedding_torch,
    sinusoidal_paper,
    sinusoidal_scaled_x_transformers,
    t5_transformers,
    xpos_rotary_embedding_torch,
)
from nanoattn.references.fixtures import BASE, GPT2, at_test_size
from nanoattn.references.mixing import talking_heads_paper, talking_heads_x_transformers
from nanoattn.references.scores import (
    SPREAD_LAYER,
    fox_paper,
    fox_pro_paper,
    fox_x_transformers,
    gate_paper,
    gate_qwen3_next,
    gate_x_transformers,
    sigmoid_paper,
    sigmoid_x_transformers,
    ssmax_paper,
    stick_breaking_paper,
    xsa_paper,
)
from nanoattn.references.stream import (
    CONVOLUTION,
    HOOKED,
    abacus_written_out,
    canon_physicslm4,
    canon_written_out,
    token_shift_written_out,
    value_embeds_written_out,
)

# ----------------------------------------------------------------------------- the rows

ENCODING, VARIANT = "encoding", "attention variant"
WRITTEN_OUT = "the paper's equations, written out in float64 in nanoattn/references"
LLAMA_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
IROPE = {**BASE, **encoding_options()["irope"], "temperature_floor_scale": 8}  # acting from position 7 on
LLAMA_LOGITS = "logits of the exported model (4 layers, GQA, 80 tokens)"


def variant_fields(name: str) -> dict:
    return {**BASE, **at_test_size(name)}


POSITIONS = "positions 0-31 and 5000-5031"
P_ROPE = {"rope_type": "proportional", "rope_theta": 10000.0,
          "partial_rotary_factor": encoding_options()["p_rope"]["rope_p"]}
NOT_PACKAGED = "the authors' code ({}) is not packaged"
ABACUS_PAPER = "McLeish et al. 2024, arXiv:2405.17399"


def abacus_checks(name: str) -> tuple[Check, ...]:
    """The three forms differ only in the ``pos`` beside the abacus: one check, over each form's model."""
    pos = encoding_options()[name]["pos"]
    return (Check(f"the model with pos={pos} and no abacus, its embeddings rewritten to E[token] + A[i] by a "
                  "hook, i each digit's index in its number (+ k in training) written out from the paper",
                  "logits (2 layers, 24 tokens in runs of digits), at evaluation and in training (3 "
                  "forward passes, each drawing k)", lambda: abacus_written_out(name), HOOKED,
                  NOT_PACKAGED.format("mcleish7/arithmetic, abacus.py") + "; x-transformers has none. "
                  "nanoattn draws one offset k per forward pass for the whole batch, as that code: the check "
                  "finds each row's k, the one in [0, abacus_max_offset] whose written-out logits are "
                  "nearest"),)

ROWS: dict[str, Row] = {
    "sinusoidal": Row(ENCODING, "Vaswani et al. 2017, arXiv:1706.03762", (
        Check(WRITTEN_OUT, "the first block's input, sqrt(d_model) E[token] + PE(pos)", sinusoidal_paper,
              SINUSOID),)),
    "sinusoidal_scaled": Row(ENCODING, "Hua et al. 2022, arXiv:2202.10447 (learned scale)", (
        Check("x_transformers.ScaledSinusoidalEmbedding", "embeddings + amplitude x table, 64 positions",
              sinusoidal_scaled_x_transformers, SCALED_SINUSOID,
              "x-transformers puts the sines first and the cosines after them, nanoattn interleaves them as "
              "the paper: compared under that permutation of the table's columns. The amplitude is copied "
              "(nanoattn starts it at 0, x-transformers at d^-1/2)"),)),
    "learned": Row(ENCODING, "Radford et al. 2019 (GPT-2; no arXiv id)", (
        Check("transformers.GPT2LMHeadModel", "logits of the exported model (2 layers, 80 tokens)",
              lambda: exported(GPT2, GPT2LMHeadModel), LOGITS,
              "nanoattn starts the table at 0, transformers' GPT-2 at N(0, 0.02): compared on perturbed "
              "weights"),)),
    "rope": Row(ENCODING, "Su et al. 2021, arXiv:2104.09864", (
        Check("transformers LlamaRotaryEmbedding + apply_rotary_pos_emb",
              f"rotated q, k (GQA) at {POSITIONS}",
              lambda: rope_against_llama("rope", LLAMA_ROPE), ROTATION),
        Check("rotary_embedding_torch.RotaryEmbedding", f"rotated q at {POSITIONS}",
              rope_rotary_embedding_torch, ROTATION,
              "rotary-embedding-torch rotates interleaved pairs (2i, 2i+1), nanoattn half-split pairs "
              "(i, i+d/2) as Llama: compared under that permutation of the head's dims"))),
    "alibi": Row(ENCODING, "Press et al. 2022, arXiv:2108.12409", (
        Check("x_transformers.AlibiPositionalBias", "bias, 12 heads x 40 x 40", alibi_x_transformers,
              BIAS),)),
    "nope": Row(ENCODING, "Kazemnejad et al. 2023, arXiv:2305.19466", (
        Check("transformers.Llama4ForCausalLM, every layer without RoPE", LLAMA_LOGITS,
              lambda: exported({**BASE, **encoding_options()["nope"]}, Llama4ForCausalLM), LOGITS),)),
    "t5": Row(ENCODING, "Raffel et al. 2020, arXiv:1910.10683", (
        Check("transformers T5Attention.compute_bias (decoder)", "bias at 5 (buckets, max distance) pairs, "
              "distances 0 to 3 max_distance and 123,456", t5_transformers, BIAS),)),
    "kerple_log": Row(ENCODING, "Chi et al. 2022, arXiv:2205.09921", (
        Check(WRITTEN_OUT, "bias, 4 heads, distances 0 to 1000", lambda: kerple_paper("kerple_log"), BIAS,
              NOT_PACKAGED.format("chijames/KERPLE")),)),
    "kerple_power": Row(ENCODING, "Chi et al. 2022, arXiv:2205.09921", (
        Check(WRITTEN_OUT, "bias, 4 heads, distances 0 to 1000", lambda: kerple_paper("kerple_power"),
              KERPLE, NOT_PACKAGED.format("chijames/KERPLE")),)),
    "fire": Row(ENCODING, "Li et al. 2023, arXiv:2310.04418", (
        Check(WRITTEN_OUT, "bias, 4 heads, queries 0-39, 500 and 1000", fire_paper, FIRE,
              "as the reference module circulated with the paper: |c|, L = |s| L0, 1e-6 added to the "
              "normaliser"),)),
    "cope": Row(ENCODING, "Golovneva et al. 2024, arXiv:2405.18719", (
        Check("x_transformers.CoPE", "bias, 4 query heads over 2 key heads, 24 tokens, clipped at 7",
              cope_x_transformers, COPE,
              "x-transformers (the paper's appendix code) adds the position logits to q.k / sqrt(d); the "
              "authors' released code (facebookresearch/RAM), as nanoattn, adds them to q.k before dividing "
              "by sqrt(d): compared with q / sqrt(d) handed to x-transformers' position logits"),)),
    "xpos": Row(ENCODING, "Sun et al. 2022, arXiv:2212.10554", (
        Check("rotary_embedding_torch.RotaryEmbedding(use_xpos=True)", "rotated and decayed q, k, 64 tokens",
              xpos_rotary_embedding_torch, XPOS,
              "interleaved pairs there, half-split here (dims permuted); both centre positions on "
              "max_seq_len // 2, which the reference takes from the current length: compared at that "
              "length"),)),
    "pope": Row(ENCODING, "Gopalakrishnan et al. 2025, arXiv:2509.10534", (
        Check("x_transformers PolarEmbedding + apply_polar_pos_emb", f"q.k logits of mapped q, k (MHA) at "
              f"{POSITIONS}; with the phase bias at 0-31", pope_x_transformers, POPE,
              "x-transformers adds the phase bias to the keys' phase; nanoattn turns the queries by minus it "
              "(the same score, one bias per query head under GQA) and multiplies them by sqrt(2) against "
              "attention's 1/sqrt(2d): compared as logits. Its bias is shared by the layers, nanoattn's per "
              "layer; both start at 0 within [-2 pi, 0]"),
        Check(WRITTEN_OUT, "attention layer output, GQA, 20 tokens, phase bias drawn in its range",
              pope_paper, LAYER))),
    "rope_partial": Row(ENCODING, "Black et al. 2022 (GPT-NeoX-20B), arXiv:2204.06745", (
        Check("transformers GPTNeoXRotaryEmbedding + apply_rotary_pos_emb (rotary_pct 0.25)",
              f"rotated q, k at {POSITIONS}", rope_partial_gpt_neox, ROTATION),)),
    "p_rope": Row(ENCODING, "Barbero et al. 2024, arXiv:2410.06205", (
        Check("transformers LlamaRotaryEmbedding, rope_type 'proportional'",
              f"rotated q, k (GQA) at {POSITIONS}",
              lambda: rope_against_llama("p_rope", P_ROPE), ROTATION),)),
    "abacus": Row(ENCODING, ABACUS_PAPER, abacus_checks("abacus")),
    "abacus_fire": Row(ENCODING, f"{ABACUS_PAPER}; FIRE: Li et al. 2023, arXiv:2310.04418",
                       abacus_checks("abacus_fire")),
    "abacus_rope": Row(ENCODING, f"{ABACUS_PAPER}; RoPE: Su et al. 2021, arXiv:2104.09864",
                       abacus_checks("abacus_rope")),
    "irope": Row(ENCODING, "Meta 2025 (Llama 4; no paper); temperature: Nakanishi 2025, arXiv:2501.19399", (
        Check("transformers.Llama4ForCausalLM", LLAMA_LOGITS, lambda: exported(IROPE, Llama4ForCausalLM),
              LOGITS, "temperature_floor_scale 8 instead of the option's 128 (the labs' training length), so "
              "the temperature acts within the 80 tokens"),)),
    "plain": Row(VARIANT, "Vaswani et al. 2017, arXiv:1706.03762", (
        Check("transformers.LlamaForCausalLM", LLAMA_LOGITS,
              lambda: exported(variant_fields("plain"), LlamaForCausalLM), LOGITS),)),
    "qk_norm": Row(VARIANT, "Yang et al. 2025 (Qwen 3), arXiv:2505.09388", (
        Check("transformers.Qwen3ForCausalLM", LLAMA_LOGITS,
              lambda: exported(variant_fields("qk_norm"), Qwen3ForCausalLM), LOGITS,
              "per head, as Qwen 3; OLMo 2 (arXiv:2501.00656) normalises the whole projection instead"),)),
    "qk_norm_after": Row(VARIANT, "Karpathy 2025 (nanochat; no paper)", (
        Check(WRITTEN_OUT, "attention layer output, GQA, 20 tokens", qk_norm_after_written_out, LAYER,
              "nanochat's norm has no gain; nanoattn's gains start at 1 and learn (compared with gains "
              "moved off 1)"),)),
    "softcap": Row(VARIANT, "Gemma Team 2024 (Gemma 2), arXiv:2408.00118", (
        Check("transformers Gemma2Attention (eager)", "attention layer output, MHA, GQA and MQA, cap 1.5",
              softcap_gemma2, LAYER,
              "the output-logit cap is cap tanh(logits / cap), checked against that formula in "
              "tests/model/test_attention_variants.py"),)),
    "sinks": Row(VARIANT, "OpenAI 2025 (gpt-oss model card), arXiv:2508.10925", (
        Check("transformers GptOssAttention (eager)", "attention layer output and weights, MHA, GQA and MQA",
              sinks_gpt_oss, LAYER,
              "nanoattn starts the sinks at 0, transformers at N(0, 0.02): compared with sinks -1 to 4"),)),
    "window": Row(VARIANT, "Jiang et al. 2023 (Mistral 7B), arXiv:2310.06825", (
        Check("transformers.MinistralForCausalLM", LLAMA_LOGITS + ", window 6",
              lambda: exported(variant_fields("window"), MinistralForCausalLM), LOGITS),)),
    "local_global": Row(VARIANT, "Gemma Team 2024 (Gemma 2), arXiv:2408.00118", (
        Check("transformers.MinistralForCausalLM", LLAMA_LOGITS + ", windows 6 and none alternating",
              lambda: exported(variant_fields("local_global"), MinistralForCausalLM), LOGITS),)),
    "diff": Row(VARIANT, "Ye et al. 2024, arXiv:2410.05258", (
        Check(WRITTEN_OUT, "attention layer output, layers 1 and 4", diff_paper, LAYER,
              NOT_PACKAGED.format("microsoft/unilm, Diff-Transformer")),)),
    "mla": Row(VARIANT, "DeepSeek-AI 2024 (DeepSeek-V2), arXiv:2405.04434", (
        Check("transformers DeepseekV3Attention (eager)",
              "attention layer output and weights, full- and low-rank queries", mla_deepseek, LAYER),)),
    "value_embeds": Row(VARIANT, "Jordan et al. 2024 (modded-nanogpt; no paper)", (
        Check("the plain model with its values rewritten to a v + b E[token] by a hook", "logits",
              value_embeds_written_out, HOOKED),)),
    "token_shift": Row(VARIANT, "Peng et al. 2023 (RWKV), arXiv:2305.13048; modded-nanogpt's smear", (
        Check("the plain model with its embeddings rewritten to e_t + g e_(t-1) by a hook", "logits",
              token_shift_written_out, HOOKED),)),
    "gate": Row(VARIANT, "Qiu et al. 2025, arXiv:2505.06708 (G1; Qwen3-Next)", (
        Check(WRITTEN_OUT, "attention layer output and weights, headwise and elementwise, MHA, GQA and MQA",
              gate_paper, SPREAD_LAYER),
        Check("transformers Qwen3NextAttention (eager)",
              "attention layer output, elementwise, with QK-norm, MHA, GQA and MQA", gate_qwen3_next, LAYER,
              "Qwen3-Next's q_proj holds each head's query rows then its gate rows, nanoattn's gate is a "
              "projection of its own: its rows copied into that order. Qwen3-Next stores its norm gains as "
              "1 + w: compared with nanoattn's gains moved off 1, copied as gain - 1"),
        Check("x_transformers.Attention(gate_values=True)",
              "attention layer output, headwise and elementwise, MHA, GQA and MQA", gate_x_transformers,
              LAYER, "x-transformers starts W_g at 0 (every gate 1/2): compared with nanoattn's W_g copied. "
              "Its query head i reads K/V head i mod n_kv_head, nanoattn's i // (n_head / n_kv_head): "
              "compared with nanoattn's heads permuted into its order (queries, gates and W_O's columns)"))),
    "ssmax": Row(VARIANT, "Nakanishi 2025, arXiv:2501.19399", (
        Check(WRITTEN_OUT, "attention layer output and weights, MHA, GQA and MQA, with and without a "
              "window of 5", ssmax_paper, SPREAD_LAYER,
              "the paper learns s from a start it leaves open, nanoattn starts it at 1 / log max_seq_len: "
              "compared with s from 0.2 to 2 per head"),)),
    "xsa": Row(VARIANT, "Zhai 2026, arXiv:2603.09078", (
        Check(WRITTEN_OUT, "attention layer output and weights, MHA, GQA and MQA", xsa_paper,
              SPREAD_LAYER),)),
    "talking_heads": Row(VARIANT, "Shazeer et al. 2020, arXiv:2003.02436", (
        Check(WRITTEN_OUT, "attention layer output and weights, MHA, GQA and MQA", talking_heads_paper,
              SPREAD_LAYER, "the paper's equations fix no start, nanoattn starts both mixes at the identity: "
              "compared with mixes drawn N(0, 0.3)"),
        Check("x_transformers.Attend(pre_talking_heads=True, post_talking_heads=True)",
              "each head's output, MHA and MQA", talking_heads_x_transformers, SPREAD_LAYER,
              "x-transformers mixes the logits as sim + W_pre sim: compared with W_pre = P_l^T - I. Its "
              "query head h reads K/V head h mod n_kv_head, nanoattn's h // (n_head / n_kv_head): compared "
              "at MHA and MQA, where both agree"))),
    "canon": Row(VARIANT, "Allen-Zhu 2025 (Physics of Language Models 4.1, Canon-A), arXiv:2512.17351", (
        Check("the authors' convolution (a depthwise torch.nn.Conv1d padded by width - 1, cut to T, plus "
              "the input), written out in nanoattn/references/stream.py",
              "the canon layer's output, widths 2 and 4", canon_physicslm4, CONVOLUTION,
              NOT_PACKAGED.format("facebookresearch/PhysicsLM4")),
        Check("the plain model with that convolution hooked onto each attention's input", "logits",
              canon_written_out, HOOKED))),
    "fox": Row(VARIANT, "Lin et al. 2025 (Forgetting Transformer), arXiv:2503.02130", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE and ALiBi, MHA, GQA and MQA", fox_paper,
              SPREAD_LAYER),
        Check("x_transformers.DataDependentAlibi, fed to its Attend", "attention layer output, MHA and MQA",
              fox_x_transformers, SPREAD_LAYER,
              "x-transformers starts the gate's bias at 5 (gates near 1), FoX and nanoattn at 0: compared "
              "with nanoattn's gate weights and bias copied. Its query head h reads K/V head h mod "
              "n_kv_head, nanoattn's h // (n_head / n_kv_head): compared at MHA and MQA, where both agree"))),
    "fox_pro": Row(VARIANT, "Lin et al. 2025 (Forgetting Transformer, the Pro block), arXiv:2503.02130", (
        Check("the Pro layer of the authors' code (zhixuan-lin/forgetting-transformer), in float64",
              "attention layer output, MHA, the gate, norms and shift away from their starts", fox_pro_paper,
              SPREAD_LAYER, "the authors' code is not packaged; their MLP at 3.5 d_model is left out"),)),
    "stick_breaking": Row(VARIANT, "Tan et al. 2025, arXiv:2410.17980", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE, ALiBi and a window of 5, MHA, GQA "
              "and MQA", stick_breaking_paper, SPREAD_LAYER,
              NOT_PACKAGED.format("shawntan/stickbreaking-attention, a Triton kernel")),)),
    "sigmoid": Row(VARIANT, "Ramapuram et al. 2024, arXiv:2409.04431", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE and ALiBi, MHA, GQA and MQA",
              sigmoid_paper, SPREAD_LAYER,
              "the paper's b = -log n takes n as the sequence length, nanoattn as max_seq_len: compared at "
              "inputs of max_seq_len tokens, where both are 12"),
        Check("x_transformers.Attend(sigmoid=True)", "each head's output, MHA and MQA",
              sigmoid_x_transformers, SPREAD_LAYER,
              "x-transformers adds no b of its own: b = -log n given as its attn_bias. Its query head h "
              "reads K/V head h mod n_kv_head, nanoattn's h // (n_head / n_kv_head): compared at MHA and "
              "MQA, where both agree"))),
    "selective": Row(VARIANT, "Leviathan et al. 2024, arXiv:2410.02703", (
        Check("x_transformers.attend.selective_attn", "the bias -F, 4 heads, 24 tokens",
              selective_x_transformers, BIAS,
              "x-transformers recomputes every step (no cache: with cached keys it would zero another column "
              "than the first token's and never mask the cached keys); nanoattn caches F's column sums"),
        Check(WRITTEN_OUT, "attention layer output, GQA, ALiBi, 20 tokens", selective_paper, LAYER,
              "S from the logits the softmax sees, the encoding's bias included"))),
}


