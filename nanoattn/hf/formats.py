"""The transformers formats nanoattn maps to exactly, and how a model or a config picks one.

Design:
- The family is chosen by the positional layout (each family's ``selects``): ``pos='rope'`` is
  Llama (p-RoPE too, as transformers' ``proportional`` RoPE), Qwen 3 with QK-norm before RoPE,
  Ministral with sliding windows,
  or Phi-3 with partial RoPE
  (``rope_fraction < 1``) or a LongRoPE scaling; a layout of RoPE and NoPE layers (Llama 4's
  iRoPE, or NoPE alone) is Llama 4; ``pos='learned'`` is GPT-2. A RoPE model with an output
  gate (``attn_gate``) is Qwen3-Next, whatever its RoPE form.
  Every other choice a family fixes is checked, and a model with no exact counterpart is refused
  with a one-line ``ValueError`` naming the field; nothing is approximated.
- On import, ``model_type`` picks the family; each reads its own keys (``llama.py``,
  ``qwen3.py``, ``qwen3_next.py``, ``ministral.py``, ``llama4.py``, ``phi3.py``, ``gpt2.py``), the
  rules they share live in ``family.py`` and RoPE's keys in ``rope_params.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import Family, plain_mechanisms
from nanoattn.hf.gpt2 import GPT2
from nanoattn.hf.llama import LLAMA
from nanoattn.hf.llama4 import LLAMA4
from nanoattn.hf.ministral import MINISTRAL
from nanoattn.hf.phi3 import PHI3
from nanoattn.hf.qwen3 import QWEN3
from nanoattn.hf.qwen3_next import QWEN3_NEXT
from nanoattn.hf.rope_params import HF_ROPE_TYPES

# Qwen3-Next first: it is chosen by the output gate, whatever the RoPE form (the others by the RoPE form).
FAMILIES = (QWEN3_NEXT, LLAMA, QWEN3, MINISTRAL, PHI3, LLAMA4, GPT2)


def family_for(cfg: ModelConfig) -> Family:
    """The format ``cfg`` exports as, or a one-line refusal naming the field with no counterpart."""
    for family in FAMILIES:
        if family.selects(cfg):
            for field, want in {**plain_mechanisms(), **family.needs}.items():
                if getattr(cfg, field) != want:
                    raise family.refuse(field, getattr(cfg, field), f"which needs {field}={want!r}")
            return family
    supported = ", ".join(f"{f.exports} ({f.title})" for f in FAMILIES)
    raise ValueError(f"model.pos={cfg.pos!r} has no transformers counterpart; export supports {supported}")


def read_hf_config(hf: Mapping[str, Any], where: str) -> tuple[Family, ModelConfig]:
    """The family and the equivalent ModelConfig of a parsed config.json, or a clear refusal."""
    model_type = hf.get("model_type")
    family = next((f for f in FAMILIES if f.model_type == model_type), None)
    if family is None:
        supported = ", ".join(f"{f.model_type!r} ({f.architecture})" for f in FAMILIES)
        raise ValueError(f"{where}: model_type={model_type!r} is not supported; import reads {supported}")
    architectures = hf.get("architectures") or [family.architecture]
    if family.architecture not in architectures:
        raise ValueError(f"{where}: architectures={architectures} is not supported: import needs "
                         f"{family.architecture} (a causal LM head)")
    if hf.get("quantization_config"):
        raise ValueError(f"{where}: quantized weights (quantization_config) are not supported")
    try:
        fields = family.from_config(hf, where)
    except TypeError as e:  # arithmetic on a value of the wrong type, e.g. a string where a number goes
        raise ValueError(f"{where}: a value has the wrong type ({e})") from None
    try:
        return family, ModelConfig.from_dict(fields)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


__all__ = ["FAMILIES", "HF_ROPE_TYPES", "Family", "family_for", "read_hf_config"]
