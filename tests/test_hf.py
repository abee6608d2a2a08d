"""Export to / import from transformers' Llama and GPT-2 formats, checked against transformers.

References: transformers' own models loaded from the exported folder (logits at a length past
the original context for every RoPE scaling type, greedy ``generate``), models that
transformers itself creates and saves, and the weights and config themselves (round trip).
Every weight, norms and biases included, is perturbed away from its initial value first, so a
zero bias or a unit norm weight that is dropped or misplaced cannot hide.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from nanoattn import GPT, ModelConfig, generate
from nanoattn.checkpoint import load_checkpoint, save_checkpoint
from nanoattn.config import TokenizerConfig
from nanoattn.data.tokenizer import build_tokenizer
from nanoattn.hf import export_hf, import_hf, load_hf_tokenizer
from nanoattn.positional.rope_scaling import rope_frequencies
from nanoattn.references.fixtures import GPT2, LONG, ORIGINAL, VOCAB, model, perturb_, tokens

ROOT = Path(__file__).resolve().parents[1]
LLAMA = dict(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, n_kv_head=2, d_ff=96, max_seq_len=ORIGINAL,
             pos="rope", norm="rmsnorm", mlp="swiglu")
# Every scaling type with its transformers rope_type; ntk has none and exports as a plain base change.
SCALINGS = {
    "linear": ({"type": "linear", "factor": 2.5}, "linear"),
    "ntk": ({"type": "ntk", "factor": 3.0}, "default"),
    "dynamic": ({"type": "dynamic", "factor": 2.0}, "dynamic"),
    "yarn": ({"type": "yarn", "factor": 4.0}, "yarn"),
    "yarn-params": ({"type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0,
                     "attention_factor": 1.3, "truncate": False}, "yarn"),
    "yarn-mscale": ({"type": "yarn", "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5}, "yarn"),
    "llama3": ({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, "llama3"),
}


def load_transformers(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def assert_same_logits(ours: GPT, theirs, length: int = LONG) -> None:
    idx = tokens(length)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def assert_same_weights(a: GPT, b: GPT) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


# ----------------------------------------------------------------------------- export: logits


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_llama_export_logits_equal_transformers(tmp_path, n_kv_head, tie):
    ours = model(**{**LLAMA, "n_kv_head": n_kv_head, "tie_embeddings": tie})
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert isinstance(theirs, LlamaForCausalLM)
    assert theirs.config.num_key_value_heads == n_kv_head and theirs.config.tie_word_embeddings is tie
    assert (theirs.lm_head.weight is theirs.model.embed_tokens.weight) is tie
    assert_same_logits(ours, theirs)


def test_llama_export_with_biases_uses_attention_and_mlp_bias(tmp_path):
    ours = model(**LLAMA, bias=True)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert theirs.config.attention_bias and theirs.config.mlp_bias
    assert_same_logits(ours, theirs)


@pytest.mark.parametrize("name", SCALINGS)
def test_rope_scaling_export_logits_equal_transformers_past_the_original_context(tmp_path, name):
    scaling, rope_type = SCALINGS[name]
    ours = model(**LLAMA, rope_scaling=scaling)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert theirs.config.rope_parameters["rope_type"] == rope_type
    assert_same_logits(ours, theirs)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_gpt2_export_logits_equal_transformers(tmp_path, tie):
    ours = model(**GPT2, tie_embeddings=tie)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert isinstance(theirs, GPT2LMHeadModel)
    assert (theirs.lm_head.weight is theirs.transformer.wte.weight) is tie
    assert_same_logits(ours, theirs)


@pytest.mark.parametrize("fields", [dict(LLAMA, rope_scaling=SCALINGS["yarn"][0]), GPT2],
                         ids=["llama-yarn", "gpt2"])
def test_greedy_generation_equals_transformers_generate(tmp_path, fields):
    ours = model(**fields)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    idx, n = tokens(16), LONG - 16  # RoPE: decoding runs 2.5x past the original context
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fields", [
    dict(LLAMA, tie_embeddings=False, bias=True, dropout=0.1, norm_eps=1e-6, rope_theta=500.0, init_std=0.05),
    *(dict(LLAMA, rope_scaling=SCALINGS[name][0]) for name in SCALINGS if name != "ntk"),
    dict(LLAMA, max_seq_len=4 * ORIGINAL,
         rope_scaling={**SCALINGS["llama3"][0], "original_max_seq_len": ORIGINAL}),
    dict(GPT2, tie_embeddings=False, dropout=0.1),
    dict(GPT2, d_ff=None, n_head=2),
], ids=["llama", *(n for n in SCALINGS if n != "ntk"), "llama3-long", "gpt2-untied", "gpt2-default-ffn"])
def test_export_then_import_gives_identical_weights_and_config(tmp_path, fields):
    ours = model(**fields)
    back = import_hf(export_hf(ours, tmp_path / "hf"))
    assert back.cfg == ours.cfg
    assert_same_weights(back, ours)


def test_ntk_comes_back_as_plain_rope_with_identical_frequencies(tmp_path):
    ours = model(**LLAMA, rope_scaling=SCALINGS["ntk"][0])
    back = import_hf(export_hf(ours, tmp_path / "hf"))
    assert back.cfg.rope_scaling is None and back.cfg.rope_theta > ours.cfg.rope_theta
    inv_freq, factor = rope_frequencies(ours.cfg.head_dim, ours.cfg.rope_theta, ours.cfg.rope_scaling)
    assert torch.equal(rope_frequencies(back.cfg.head_dim, back.cfg.rope_theta, None)[0], inv_freq)
    assert factor == 1.0
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(back(idx), ours(idx))


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize("layout", ["save_pretrained", "sharded", "original-upload"])
def test_import_gpt2_created_by_transformers(tmp_path, layout):
    torch.manual_seed(0)
    theirs = perturb_(GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                                 n_positions=LONG, bos_token_id=0, eos_token_id=0)))
    theirs.save_pretrained(tmp_path, max_shard_size="100KB" if layout == "sharded" else "10GB")
    assert (tmp_path / "model.safetensors.index.json").exists() is (layout == "sharded")
    if layout == "original-upload":  # openai-community/gpt2: no "transformer." prefix, mask buffers saved
        file = tmp_path / "model.safetensors"
        tensors = {k.removeprefix("transformer."): v for k, v in load_file(file).items()}
        tensors.update({f"h.{i}.attn.bias": torch.tril(torch.ones(1, 1, LONG, LONG)) for i in range(2)})
        save_file(tensors, file, metadata={"format": "pt"})
    ours = import_hf(tmp_path)
    assert ours.cfg.pos == "learned" and ours.cfg.ffn_dim == 4 * 64 and ours.cfg.tie_embeddings
    assert_same_logits(ours, theirs)


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "legacy-rope_scaling"])
def test_import_llama_created_by_transformers(tmp_path, legacy):
    torch.manual_seed(0)
    rope = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
            "original_max_position_embeddings": ORIGINAL}
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=4 * ORIGINAL,
                         rope_parameters=rope, bos_token_id=0, eos_token_id=0)
    perturb_(LlamaForCausalLM(config)).save_pretrained(tmp_path)
    if legacy:  # transformers 4.x wrote the base and the scaling as two top-level keys
        file = tmp_path / "config.json"
        hf = json.loads(file.read_text())
        scaling = hf.pop("rope_parameters")
        hf.update(rope_theta=scaling.pop("rope_theta"), rope_scaling=scaling)
        file.write_text(json.dumps(hf))
    theirs = load_transformers(tmp_path)
    ours = import_hf(tmp_path)
    assert ours.cfg.n_kv_head == 1 and ours.cfg.rope_theta == 500.0 and not ours.cfg.tie_embeddings
    assert ours.cfg.rope_scaling["type"] == "yarn"
    assert ours.cfg.rope_scaling["original_max_seq_len"] == ORIGINAL
    assert_same_logits(ours, theirs)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_export_loads_with_auto_tokenizer(tmp_path):
    tokenizer = build_tokenizer(TokenizerConfig(type="byte"), [])  # ids 0..255 bytes, 256 <|endoftext|>
    out = export_hf(model(**{**LLAMA, "vocab_size": 260}), tmp_path / "hf", tokenizer)
    text = "Thou art more lovely, and more temperate — ünïcödé"
    theirs = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.encode(text).ids
    assert theirs(text).input_ids == ids and theirs.decode(ids) == text
    assert theirs.eos_token_id == 256 == json.loads((out / "config.json").read_text())["eos_token_id"]
    assert load_hf_tokenizer(out).encode(text).ids == ids


def test_load_hf_tokenizer_without_tokenizer_json(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_hf_tokenizer(tmp_path)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("fields, message", [
    (dict(LLAMA, pos="alibi"), "model.pos='alibi' has no transformers counterpart"),
    (dict(LLAMA, pos="sinusoidal"), "model.pos='sinusoidal' has no transformers counterpart"),
    (dict(LLAMA, pos=["rope", "alibi"]), "model.pos=['rope', 'alibi'] has no transformers counterpart"),
    (dict(LLAMA, norm="layernorm"), "model.norm='layernorm' has no counterpart in transformers' Llama"),
    (dict(LLAMA, mlp="gelu"), "model.mlp='gelu' has no counterpart in transformers' Llama"),
    (dict(GPT2, norm="rmsnorm"), "model.norm='rmsnorm' has no counterpart in transformers' GPT-2"),
    (dict(GPT2, mlp="swiglu"), "model.mlp='swiglu' has no counterpart in transformers' GPT-2"),
    (dict(GPT2, mlp="relu2"), "model.mlp='relu2' has no counterpart in transformers' GPT-2"),
    (dict(GPT2, bias=False), "model.bias=False has no counterpart in transformers' GPT-2"),
    (dict(GPT2, n_kv_head=2), "model.n_kv_head=2 has no counterpart in transformers' GPT-2"),
])
def test_export_refuses_models_without_a_counterpart(tmp_path, fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)) as error:
        export_hf(GPT(ModelConfig(**fields)), tmp_path / "hf")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "hf").exists()


def test_export_refuses_a_folder_in_use(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        export_hf(GPT(ModelConfig(**LLAMA)), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exported")
    return {name: export_hf(model(**fields), root / name) for name, fields in
            [("llama", LLAMA), ("llama-untied", dict(LLAMA, tie_embeddings=False)), ("gpt2", GPT2)]}


def edited(exported: dict[str, Path], name: str, tmp_path: Path, **changes) -> Path:
    """A copy of an exported folder with config.json keys changed (None deletes a key)."""
    path = shutil.copytree(exported[name], tmp_path / name)
    hf = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        hf[key] = value
    (path / "config.json").write_text(json.dumps(hf))
    return path


@pytest.mark.parametrize("name, changes, message", [
    ("llama", dict(model_type="bert"), "model_type='bert' is not supported; import reads .*'llama'"),
    ("llama", dict(architectures=["LlamaForSequenceClassification"]), "needs LlamaForCausalLM"),
    ("llama", dict(attention_bias=True), "attention_bias=True with mlp_bias=False is not supported"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    ("llama", dict(head_dim=32), "head_dim=32 is not supported"),
    ("llama", dict(rope_parameters={"rope_type": "longrope"}), "rope_type='longrope' has no"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5 is not supported"),
    ("llama", dict(quantization_config={"quant_method": "bitsandbytes"}), "quantized weights"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 0.5}), "factor=0.5 is invalid"),
    ("llama", dict(intermediate_size=None), "'intermediate_size' is missing"),
    ("llama", dict(num_key_value_heads=1), "the weights do not match config.json: .*attn.qkv"),
    ("gpt2", dict(activation_function="gelu"), "activation_function='gelu' is not supported"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True has no"),
    ("gpt2", dict(attn_pdrop=0.1), "differ: nanoattn has one dropout rate"),
    ("gpt2", dict(tie_word_embeddings=False), "tensor 'lm_head.weight' is missing"),
    ("llama-untied", dict(tie_word_embeddings=True), "lm_head.weight differs from the embedding"),
])
def test_import_refuses_what_nanoattn_cannot_represent(exported, tmp_path, name, changes, message):
    with pytest.raises(ValueError, match=message) as error:
        import_hf(edited(exported, name, tmp_path, **changes))
    assert "\n" not in str(error.value)


def test_import_refuses_missing_or_unknown_weights(exported, tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        import_hf(tmp_path)
    path = edited(exported, "llama", tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no model.safetensors .*found pytorch_model.bin"):
        import_hf(path)


# ----------------------------------------------------------------------------- the script


def test_export_script_writes_a_loadable_folder_and_refuses_to_write_over_it_in_one_line(tmp_path):
    """The command line's other mistakes are refused in process (tests/test_one_line_errors.py)."""
    ours = model(**LLAMA)
    save_checkpoint(tmp_path / "run" / "checkpoints", "100", ours, train_seq_len=ORIGINAL, step=100)
    script = [sys.executable, str(ROOT / "scripts" / "export_hf.py")]
    done = subprocess.run([*script, "ckpt=run", "out=hf", "rope_scaling={type: yarn, factor: 2.0}"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]  # nothing littered
    expected = load_checkpoint(tmp_path / "run", rope_scaling={"type": "yarn", "factor": 2.0}).model
    assert_same_logits(expected, load_transformers(tmp_path / "hf"))

    again = subprocess.run([*script, "ckpt=run", "out=hf"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    err = again.stderr
    assert again.returncode == 1 and err.startswith("error: export_hf: 'hf' exists and is not an empty "
                                                    "folder"), err
    assert err.count("\n") == 1 and "Traceback" not in err


# ----------------------------------------------------------------------------- untrusted folders


def test_an_index_naming_a_file_outside_its_folder_is_refused(tmp_path):
    folder = export_hf(model(**LLAMA), tmp_path / "hf")
    outside = tmp_path / "outside.safetensors"
    (folder / "model.safetensors").rename(outside)
    for name in ("../outside.safetensors", str(outside)):
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": name}}))
        with pytest.raises(ValueError, match=r"names .*: shards must be files inside"):
            import_hf(folder)
    (folder / "link.safetensors").symlink_to(outside)
    index = {"weight_map": {"x": "link.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names 'link.safetensors': shards must be files inside"):
        import_hf(folder)


def test_a_model_too_large_for_memory_in_config_json_is_refused_before_allocating(tmp_path):
    """The whole model's parameters against the machine's memory (16 GiB here), before a block is built
    or a tensor read: a vocabulary of 1e9 (256 GB) or 1e8 layers."""
    folder = export_hf(model(**LLAMA), tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    code = ("import json, pathlib, resource\nimport nanoattn.runtime\nfrom nanoattn.hf import import_hf\n"
            "nanoattn.runtime.device.memory_bytes = lambda device: 16 * 2**30\n"
            f"file = pathlib.Path({str(folder / 'config.json')!r})\n"
            f"config = json.loads({json.dumps(json.dumps(config))})\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
            "for key, value in (('vocab_size', 1_000_000_000), ('num_hidden_layers', 100_000_000)):\n"
            "    file.write_text(json.dumps({**config, key: value}))\n"
            f"    try:\n        import_hf({str(folder)!r})\n    except ValueError as e:\n        print(e)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    imported_kib, *messages, peak_kib = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                       text=True, check=True).stdout.strip().splitlines()
    file = folder / "config.json"
    assert [m.split(" is invalid: ")[0] for m in messages] == [f"{file}: model.vocab_size=1000000000",
                                                               f"{file}: model.n_layer=100000000"]
    assert all("needs at least" in m and m.endswith("more than the 16.0 GiB of cpu") for m in messages)
    # Either model is at least 256 GB; the refusals add less than 256 MiB to what the imports took.
    assert int(peak_kib) - int(imported_kib) < 256 * 1024


def test_weights_of_another_shape_than_config_json_are_refused(tmp_path):
    folder = export_hf(model(**LLAMA), tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"the weights do not match config\.json: tok_emb\.weight has shape "
                                         rf"\[{config['vocab_size'] - 1}, 64\] in the weights, "
                                         rf"\[{config['vocab_size']}, 64\] in the config"):
        import_hf(folder)


@pytest.mark.parametrize("bad", ["nan", "int64"])
def test_non_finite_or_integer_weights_are_refused(tmp_path, bad):
    folder = export_hf(model(**LLAMA), tmp_path / "hf")
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].clone()
    if bad == "nan":
        tensors[name][0, 0] = float("nan")
    else:
        tensors[name] = tensors[name].long()
    save_file(tensors, folder / "model.safetensors")
    refusal = "holds NaN or infinite values" if bad == "nan" else "is torch.int64: weights must be floating"
    with pytest.raises(ValueError, match=refusal):
        import_hf(folder)


@pytest.mark.parametrize("change,message", [
    (lambda config: [1, 2], "is not a transformers config (a JSON object)"),
    (lambda config: {**config, "hidden_size": "wide"}, "hidden_size"),
    (lambda config: {**config, "rope_scaling": [4]}, "rope_scaling"),
])
def test_a_malformed_transformers_config_is_one_line(tmp_path, change, message):
    folder = export_hf(model(**LLAMA), tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(change(config)))
    with pytest.raises(ValueError) as err:
        import_hf(folder)
    assert message in str(err.value) and "\n" not in str(err.value)
