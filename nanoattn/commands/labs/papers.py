"""The papers' claims each lab tests: data, one tuple per lab, each claim with the scale the paper
measured it at and the effect it reports, quoted from its tables and figures (``nanoattn.eval.claims``
decides each with the lab's power).

A claim's wording is what its paper says. Where a paper gives no number, its effect is None and
the claim can at most agree in direction. Claims that the cited papers do not make were removed:
a sliding window's perplexity past the training length (Mistral 7B reports none; StreamingLLM
measures windows over dense models at inference, a different thing), canon layers' perplexity (the
paper reports task and benchmark accuracies), CoPE against RoPE on counting and selective copy (its
baselines are absolute and relative embeddings, and its splits are by variables and density, not
length), and NoPE on reverse at 2x (the paper's NoPE and RoPE are both at 0 there: it is tested at
1.5x).
"""

from __future__ import annotations

import math

from nanoattn.eval.claims import Claim, Premise

# What a RoPE scaling claim rests on: a RoPE model that fails past its training length, for the scaling
# to repair (PI's rises from 7.20 to over 1,000; YaRN compares the repairs).
ROPE_EXPLODES = Premise("rope", "ppl 4x / 1x", 2.0, "plain RoPE's perplexity at 4x is more than twice its 1x "
                        "(PI's paper: from 7.20 to over 1,000)")

ALIBI_SCALE = "247M parameters, ~21B tokens (WikiText-103, 205 epochs), trained at 512, evaluated to 15,512"

EXTRAPOLATION = (
    Claim("Press et al. 2022 (ALiBi)", "ALiBi degrades less than sinusoidal from its training length to 16x",
          "ppl 16x", "alibi", "sinusoidal", degradation=True, control=True, scale=ALIBI_SCALE,
          effect=1 - (18.34 / 19.73) / (305.65 / 20.05),
          source="Table 2: 19.73 -> 18.34 against 20.05 -> 305.65 at 8,512"),
    Claim("Press et al. 2022 (ALiBi)", "ALiBi degrades less than RoPE from its training length to 16x",
          "ppl 16x", "alibi", "rope", degradation=True, scale=ALIBI_SCALE,
          effect=1 - (18.34 / 19.73) / (54.98 / 20.07),
          source="Table 2: 19.73 -> 18.34 against 20.07 -> 54.98 at 8,512"),
    Claim("Chen et al. 2023 (PI)", "zero-shot PI (x4) keeps perplexity at 4x where plain RoPE's explodes",
          "ppl 4x", "rope+linear4", "rope", degradation=True, premise=ROPE_EXPLODES,
          scale="LLaMA 7B (~1T tokens), trained at 2,048, no fine-tuning, 8,192 in a sliding window",
          effect=1 - 16.10 / 1000, source="Table 3 (step 0) against Table 1 (None): 16.10 against > 10^3"),
    Claim("Peng et al. 2023 (YaRN)", "YaRN beats PI without fine-tuning (their section 3.4; shown for the "
          "dynamic forms below 2x)", "ppl 4x", "rope+yarn4", "rope+linear4", degradation=True,
          premise=ROPE_EXPLODES,
          scale="Llama-2 7B (2T tokens), trained at 4,096, evaluated to about 7,800 on one document",
          effect=1 - 4.11 / 4.28, source="Figure 5, read off: Dynamic-YaRN 4.11 against Dynamic-PI 4.28"),
)

