"""Perplexity at several lengths: ``python scripts/eval_length.py ckpt=<checkpoint or run dir> [key=value]``.

Composes ``configs/eval_length.yaml`` and calls ``nanoattn.eval.run_length_eval``, which writes
the JSON report and its plot; prints the table. A user mistake ends in one ``error: ...`` line.
"""

import sys
from pathlib import Path

import hydra
from _hydra_cli import guarded
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nanoattn.eval import markdown_table, run_length_eval
from nanoattn.eval.length import default_output, report_label


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval_length")
def main(cfg: DictConfig) -> None:
    try:
        values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        ckpt = values.pop("ckpt")
        out = Path(values.pop("out") or default_output(ckpt, values["rope_scaling"]))
        report = run_length_eval(ckpt, out=out, **values)
    except MissingMandatoryValue as e:
        sys.exit(f"error: {e.full_key} is required, e.g. {e.full_key}=runs/<run>")
    except ValueError as e:  # CheckpointError and DataError are ValueErrors
        sys.exit(f"error: {e}")
    print(markdown_table([report], [report_label(out)]), end="")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    guarded(main)
