"""The attention-variants lab, over seeds, as a results page.

    python scripts/attention_lab.py train=true              # train every variant at seeds 0-2, then
                                                            # perplexity at 1-16x, price, KV bytes, logits
    python scripts/attention_lab.py out=docs/results        # publish the page from existing runs

Runs go to runs/attention/<variant>/seed<k>, the page to runs/attention/attention.{md,json,png}
unless ``out`` names a folder. Every key: ``nanoattn.commands.labs.AttentionLabConfig``; mistakes
end in one ``error:`` line.
"""

from _hydra_cli import lab_command

from nanoattn.commands.labs import AttentionLabConfig, attention_lab

main = lab_command("attention_lab", AttentionLabConfig, attention_lab)

if __name__ == "__main__":
    main()
