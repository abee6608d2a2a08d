from nanoattn.model.attention import Attention
from nanoattn.model.cache import KVCache, StreamingCache
from nanoattn.model.gpt import GPT, IGNORE_INDEX, Block

__all__ = ["GPT", "IGNORE_INDEX", "Block", "Attention", "KVCache", "StreamingCache"]
