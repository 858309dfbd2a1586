"""Argument checks shared by the manager, the policies and the replay (one wording each).

Every check raises before anything is changed and names the argument, the rule and the value.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any


def check_positive_int(name: str, value: Any, unit: str = "") -> int:
    """Return ``value`` if it is an int >= 1 (``bool`` is not accepted).

    Raises:
        ValueError: ``"<name> must be a positive int (<unit>), got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        what = f" ({unit})" if unit else ""
        raise ValueError(f"{name} must be a positive int{what}, got {value!r}")
    return value


def check_nonnegative_int(name: str, value: Any, unit: str = "") -> int:
    """Return ``value`` if it is an int >= 0 (``bool`` is not accepted).

    Raises:
        ValueError: ``"<name> must be an int >= 0 (<unit>), got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        what = f" ({unit})" if unit else ""
        raise ValueError(f"{name} must be an int >= 0{what}, got {value!r}")
    return value


def key_list(keys: Any, method: str) -> list[Hashable]:
    """``keys`` as a list (callers pass lists and tuples on directly; anything else is copied).

    Raises:
        TypeError: ``keys`` is a single str/bytes (almost always a forgotten list) or is not
            iterable.
    """
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"{method}: keys must be a list of block keys, not a single "
            f"{type(keys).__name__} {keys!r} (wrap it in a list)"
        )
    try:
        return list(keys)
    except TypeError:
        raise TypeError(f"{method}: keys must be an iterable of block keys, got {keys!r}") from None


def unhashable_error(keys: Sequence[Hashable], method: str) -> TypeError:
    """The error for a key list in which hashing failed, naming the first unhashable key."""
    for key in keys:
        try:
            hash(key)
        except TypeError:
            return TypeError(f"{method}: block key {key!r} is not hashable")
    return TypeError(f"{method}: keys must be a sequence of hashable block keys")
