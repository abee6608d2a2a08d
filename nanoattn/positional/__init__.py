"""Registry of positional encodings: adding one is one file plus one line here."""

from nanoattn.positional.alibi import ALiBiPositionalEncoding, alibi_slopes
from nanoattn.positional.base import PositionalEncoding
from nanoattn.positional.cope import CoPEPositionalEncoding
from nanoattn.positional.fire import FIREPositionalEncoding
from nanoattn.positional.kerple import KERPLELogPositionalEncoding, KERPLEPowerPositionalEncoding
from nanoattn.positional.layout import LayerLayout
from nanoattn.positional.learned import LearnedPositionalEncoding
from nanoattn.positional.nope import NoPositionalEncoding
from nanoattn.positional.pope import PolarPositionalEncoding
from nanoattn.positional.rope import RotaryPositionalEncoding
from nanoattn.positional.sinusoidal import (
    ScaledSinusoidalPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from nanoattn.positional.t5 import T5PositionalEncoding
from nanoattn.positional.xpos import XPosPositionalEncoding

REGISTRY: dict[str, type[PositionalEncoding]] = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "sinusoidal_scaled": ScaledSinusoidalPositionalEncoding,
    "learned": LearnedPositionalEncoding,
    "rope": RotaryPositionalEncoding,
    "alibi": ALiBiPositionalEncoding,
    "nope": NoPositionalEncoding,
    "t5": T5PositionalEncoding,
    "kerple_log": KERPLELogPositionalEncoding,
    "kerple_power": KERPLEPowerPositionalEncoding,
    "fire": FIREPositionalEncoding,
    "cope": CoPEPositionalEncoding,
    "xpos": XPosPositionalEncoding,
    "pope": PolarPositionalEncoding,
}


def encodings_with(capability: str) -> tuple[str, ...]:
    """The registered names whose encoding has ``capability`` (a flag of ``PositionalEncoding``, such
    as ``rotary``), for messages that list what is allowed."""
    return tuple(name for name, encoding in REGISTRY.items() if getattr(encoding, capability))


def build_positional(cfg) -> PositionalEncoding:
    """The model's encoding: the one named by ``cfg.pos``, or a ``LayerLayout`` when it is a list."""
    if isinstance(cfg.pos, str):
        return REGISTRY[cfg.pos](cfg, range(cfg.n_layer))
    return LayerLayout(cfg, cfg.layer_pos, lambda name, layers: REGISTRY[name](cfg, layers))


__all__ = ["REGISTRY", "LayerLayout", "PositionalEncoding", "alibi_slopes", "build_positional",
           "encodings_with", "sinusoidal_table"]
