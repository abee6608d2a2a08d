"""The checks every config and entry point shares, each raising a one-line ``ValueError``.

A message names the field (``owner.name``), the bad value and what is allowed, so a user's
mistake reads the same wherever it is caught.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NoReturn


def fail(owner: str, name: str, value: Any, allowed: str) -> NoReturn:
    raise ValueError(f"{owner}.{name}={value!r} is invalid: {allowed}")


def check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        fail(owner, name, value, "allowed: " + " | ".join(choices))


def is_int(value: Any) -> bool:
    """An int that is not a bool (YAML's true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(owner: str, name: str, value: Any) -> None:
    if not is_int(value) or value <= 0:
        fail(owner, name, value, "must be a positive integer")


def check_non_negative_int(owner: str, name: str, value: Any) -> None:
    if not is_int(value) or value < 0:
        fail(owner, name, value, "must be a non-negative integer")


# torch.manual_seed takes seeds below 2**64; training adds the rank and a multiple of the step, so a
# seed stays below 2**63 and every derived seed fits.
MAX_SEED = 2**63 - 1


def check_seed(owner: str, name: str, value: Any) -> None:
    if not is_int(value) or not 0 <= value <= MAX_SEED:
        fail(owner, name, value, "must be an integer from 0 to 2**63 - 1")


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(owner, name, value, "must be true or false")


def check_text(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        fail(owner, name, value, "must be a non-empty string")


def as_float(value: Any) -> float:
    """``value`` as a float when it is a real number (an int or a float, not a bool), else NaN, which
    fails every range check: YAML's ``true`` or a quoted ``"0.1"`` never passes as a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def check_number(owner: str, name: str, value: Any, allowed: str = "must be a positive finite number",
                 within: Callable[[float], bool] = lambda x: x > 0) -> None:
    """A finite real number (``as_float``) ``within`` its range."""
    x = as_float(value)
    if not (math.isfinite(x) and within(x)):
        fail(owner, name, value, allowed)


def largest_departure(values: Mapping[str, tuple[float, float]]) -> str:
    """Of ``values`` ({name: (value, its default)}), the name furthest above its default by ratio: the
    one to name when their product (a size) is too large."""
    return max(values, key=lambda name: values[name][0] / max(values[name][1], 1))


def from_dict(cls, values: Mapping[str, Any] | None, owner: str | None = None):
    """Build dataclass ``cls`` from a mapping, naming any unknown key in a one-line error."""
    if values is not None and not isinstance(values, Mapping):
        raise ValueError(f"{owner or cls.__name__}={values!r} is invalid: must be a mapping of its fields")
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = owner or cls.__name__
        raise ValueError(f"unknown key(s) {', '.join(where + '.' + str(k) for k in unknown)}; "
                         f"allowed: {', '.join(sorted(names))}")
    return cls(**values)


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
