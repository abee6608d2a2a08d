"""Passkey retrieval: ``python scripts/eval_passkey.py ckpt=<checkpoint or run dir> [key=value]``.

Composes ``configs/eval_passkey.yaml`` and calls ``nanoattn.eval.run_passkey_eval``, which writes
the JSON report and its heat map; prints accuracy per length and depth. A user mistake ends in
one ``error: ...`` line.
"""

import sys
from pathlib import Path

import hydra
from _hydra_cli import guarded
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nanoattn.eval import passkey_table, run_passkey_eval
from nanoattn.eval.length import default_output
from nanoattn.eval.passkey import REPORT_STEM


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval_passkey")
def main(cfg: DictConfig) -> None:
    try:
        values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        ckpt = values.pop("ckpt")
        out = Path(values.pop("out") or default_output(ckpt, values["rope_scaling"], stem=REPORT_STEM))
        report = run_passkey_eval(ckpt, out=out, **values)
    except MissingMandatoryValue as e:
        sys.exit(f"error: {e.full_key} is required, e.g. {e.full_key}=runs/<run>")
    except ValueError as e:  # CheckpointError and DataError are ValueErrors
        sys.exit(f"error: {e}")
    print(passkey_table(report), end="")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    guarded(main)
