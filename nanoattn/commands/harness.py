"""A nanoattn checkpoint as a model of lm-evaluation-harness: ``--model nanoattn``.

Importing this module registers the class with lm-eval (lm-eval finds no model outside its own
package by itself); ``scripts/eval_harness.py`` imports it, then hands over to lm-eval's command line:

    python scripts/eval_harness.py --model nanoattn --model_args ckpt=runs/<run> --tasks hellaswag

- ``loglikelihood`` is ``nanoattn.eval.choice.continuation_logprobs``, the function the project's
  own multiple-choice scorer uses, so the two agree on the same items.
- ``loglikelihood_rolling`` scores each document in windows of ``max_seq_len`` tokens, every token
  predicted once with the longest context the window allows (lm-eval's rolling windows).
- ``generate_until`` decodes greedily (``nanoattn.text.sample_text``), ``max_gen_toks`` tokens at
  most, ending the text before the first of its ``until`` strings.
"""

from __future__ import annotations

from typing import Any

from lm_eval import utils
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from nanoattn.eval.choice import continuation_logprobs, text_ids, with_start
from nanoattn.eval.runs import load_for_eval
from nanoattn.text import sample_text

DEFAULT_GEN_TOKENS = 256  # lm-eval's own default when a task sets no max_gen_toks
DEFAULT_BATCH = 32  # inputs per forward pass when lm-eval's --batch_size is auto or unset


@register_model("nanoattn")
class NanoattnLM(LM):
    """``--model_args ckpt=<run or checkpoint>[,device=cpu]``; ``--batch_size`` as lm-eval's (``auto``:
    DEFAULT_BATCH, at most ``--max_batch_size``)."""

    def __init__(self, ckpt: str, device: str | None = None, batch_size: int | str | None = None,
                 max_batch_size: int | None = None, **unused: Any) -> None:
        super().__init__()
        if unused:
            raise ValueError(f"--model_args {', '.join(sorted(unused))} are invalid for --model nanoattn: "
                             "allowed: ckpt, device")
        checkpoint, self.data = load_for_eval(ckpt, device=device or "cpu")
        self.model = checkpoint.model.eval()
        if batch_size is None or str(batch_size).startswith("auto"):
            self.batch_size = min(DEFAULT_BATCH, int(max_batch_size or DEFAULT_BATCH))
        else:
            self.batch_size = int(batch_size)
        self.eot = self.data.eot_id

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [(with_start(self.data, context), text_ids(self.data, continuation))
                 for context, continuation in (request.args for request in requests)]
        return continuation_logprobs(self.model, pairs, batch_size=self.batch_size)

    def loglikelihood_rolling(self, requests) -> list[float]:
        totals = []
        for (text,) in (request.args for request in requests):
            # The first window's context is the start token, each later one's the tokens before it.
            windows = [utils.make_disjoint_window(window) for window in utils.get_rolling_token_windows(
                token_list=text_ids(self.data, text), prefix_token=self.eot,
                max_seq_len=self.model.cfg.max_seq_len, context_len=1)]
            scored = continuation_logprobs(self.model, windows, batch_size=self.batch_size)
            totals.append(sum(logprob for logprob, _ in scored))
        return totals

    def generate_until(self, requests) -> list[str]:
        texts = []
        for context, options in (request.args for request in requests):
            until = options.get("until") or []
            stop = [until] if isinstance(until, str) else until
            limit = self.model.cfg.max_seq_len
            new = min(int(options.get("max_gen_toks", DEFAULT_GEN_TOKENS)), limit - 1)
            prompt = with_start(self.data, context)[-(limit - new):]
            (text,), _ = sample_text(self.model, self.data.tokenizer, prompt, new, temperature=0,
                                     stop=stop, stop_tokens=[self.eot])
            texts.append(text)
        return texts
