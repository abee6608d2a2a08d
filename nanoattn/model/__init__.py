from nanoattn.model.attention import Attention
from nanoattn.model.cache import KVCache
from nanoattn.model.gpt import GPT, Block

__all__ = ["GPT", "Block", "Attention", "KVCache"]
