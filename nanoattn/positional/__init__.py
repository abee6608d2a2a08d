"""Registry of positional encodings: adding one is one file plus one line here."""

from nanoattn.positional.alibi import ALiBiPositionalEncoding, alibi_slopes
from nanoattn.positional.base import PositionalEncoding
from nanoattn.positional.layout import LayerLayout
from nanoattn.positional.learned import LearnedPositionalEncoding
from nanoattn.positional.nope import NoPositionalEncoding
from nanoattn.positional.rope import RotaryPositionalEncoding
from nanoattn.positional.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

REGISTRY: dict[str, type[PositionalEncoding]] = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "learned": LearnedPositionalEncoding,
    "rope": RotaryPositionalEncoding,
    "alibi": ALiBiPositionalEncoding,
    "nope": NoPositionalEncoding,
}


def build_positional(cfg) -> PositionalEncoding:
    """The model's encoding: the one named by ``cfg.pos``, or a ``LayerLayout`` when it is a list."""
    if isinstance(cfg.pos, str):
        return REGISTRY[cfg.pos](cfg, range(cfg.n_layer))
    return LayerLayout(cfg, cfg.layer_pos, lambda name, layers: REGISTRY[name](cfg, layers))


__all__ = ["REGISTRY", "LayerLayout", "PositionalEncoding", "alibi_slopes", "build_positional",
           "sinusoidal_table"]
