"""``decode``: decoding tokens/s with and without the KV cache, MHA/GQA/MQA, and vs transformers.

- Sampled decoding (temperature 1, ``nanoattn.generate.Decoding``) with and without the cache,
  then the same shape with every ``n_kv_head`` dividing ``n_head``, whose cache shrinks by
  ``n_head / n_kv_head``.
- Greedy ``nanoattn.generate.generate`` vs transformers' ``generate`` on the same weights and
  prompts, side by side, with the first position where their tokens differ (none expected), at
  both bench shapes: ``decode_model`` (or the checkpoint) and, unless a checkpoint is decoded,
  the train section's ``model``. With ``compile=true`` also ``generate(compile=True)``, whose
  first call (``first_call_s``: compilation, with the compile cache as found) is timed apart.
- Tokens per second counts generated tokens, prefill included. The whole sequence fits the
  model's ``max_seq_len``, so every encoding (learned included) can decode it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import torch

from nanoattn.bench.core import BenchConfig, Row, alternate, random_tokens, section, shape_text
from nanoattn.bench.twin import transformers_twin
from nanoattn.checkpoint import load_checkpoint
from nanoattn.config import ModelConfig
from nanoattn.generate import Decoding, generate
from nanoattn.model import GPT
from nanoattn.runtime import autocast, autocast_dtype


def _layout(n_head: int, n_kv_head: int) -> str:
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else f"GQA-{n_head // n_kv_head}"


def _lengths(model: ModelConfig, quick: bool) -> tuple[int, int]:
    """(prompt tokens, new tokens): a quarter and the rest of 64 tokens (quick) or 256, within the
    model's max_seq_len."""
    total = min(model.max_seq_len, 64 if quick else 256)
    return total // 4, total - total // 4


def _sampled_rate(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool,
                  cfg: BenchConfig) -> tuple[float, int]:
    """(generated tokens/s, prefill included, sampling at temperature 1; KV-cache bytes)."""
    device = prompt.device
    amp, _ = autocast_dtype(cfg.dtype, device)
    cache_bytes = 0

    def run() -> None:
        nonlocal cache_bytes
        with autocast(device, amp):
            decoding = Decoding(model, prompt, new_tokens, use_cache=use_cache,
                                generator=torch.Generator(device=device).manual_seed(0))
            for _ in decoding:
                pass
        cache_bytes = decoding.kv_cache_bytes

    seconds = alternate({"decode": run}, cfg.reps, device)["decode"]
    return prompt.shape[0] * new_tokens / seconds, cache_bytes


def _greedy_rows(model: GPT, twin: torch.nn.Module, name: str, prompt_len: int, new_tokens: int,
                 cfg: BenchConfig) -> list[Row]:
    """nanoattn.generate (eager, and compiled with ``compile=true``) vs transformers' generate
    (``twin``), greedy, on the same weights and prompts."""
    device = model.tok_emb.weight.device
    amp, _ = autocast_dtype(cfg.dtype, device)
    rows = []
    for batch in (1, 8):
        prompt = random_tokens(model.cfg.vocab_size, (batch, prompt_len), device)  # [batch, prompt_len]
        mask = torch.ones_like(prompt)
        out: dict[str, torch.Tensor] = {}

        def ours(compile: bool, prompt=prompt, out=out) -> None:
            with autocast(device, amp):
                out["nanoattn" + (" compiled" if compile else "")] = generate(
                    model, prompt, new_tokens, temperature=0, compile=compile)

        def theirs(prompt=prompt, mask=mask, out=out) -> None:
            with torch.inference_mode(), autocast(device, amp):
                out["transformers"] = twin.generate(prompt, attention_mask=mask, do_sample=False,
                                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens)

        fns = {"nanoattn": lambda: ours(False), "transformers": theirs}
        first_call = {}
        if cfg.compile:  # its first call compiles, with the compile cache as found: timed on its own
            start = time.perf_counter()
            ours(True)
            first_call["nanoattn compiled"] = time.perf_counter() - start
            fns["nanoattn compiled"] = lambda: ours(True)
        seconds = alternate(fns, cfg.reps, device)
        for impl, s in seconds.items():
            differ = (out[impl] != out["transformers"]).any(dim=0).nonzero()
            first_diff = None if differ.numel() == 0 else int(differ[0]) - prompt_len
            rows.append(dict(model=name, impl=impl + " greedy", batch=batch, cache=True, prompt=prompt_len,
                             new=new_tokens, tok_per_s=batch * new_tokens / s,
                             vs_transformers=seconds["transformers"] / s,
                             same_tokens=first_diff is None, first_diff=first_diff,
                             first_call_s=first_call.get(impl)))
    return rows


@section("decode")
def decode_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Decoding tokens/s with and without the KV cache, MHA/GQA/MQA, and vs transformers' generate."""
    device = cfg.torch_device()
    if cfg.ckpt:
        model, name = load_checkpoint(cfg.ckpt, device=device).model, str(cfg.ckpt)
    else:
        torch.manual_seed(0)
        with device:
            model, name = GPT(cfg.decode_model).eval(), f"{shape_text(cfg.decode_model)} (random)"
    mc = model.cfg
    prompt_len, new_tokens = _lengths(mc, cfg.quick)
    rows = []
    for batch in (1, 8):
        prompt = random_tokens(mc.vocab_size, (batch, prompt_len), device)  # [batch, prompt_len]
        for use_cache in (True, False):
            rate, cache_bytes = _sampled_rate(model, prompt, new_tokens, use_cache, cfg)
            rows.append(dict(model=name, impl="nanoattn sampled", layout=_layout(mc.n_head, mc.n_kv_head),
                             batch=batch, cache=use_cache, prompt=prompt_len, new=new_tokens, tok_per_s=rate,
                             kv_cache_bytes=cache_bytes))
    prompt = random_tokens(mc.vocab_size, (8, prompt_len), device)  # [8, prompt_len]
    for n_kv_head in sorted((d for d in range(1, mc.n_head + 1) if mc.n_head % d == 0), reverse=True):
        torch.manual_seed(0)
        with device:
            variant = GPT(dataclasses.replace(mc, n_kv_head=n_kv_head)).eval()
        rate, cache_bytes = _sampled_rate(variant, prompt, new_tokens, True, cfg)
        rows.append(dict(model=f"same shape (random), n_kv_head={n_kv_head}", impl="nanoattn sampled",
                         layout=_layout(mc.n_head, n_kv_head), batch=8, cache=True, prompt=prompt_len,
                         new=new_tokens, tok_per_s=rate, kv_cache_bytes=cache_bytes))
    models = [(model, name)]
    if not cfg.ckpt and cfg.model != mc:  # the train section's shape too: the other bench shape
        torch.manual_seed(0)
        with device:
            models.append((GPT(cfg.model).eval(), f"{shape_text(cfg.model)} (random)"))
    for compared, compared_name in models:
        try:
            twin = transformers_twin(compared, device).eval()
        except ValueError as e:  # no transformers counterpart (nanoattn.hf says why), or no transformers
            rows.append(dict(model=compared_name, impl=f"transformers comparison skipped: {e}"))
            continue
        rows += _greedy_rows(compared, twin, compared_name, *_lengths(compared.cfg, cfg.quick), cfg)
    return rows
