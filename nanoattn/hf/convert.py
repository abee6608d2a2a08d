"""Reading and writing transformers model folders: ``export_hf``, ``import_hf``, ``load_hf_tokenizer``.

Design:
- Neither direction imports transformers (a dev dependency the tests use as the reference):
  ``config.json`` and safetensors are read and written directly, so import works offline from
  a local folder. What maps to what is ``formats``' business; this module moves files.
- Tied embeddings are stored once, as ``save_pretrained`` does; on import a stored
  ``lm_head.weight`` must then equal the embedding.
- Export never overwrites: ``out_dir`` must be new or empty.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from nanoattn.config import ModelConfig
from nanoattn.data.tokenizer import EOT
from nanoattn.hf.formats import Family, family_for, read_hf_config
from nanoattn.model import GPT, meta_model

# Buffers some transformers versions saved with the weights; they are recomputed, never read.
_IGNORED_TENSORS = re.compile(r"(\.attn\.(masked_)?bias|rotary_emb\.inv_freq)$")


# ----------------------------------------------------------------------------- export


def export_hf(model: GPT, out_dir: str | Path, tokenizer: Tokenizer | None = None) -> Path:
    """Write ``model`` as a transformers folder in the format ``formats.family_for`` picks.

    ``tokenizer`` (a ``tokenizers.Tokenizer``) adds ``tokenizer.json`` and a minimal
    ``tokenizer_config.json`` so ``AutoTokenizer.from_pretrained(out_dir)`` works; its
    ``<|endoftext|>`` becomes the end-of-sequence token. ``out_dir`` must be new or empty.
    """
    cfg = model.cfg
    family = family_for(cfg)
    config = family.to_config(cfg)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"export_hf: {str(out)!r} exists and is not an empty folder; choose a new one "
                         f"(nothing is overwritten)")
    eos = None
    if tokenizer is not None:
        if tokenizer.get_vocab_size() > cfg.vocab_size:
            raise ValueError(f"export_hf: the tokenizer has {tokenizer.get_vocab_size()} tokens, more than "
                             f"model.vocab_size={cfg.vocab_size}")
        eos = tokenizer.token_to_id(EOT)
    dtype = next(model.parameters()).dtype
    config = {"architectures": [family.architecture], "model_type": family.model_type, **config,
              # Explicit ids: transformers' defaults (Llama 1/2, GPT-2 50256) would end generation early.
              "bos_token_id": None, "eos_token_id": eos, "pad_token_id": None,
              "dtype": str(dtype).removeprefix("torch."), "use_cache": True}

    state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
    tensors = {}
    for rule in family.rules(cfg):
        tensor = torch.cat([state[name] for name in (rule.ours, *rule.also)]) - rule.offset
        if rule.order is not None:  # their row i is our row order[i] (Llama 4's interleaved RoPE pairs)
            tensor = tensor[torch.tensor(rule.order)]
        pieces = tensor.split(list(rule.split), dim=0) if rule.split else (tensor,)  # row blocks of ours
        for name, piece in zip(rule.theirs, pieces, strict=True):
            tensors[name] = (piece.T if rule.transpose else piece).contiguous()

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})  # transformers checks "format"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(out / "tokenizer.json"))
        special = {} if eos is None else {"eos_token": tokenizer.id_to_token(eos)}
        (out / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **special}, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------- import


def _read_config(path: Path) -> tuple[Family, ModelConfig]:
    """The family and the equivalent ModelConfig of a folder's config.json."""
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"{path}: no config.json (not a transformers model folder)")
    try:
        hf = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is unreadable or not JSON: {e}") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{file} is not a transformers config (a JSON object)")
    return read_hf_config(hf, str(file))


