"""Export a checkpoint to transformers: ``python scripts/export_hf.py ckpt=<dir> out=<new dir>``.

Writes config.json, model.safetensors and the tokenizer files in the transformers format that
computes the model exactly (Llama, Phi-3, Llama 4 or GPT-2: README, "Interop with transformers"),
loadable with ``AutoModelForCausalLM.from_pretrained``.
All the work is ``nanoattn.commands.export_hf``; a user mistake (a model with no transformers
counterpart, a missing checkpoint, a misspelt key) ends in one ``error: ...`` line, not a traceback.
"""

from _hydra_cli import command

from nanoattn.commands.export_hf import ExportConfig, export

main = command("export_hf", ExportConfig, export)

if __name__ == "__main__":
    main()
