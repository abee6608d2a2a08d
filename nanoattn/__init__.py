"""nanoattn: a tiny-LLM framework for studying attention layouts and positional encodings."""

from nanoattn.checkpoint import load_checkpoint
from nanoattn.config import PRESETS, ModelConfig, preset
from nanoattn.generate import generate
from nanoattn.model import GPT, KVCache

__all__ = ["GPT", "KVCache", "generate", "load_checkpoint", "ModelConfig", "PRESETS", "preset"]
__version__ = "0.1.0"
