"""Per-layer layouts: a different positional encoding in different layers.

``ModelConfig.pos`` given as a list (``[rope, rope, rope, nope]``) is cycled over the layers
(``ModelConfig.layer_pos``). This covers the NoPE/RoPE interleaving of Llama 4 (iRoPE: every
4th layer NoPE) and SmolLM3, and any mix of the attention-level encodings. ``LayerLayout``
builds one instance of each encoding named, told which layers use it (an encoding with
per-layer parameters keeps a set for each of those layers), and hands each layer its own
through ``for_layer``; the attention block sees a plain encoding and never the layout.
Encodings that add to the embeddings (sinusoidal, learned) act before the first layer and are
refused here by ``ModelConfig``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from nanoattn.positional.base import PositionalEncoding


class LayerLayout(PositionalEncoding):
    def __init__(self, cfg, names: Sequence[str],
                 build: Callable[[str, tuple[int, ...]], PositionalEncoding]) -> None:
        super().__init__(cfg, range(len(names)))
        self.names = tuple(names)  # one per layer
        # Keyed by name, so checkpoints read "pos.<name>.<parameter>".
        self.encodings = nn.ModuleDict({
            name: build(name, tuple(i for i, n in enumerate(self.names) if n == name))
            for name in dict.fromkeys(self.names)})
        self.length_dependent_rotation = any(e.length_dependent_rotation for e in self.encodings.values())
        self.takes_positions = all(e.takes_positions for e in self.encodings.values())

    def reset_parameters(self) -> None:
        for encoding in self.encodings.values():
            encoding.reset_parameters()

    def for_layer(self, layer: int) -> PositionalEncoding:
        return self.encodings[self.names[layer]].for_layer(layer)

    def check_length(self, seq_len: int) -> None:
        for encoding in self.encodings.values():
            encoding.check_length(seq_len)

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        return any(e.rotation_changes(old_len, new_len) for e in self.encodings.values())
