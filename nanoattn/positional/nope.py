"""NoPE: no positional information at all (Kazemnejad et al. 2023, arXiv:2305.19466).

A causal decoder can still infer positions from the mask (a token sees how many tokens
precede it through the softmax normalisation), which is why NoPE language models train.
"""

from nanoattn.positional.base import PositionalEncoding


class NoPositionalEncoding(PositionalEncoding):
    def __init__(self, cfg) -> None:
        super().__init__()
