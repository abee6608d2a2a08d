"""What the scripts run: one module per command, each a typed config (the schema its script
registers with Hydra) and one function that does the command's work and prints its report.

Library functions below take tensors, models and paths; these add the plumbing of a command
line: resolving a checkpoint or run directory, default output paths, tables on stdout.
"""
