"""Text on top of decoding: ``TextStream`` and ``sample_text``.

- Stop *strings* are matched on decoded text (a string may span tokens, a token may hold half of
  one), and streamed text is held back while it could still be the start of a stop string or an
  incomplete UTF-8 character.
- A library, as ``nanoattn.generate``: nothing here prints or reads a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from nanoattn.generate import Decoding
from nanoattn.model import GPT


class TextStream:
    """One sample's continuation as text, cut before the first stop string.

    ``push`` takes a token and returns the text that can no longer change: the decoded text
    minus a tail that is an incomplete UTF-8 character (decoded as U+FFFD) or could still
    grow into a stop string.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.ids: list[int] = []
        self.text, self.emitted, self.done = "", 0, False

    def push(self, token: int) -> str:
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids)
        hits = [at for at in (self.text.find(s) for s in self.stop) if at >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            return self.finish()
        return self._emit(len(self.text) - self._held_back())

    def finish(self) -> str:
        self.done = True
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        held = len(self.text) - len(self.text.rstrip("\ufffd"))
        for s in self.stop:
            held = max(held, next((n for n in range(len(s) - 1, 0, -1) if self.text.endswith(s[:n])), 0))
        return held

    def _emit(self, end: int) -> str:
        piece = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return piece


def sample_text(model: GPT, tokenizer, prompt_ids: Sequence[int], max_new_tokens: int, *,
                num_samples: int = 1, stop: Sequence[str] = (),
                on_text: Callable[[int, str], None] | None = None,
                **options: Any) -> tuple[list[str], Decoding]:
    """Decode ``num_samples`` continuations of one prompt in a batch; return their texts and the Decoding.

    Each text ends before its first stop string or stop token; ``on_text(sample, piece)`` is
    called with text as soon as it is final. ``options`` go to ``Decoding``; only ids the
    tokenizer has are drawn (``vocab_limit``), since the others decode to nothing.
    """
    options.setdefault("vocab_limit", min(tokenizer.get_vocab_size(), model.cfg.vocab_size))
    idx = torch.tensor([list(prompt_ids)] * num_samples, dtype=torch.long,
                       device=model.tok_emb.weight.device)  # [num_samples, T]
    decoding = Decoding(model, idx, max_new_tokens, **options)
    streams = [TextStream(tokenizer, stop) for _ in range(num_samples)]
    for token in decoding:
        for b, (t, finished) in enumerate(zip(token.tolist(), decoding.finished.tolist(), strict=True)):
            if not streams[b].done:
                piece = streams[b].finish() if finished else streams[b].push(t)
                if piece and on_text is not None:
                    on_text(b, piece)
        if all(s.done for s in streams):
            break
    for b, s in enumerate(streams):
        piece = s.finish()
        if piece and on_text is not None:
            on_text(b, piece)
    return [s.text for s in streams], decoding
