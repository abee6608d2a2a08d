"""The attention-variants lab: train one run per variant, evaluate them, write docs/attention.{png,md}.

    python scripts/attention_lab.py train=true    # trains every variant (2 at a time), then
                                                  # perplexity at 1-16x, train tok/s, KV bytes/token
    python scripts/attention_lab.py               # evaluate runs already in runs/attention

Every key: ``nanoattn.commands.labs.AttentionLabConfig`` (``train``, ``workers``,
``train_overrides``, ``runs_root``, ``out_dir``, ``max_tokens``, ``batch_size``, ``dtype``,
``device``); mistakes end in one ``error:`` line.
"""

from _hydra_cli import command

from nanoattn.commands.labs import AttentionLabConfig, attention_lab

main = command("attention_lab", AttentionLabConfig, attention_lab)

if __name__ == "__main__":
    main()
