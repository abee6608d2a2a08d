"""A lab at a scale: ``scale=cpu`` (the default) trains what the published pages measure on a CPU;
``scale=gpu`` trains the same rows, seeds and claims at the GPT-2-small shape on one CUDA GPU.

- A scaled lab is the lab under another name, ``<lab>_gpu``: its runs go to ``runs/<lab>_gpu`` and its
  page is ``<lab>_gpu.{json,md}``, so a GPU page never replaces a CPU one, nor a GPU run a CPU run.
- Its runs are the lab's own training command with the scale's overrides after the row's (and the
  command's ``train_overrides`` after those, so they win): every row keeps its encoding or variant,
  at the width and depth of ``model=llama-124m`` (GPT-2 small: 12 layers, 768 wide, 12 heads), in
  bf16 with the step compiled, on ``train.device=cuda``.
- The perplexity labs (``Lab.gpu``) also train on a corpus of that scale: FineWeb-Edu's 10B-token
  sample streamed into shards (``data=hf``, ``docs/data.md``), a 32,768-token BPE, 1,024-token
  context, and ``recipe=gpu``'s batch, steps and schedule (modded-nanogpt's global batch, Muon).
  The task labs keep their data, lengths and budgets: only the model grows.
- Not run on a GPU yet: nothing here has been measured.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from nanoattn.config.options import RECIPES

if TYPE_CHECKING:
    from nanoattn.commands.labs.driver import Lab

SCALES = ("cpu", "gpu")
GPT2_SMALL = ("model.d_model=768", "model.n_layer=12", "model.n_head=12", "model.n_kv_head=12",
              "model.d_ff=2048")
ON_A_GPU = ("train.device=cuda", "train.dtype=bfloat16", "train.compile=true")
# The perplexity labs' corpus and context at the GPU scale.
WEB_CORPUS = ("data=hf", "data.hf_name=HuggingFaceFW/fineweb-edu", "data.hf_config=sample-10BT",
              "data.name=fineweb_edu_10bt", "data.val_fraction=0.001", "data.tokenizer.vocab_size=32768",
              "model.vocab_size=32768", "model.max_seq_len=1024", "train.seq_len=1024",
              *(f"train.{key}={value}" for key, value in RECIPES["gpu"]["train"].items() if key != "compile"))


def at_scale(lab: Lab, scale: str) -> Lab:
    """``lab`` at ``scale``: itself at ``cpu``; at ``gpu`` renamed ``<name>_gpu``, with the scale's
    training overrides, starting from the GPU runs of the lab it starts from."""
    if scale == "cpu":
        return lab
    return dataclasses.replace(lab, name=f"{lab.name}_{scale}", experiment=lab.experiment or lab.name,
                               scaled=(*GPT2_SMALL, *ON_A_GPU, *lab.gpu),
                               starts_from=lab.starts_from and f"{lab.starts_from}_{scale}")


def check_scale_device(scale: str, owner: str) -> None:
    """Refuse to train at ``gpu`` where no CUDA device is, before anything is trained."""
    if scale == "gpu" and not torch.cuda.is_available():
        raise ValueError(f"{owner}.scale='gpu' is invalid here: it trains on a CUDA GPU and torch sees none "
                         "(scale=cpu trains on this machine)")
