"""What the Hydra entry points share: dataclass schemas in the ConfigStore, and one-line errors.

- ``register_schema`` stores a dataclass's fields with their *declared* defaults (nested
  dataclasses recursively) as a plain config node. Hydra then knows every key, so a misspelt
  key fails at composition, and ``--cfg job`` lists them all. Declared defaults, not an instance's:
  ``__post_init__`` fills derived values (``n_kv_head = n_head``, ``min_lr = lr / 10``) that
  must stay derived when other keys are overridden. Values are validated by the dataclasses
  themselves when the script builds them (``RunConfig.from_dict``), each in a one-line error.
- ``run_cli`` runs a ``@hydra.main`` function and turns Hydra's composition errors (an unknown
  key, an unknown group option) into one ``error: ...`` line instead of Hydra's multi-line report.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException


def declared_defaults(cls: type) -> dict[str, Any]:
    """{field: its declared default} for dataclass ``cls``, nested dataclasses as dicts."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif dataclasses.is_dataclass(f.default_factory):
            out[f.name] = declared_defaults(f.default_factory)
        else:
            out[f.name] = f.default_factory()
    return out


_SCHEMAS: list[dict[str, Any]] = []  # what register_schema stored, to name the allowed keys in errors


def register_schema(name: str, cls: type) -> None:
    node = declared_defaults(cls)
    _SCHEMAS.append(node)
    ConfigStore.instance().store(name=name, node=node)


def _siblings(full_key: str) -> list[str]:
    """The keys a registered schema allows next to ``full_key`` (e.g. every train.* key)."""
    *parents, _ = full_key.split(".")
    for node in _SCHEMAS:
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return sorted(node)
    return []


def one_line(error: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages, folded into one line."""
    cause = error.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and "not in struct" in str(cause):
        allowed = _siblings(cause.full_key)
        return (f"unknown key {cause.full_key!r}; allowed: {', '.join(allowed)}" if allowed
                else f"unknown key {cause.full_key!r} (--cfg job lists every key)")
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if "Config search path:" in lines:  # an unknown group option: keep the options, not the paths
        lines = lines[:lines.index("Config search path:")]
    for i, line in enumerate(lines):
        if line.startswith("Available options"):
            lines = [*lines[:i], f"{line} {', '.join(lines[i + 1:])}"]
            break
    return " ".join(ln if ln.endswith((".", ":")) else ln + "." for ln in lines)


# Mappings whose keys depend on a choice (each RoPE scaling type has its own parameters), so
# they are null in the configs; ``rope_scaling.type=yarn`` then means ``+rope_scaling.type=yarn``.
OPEN_MAPPINGS = ("rope_scaling.",)


def run_cli(main: Callable[[], Any]) -> None:
    """Call a ``@hydra.main`` function; a composition error exits with one ``error:`` line."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's exceptions reach us instead of printing them
    sys.argv[1:] = ["+" + arg if arg.startswith(OPEN_MAPPINGS) else arg for arg in sys.argv[1:]]
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        sys.exit(f"error: {one_line(e)}")