def _shard_files(index: Path) -> list[Path]:
    """The shards a ``model.safetensors.index.json`` names, each a plain file inside its folder."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{index} is unreadable or not a JSON object: {e}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: weight_map must map tensor names to shard file names")
    folder = index.parent.resolve()
    files = []
    for name in sorted(set(weight_map.values())):
        file = index.parent / name
        if Path(name).name != name or file.is_symlink() or file.resolve().parent != folder:
            raise ValueError(f"{index} names {name!r}: shards must be files inside {index.parent}")
        files.append(file)
    return files


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a single or sharded safetensors checkpoint."""
    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif index.is_file():
        files = _shard_files(index)
    else:
        found = sorted(p.name for p in path.glob("*.bin"))
        hint = f" (found {', '.join(found)}; re-save with save_pretrained)" if found else ""
        raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{file} is corrupt or unreadable: {e}") from None
    # Floating weights only: upcasting those to float32 is exact, an integer tensor is not a weight.
    integer = next((name for name, t in tensors.items() if not t.is_floating_point()), None)
    if integer is not None:
        raise ValueError(f"{path}: {integer} is {tensors[integer].dtype}: weights must be floating point")
    return tensors


def import_hf(path: str | Path, *, device: str | torch.device = "cpu") -> GPT:
    """A nanoattn GPT (float32, eval mode) from a local transformers folder of a format in
    ``formats.FAMILIES``."""
    path = Path(path)
    family, cfg = _read_config(path)
    try:  # config.json's sizes are not trusted: the weights must fit before any rule or tensor is read
        meta = meta_model(cfg, device)
    except ValueError as e:
        raise ValueError(f"{path / 'config.json'}: {e}") from None
    # Older saves (the original GPT-2 upload) store the body without its prefix.
    tensors = {(k if k.startswith(family.prefix) or k == "lm_head.weight" else family.prefix + k): v
               for k, v in _read_tensors(path).items()}
    state, expected = {}, meta.state_dict()
    for rule in family.rules(cfg):
        missing = [name for name in rule.theirs if name not in tensors]
        if missing:
            raise ValueError(f"{path}: tensor {missing[0]!r} is missing from the weights")
        pieces = [tensors.pop(name) for name in rule.theirs]
        pieces = [piece.T if rule.transpose else piece for piece in pieces]
        tensor = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]  # our fused rows
        # A row count other than the rule's is a shape _check_state refuses below.
        if rule.order is not None and tensor.shape[0] == len(rule.order):
            tensor = tensor[torch.argsort(torch.tensor(rule.order))]
        tensor = tensor + rule.offset
        names = (rule.ours, *rule.also)
        rows = [expected[name].shape[0] for name in names]
        if rule.also and tensor.shape[0] == sum(rows):  # else _check_state refuses the first's shape
            state.update(zip(names, tensor.split(rows), strict=True))
        else:
            state[rule.ours] = tensor
    if cfg.tie_embeddings:
        head = tensors.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, state["tok_emb.weight"]):
            raise ValueError(f"{path}: tie_word_embeddings is true but lm_head.weight differs from "
                             f"the embedding")
        state["lm_head.weight"] = state["tok_emb.weight"]
    unknown = sorted(k for k in tensors if not _IGNORED_TENSORS.search(k))
    if unknown:
        raise ValueError(f"{path}: tensor {unknown[0]!r} ({len(unknown)} unexpected in all) has no place in "
                         f"nanoattn's {family.title} model")
    _check_state(path, meta, state)
    with torch.device(device):
        model = GPT(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.eval()


def _check_state(path: Path, meta: GPT, state: dict[str, torch.Tensor]) -> None:
    """Shapes against the model on the meta device (no memory: config.json's sizes are not trusted
    before the weights agree), then finiteness, each refused in one line."""
    expected = meta.state_dict()
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            shapes = f"{list(tensor.shape)} in the weights, {list(expected[name].shape)} in the config"
            raise ValueError(f"{path}: the weights do not match config.json: {name} has shape {shapes}")
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{path}: {name} holds NaN or infinite values")


def load_hf_tokenizer(path: str | Path) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` of a transformers folder's ``tokenizer.json``."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{path}: no tokenizer.json; transformers writes one with "
                         f"AutoTokenizer.from_pretrained(path).save_pretrained(path)")
    return Tokenizer.from_file(str(file))
