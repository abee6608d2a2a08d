from nanoattn.model.attention import Attention
from nanoattn.model.cache import KVCache, StreamingCache, check_streamable
from nanoattn.model.gpt import GPT, IGNORE_INDEX, Block
from nanoattn.model.memory import (
    activation_bytes,
    check_forward_fits,
    meta_model,
    parameter_count,
    weights_at_least,
)

__all__ = ["GPT", "IGNORE_INDEX", "Block", "Attention", "KVCache", "StreamingCache", "activation_bytes",
           "check_forward_fits", "check_streamable", "meta_model", "parameter_count", "weights_at_least"]
