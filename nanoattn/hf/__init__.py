"""Export to and import from transformers' Llama, Phi-3, Llama 4 (text) and GPT-2 formats.

A nanoattn model becomes a folder that ``transformers.AutoModelForCausalLM.from_pretrained``
loads (``config.json`` + ``model.safetensors``, and ``tokenizer.json`` + ``tokenizer_config.json``
when a tokenizer is given), and such a folder becomes a nanoattn ``GPT``. The mapping is exact
or refused. ``formats`` picks the family (one module each: ``llama``, ``phi3``, ``llama4``,
``gpt2``, sharing ``family`` and ``rope_params``), ``convert`` reads and writes the folders;
one layer (``nanoattn.hf``) in the declared order.
"""

from nanoattn.hf.convert import export_hf, import_hf, load_hf_tokenizer
from nanoattn.hf.formats import HF_ROPE_TYPES

__all__ = ["HF_ROPE_TYPES", "export_hf", "import_hf", "load_hf_tokenizer"]
