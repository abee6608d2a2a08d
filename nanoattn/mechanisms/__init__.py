"""Registry of attention mechanisms: adding one is one file plus one line here (and its field in
``ModelConfig``). The attention layer calls their hooks in this order (``base.Mechanism``)."""

from nanoattn.mechanisms.base import Mechanism
from nanoattn.mechanisms.exclude_self import ExcludeSelf
from nanoattn.mechanisms.output_gate import OutputGate
from nanoattn.mechanisms.output_norm import OutputNorm
from nanoattn.mechanisms.qk_norm import QKNorm
from nanoattn.mechanisms.scalable_softmax import ScalableSoftmax
from nanoattn.mechanisms.score_cap import ScoreCap
from nanoattn.mechanisms.talking_heads import TalkingHeads

REGISTRY: dict[str, type[Mechanism]] = {
    "qk_norm": QKNorm,
    "ssmax": ScalableSoftmax,
    "attn_softcap": ScoreCap,
    "talking_heads": TalkingHeads,
    "xsa": ExcludeSelf,
    "attn_output_norm": OutputNorm,
    "attn_gate": OutputGate,
}


def used_mechanisms(cfg) -> dict[str, type[Mechanism]]:
    """The mechanisms a model of ``cfg`` (a ModelConfig) uses, by name, in hook order."""
    return {name: mechanism for name, mechanism in REGISTRY.items() if mechanism.used(cfg)}


def mechanism_fields() -> tuple[str, ...]:
    """Every registered mechanism's ModelConfig fields, in registry order."""
    return tuple(field for mechanism in REGISTRY.values() for field in mechanism.fields)


__all__ = ["REGISTRY", "Mechanism", "mechanism_fields", "used_mechanisms"]