ATTENTION = (
    Claim("Ye et al. 2024 (Differential Transformer)", "differential attention's perplexity at the training "
          "length is below the plain block's", "ppl 1x", "diff", "plain",
          scale="1.4B parameters, 10B tokens, trained and evaluated at 2,048 (830M and up)",
          effect=1 - math.exp(3.062 - 3.087), source="Table 6: loss 3.062 against 3.087"),
    Claim("Dehghani et al. 2023; Wortsman et al. 2023 (QK-norm)", "QK-norm keeps the largest attention logit "
          "below the plain block's", "max logit", "qk_norm", "plain",
          scale="ViTs of ~8B parameters diverge without it; Wortsman et al.'s proxies from ~2.4M parameters, "
          "13B tokens, at 512", source="no logit values in numbers (their runs past 10^4 diverged)"),
    Claim("Qiu et al. 2025 (gated attention)", "the output gate's perplexity at the training length is below "
          "the plain block's", "ppl 1x", "gate", "plain",
          scale="1.7B dense, 400B tokens, trained at 4,096 (their smallest)", effect=1 - 7.404 / 7.499,
          source="the 1.7B dense table: 7.499 -> 7.404 (elementwise gate)"),
    Claim("Nakanishi 2025 (Scalable-Softmax)", "SSMax degrades less than softmax from its training length to "
          "16x", "ppl 16x", "ssmax", "plain", degradation=True,
          scale="12 layers at 768 (~0.16B), trained at 1,024, tested to 20,000 with RoPE's base x50",
          source="Figure 5, no numbers"),
    Claim("Zhai 2026 (exclusive self-attention)", "XSA's perplexity at the training length is below the "
          "plain block's", "ppl 1x", "xsa", "plain",
          scale="0.7B-2.7B parameters, ~100B tokens, trained at 2,048 (from secondary sources)",
          source="no loss values found"),
    Claim("Lin et al. 2025 (Forgetting Transformer)", "FoX without positions degrades less than the plain "
          "block with RoPE from its training length to 16x", "ppl 16x", "fox", "plain", degradation=True,
          control=True, scale="125M-760M parameters, trained at 16,384, evaluated to 65,536",
          source="length-extrapolation figure, no numbers; at 1x 7.25 against 7.49 (360M, 7.5B tokens)"),
    Claim("Tan et al. 2025 (stick-breaking)", "stick-breaking without positions degrades less than softmax "
          "with RoPE from its training length to 8x", "ppl 8x", "stick_breaking", "plain", degradation=True,
          scale="trained at 2,048, evaluated to 16,384 (8x)",
          source="length-extrapolation figure, no numbers"),
    Claim("Leviathan et al. 2024 (selective attention)", "selective attention's perplexity at the training "
          "length is below the plain block's", "ppl 1x", "selective", "plain",
          scale="~100M parameters on C4, trained at 512-2,048",
          source="stated as matching ~2x the heads; no perplexity in numbers found"),
    Claim("Gopalakrishnan et al. 2025 (PoPE)", "PoPE degrades less than RoPE from its training length to "
          "16x, without fine-tuning", "ppl 16x", "pope", "plain", degradation=True,
          scale="124M parameters, ~6.6B tokens (OpenWebText), trained at 1,024, evaluated to 10,240",
          source="Figure 2, no numbers; at 1x 21.33 against 21.55"),
)

KAZEMNEJAD_SCALE = "~107M parameters, 40K steps x 64, trained on lengths up to 20, evaluated to 40"

TASKS = (
    Claim("Kazemnejad et al. 2023 (NoPE)", "NoPE generalizes better than RoPE on copy at 2x", "exact 2x",
          "copy/nope", "copy/rope", lower_is_better=False, control=True, scale=KAZEMNEJAD_SCALE, effect=0.96,
          source="Figure 3 (Copy), read off: 0.96 against 0.00 at 40"),
    Claim("Kazemnejad et al. 2023 (NoPE)", "NoPE generalizes better than RoPE on reverse at 1.5x (at 2x both "
          "are at 0 in the paper)", "exact 1.5x", "reverse/nope", "reverse/rope", lower_is_better=False,
          scale=KAZEMNEJAD_SCALE, effect=0.25,
          source="Figure 3 (Reverse), read off: +0.80 at 1.4x, +0.25 at 1.6x"),
)

ABACUS_SCALE = ("16 layers at 1,024 (or one looped), 20M examples over every pair of lengths, 24 GPU-hours, "
                "trained on 1-20 digits, evaluated to 100")

ARITHMETIC = (
    Claim("Cho et al. 2024 (position coupling)", "coupled ids at the authors' shape generalize past the "
          "trained digits where NoPE does not, at 2x", "exact 2x", "coupling_paper", "nope",
          lower_is_better=False, control=True,
          scale="1 layer (4 heads, d_model 1,024), 100k examples, 50k steps x 1,000, trained on 1-30 digits, "
          "evaluated to 200", source="abstract: over 0.95 to 200 digits; NoPE's value not stated"),
    Claim("McLeish et al. 2024 (Abacus)", "Abacus+FIRE beats FIRE at 4x", "exact 4x", "abacus_fire", "fire",
          lower_is_better=False, scale=ABACUS_SCALE, source="heatmaps, no numbers read"),
    Claim("McLeish et al. 2024 (Abacus)", "Abacus beats NoPE at 2x", "exact 2x", "abacus", "nope",
          lower_is_better=False, scale=ABACUS_SCALE, source="heatmaps, no numbers read"),
    Claim("Ruoss et al. 2023 (randomized positions)", "randomized RoPE beats RoPE past the training length "
          "(their +0.12 is over every encoding and task, lengths 41-500 from up to 40)", "exact 2x",
          "random_rope", "rope", lower_is_better=False, effect=0.12,
          scale="5 layers at 64, 10,000 steps x 128, trained on lengths 1-40", source="abstract"),
    Claim("Zhou et al. 2023 (index hints)", "index hints beat plain NoPE past the trained digits (their "
          "measure: 10 digits past training, here 3D)", "exact 3x", "hints_nope", "nope",
          lower_is_better=False, source="Figure 1a, no numbers read"),
)
