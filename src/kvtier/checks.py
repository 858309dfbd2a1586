"""Argument checks shared by the manager, the policies and the replay (one wording each).

Every check raises before anything is changed and names the argument, the rule and the value.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import Any


def _as_int(value: Any) -> int | None:
    """``value`` as a plain int when it is an integer (``int``, numpy's integer types: any
    object with ``__index__``), else None; bools (``bool``, ``numpy.bool_``) are not ints."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_positive_int(name: str, value: Any, unit: str = "") -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 1: an ``int`` or an object with
    ``__index__`` such as ``numpy.int64`` (``bool`` is not accepted). Callers keep the
    returned plain ``int``.

    Raises:
        ValueError: ``"<name> must be a positive int (<unit>), got <value>"``.
    """
    number = _as_int(value)
    if number is None or number < 1:
        what = f" ({unit})" if unit else ""
        raise ValueError(f"{name} must be a positive int{what}, got {value!r}")
    return number


def check_nonnegative_int(name: str, value: Any, unit: str = "") -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 0 (as
    :func:`check_positive_int`; ``bool`` is not accepted).

    Raises:
        ValueError: ``"<name> must be an int >= 0 (<unit>), got <value>"``.
    """
    number = _as_int(value)
    if number is None or number < 0:
        what = f" ({unit})" if unit else ""
        raise ValueError(f"{name} must be an int >= 0{what}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` as a plain ``bool`` if it is a ``bool`` or ``numpy.bool_``.

    Raises:
        ValueError: ``"<name> must be a bool, got <value>"``: a flag written as ``"no"`` or
            ``"false"`` (read from a config file or a URL) would otherwise be taken as true.
    """
    if isinstance(value, bool):
        return value
    if type(value).__name__ in ("bool_", "bool"):  # numpy's (named bool_ before numpy 2)
        return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")


def check_timeout(value: Any, method: str) -> float | None:
    """A ``timeout`` argument (seconds to wait, e.g. a tier's ``flush``): ``None`` and ``inf``
    wait as long as it takes (``None``), ``0`` does not wait; numpy numbers are taken as plain
    floats.

    Raises:
        ValueError: a negative number, NaN, a bool or not a real number (``"<method>: timeout
            must be None or a number of seconds >= 0, got <value>"``): NaN and inf reached
            threading's waits, which spin (NaN) or raise ``OverflowError`` (inf), and a
            negative timeout (``flush(-1)``), which threading takes as 0, is almost always a
            sign error or a deadline already computed as passed; pass ``0`` to poll.
    """
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value)
            or value < 0):
        raise ValueError(
            f"{method}: timeout must be None or a number of seconds >= 0, got {value!r}")
    return None if value == math.inf else float(value)


def key_list(keys: Any, method: str) -> list[Hashable]:
    """``keys`` as a list (callers pass lists and tuples on directly; anything else is copied),
    for a call whose key order is its meaning (the first key most recently used, a prefix
    head first, results in key order).

    Raises:
        TypeError: ``keys`` is a single str, bytes, bytearray or memoryview (almost always a
            forgotten list: iterating it would give characters or byte values), a dict or
            other mapping (iterating it gives its keys, silently dropping its values: pass
            ``list(d)`` when the keys are meant), a set or frozenset (its order is arbitrary:
            pass a list in the request's order; :func:`key_collection` takes sets where the
            order does not matter), or is not iterable.
    """
    if isinstance(keys, (set, frozenset)):
        raise TypeError(
            f"{method}: keys must be a list of block keys in order (first key most recently "
            f"used, prefixes head first), not a {type(keys).__name__}, whose order is "
            f"arbitrary: {keys!r}"
        )
    return key_collection(keys, method)


def key_collection(keys: Any, method: str) -> list[Hashable]:
    """``keys`` as a list, for a call whose key order does not matter (releasing pins,
    completing stores): as :func:`key_list`, but a set or frozenset is taken (vLLM's
    offloading connector passes each job's keys as a set to ``complete_load`` and
    ``complete_store``).

    Raises:
        TypeError: as :func:`key_list`, sets excepted.
    """
    if type(keys) is set:  # vLLM's complete_load / complete_store, once per job: without the
        return list(keys)  # isinstance checks below (the Mapping one is an ABC check)
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"{method}: keys must be a list of block keys, not a single "
            f"{type(keys).__name__} {keys!r} (wrap it in a list)"
        )
    if isinstance(keys, Mapping):
        raise TypeError(
            f"{method}: keys must be a list of block keys, not a {type(keys).__name__} "
            f"{keys!r} (its values would be dropped; pass list(...) of it if its keys are "
            "meant)"
        )
    try:
        return list(keys)
    except TypeError:
        raise TypeError(f"{method}: keys must be an iterable of block keys, got {keys!r}") from None


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` for a message, the noun plural (``+ "s"``) unless ``n`` is 1:
    ``counted(1, "block")`` is ``"1 block"``, ``counted(1000, "block")`` ``"1,000 blocks"``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def type_phrase(value: Any) -> str:
    """``value``'s type name with its article for a message: ``"an int"``, ``"a str"``."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def unhashable_error(keys: Sequence[Hashable], method: str) -> TypeError:
    """The error for a key list in which hashing failed, naming the first unhashable key."""
    for key in keys:
        try:
            hash(key)
        except TypeError:
            return TypeError(f"{method}: block key {key!r} is not hashable")
    return TypeError(f"{method}: keys must be a sequence of hashable block keys")
