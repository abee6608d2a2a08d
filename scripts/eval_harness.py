"""lm-evaluation-harness on a nanoattn checkpoint: lm-eval's own command line, with ``--model nanoattn``.

    python scripts/eval_harness.py --model nanoattn --model_args ckpt=runs/<run> --device cpu \
        --tasks hellaswag
    python scripts/eval_harness.py --model nanoattn --model_args ckpt=runs/<run> --device cpu --tasks mine \\
        --include_path my_tasks/

lm-eval finds no model class outside its package, so this script (not named lm_eval.py, which would
shadow the package) registers nanoattn's (``nanoattn.commands.harness``) and hands every argument to
lm-eval's ``cli_evaluate``; its options and output are lm-eval's (``--help``). lm-eval's ``--device``
defaults to cuda:0, refused in one line where there is none. lm-eval is in the ``dev`` extra
(``make test`` installs it).
"""

from _hydra_cli import one_line_errors
from lm_eval.__main__ import cli_evaluate

import nanoattn.commands.harness  # noqa: F401  (registers --model nanoattn)

if __name__ == "__main__":
    with one_line_errors():
        cli_evaluate()
