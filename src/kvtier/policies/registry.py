"""Name -> policy class registry.

Built-in policies register themselves when :mod:`kvtier.policies` is imported. Third-party
packages add theirs through the ``kvtier.policies`` entry-point group (the entry point's name is
the policy name, its object a :class:`~kvtier.policies.base.CachePolicy` subclass), or at run
time with :func:`register_policy`.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from kvtier.policies.base import CachePolicy

ENTRY_POINT_GROUP = "kvtier.policies"

_REGISTRY: dict[str, type[CachePolicy]] = {}
_entry_points_loaded = False


def register_policy(name: str, cls: type[CachePolicy]) -> type[CachePolicy]:
    """Register ``cls`` under ``name`` and return it.

    Raises:
        TypeError: ``cls`` is not a :class:`CachePolicy` subclass.
        ValueError: ``name`` is empty or already taken by another class.
    """
    if not isinstance(cls, type) or not issubclass(cls, CachePolicy):
        raise TypeError(f"policy {name!r}: {cls!r} is not a CachePolicy subclass")
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy name must be a non-empty str, got {name!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"policy name {name!r} is already registered to {existing.__name__}")
    _REGISTRY[name] = cls
    return cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            register_policy(ep.name, ep.load())


def available_policies() -> list[str]:
    """Sorted names of every registered policy (built-in and entry points)."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get_policy(name: str) -> type[CachePolicy]:
    """Return the policy class registered as ``name``.

    Raises:
        ValueError: no policy has that name (the message lists the known names).
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        _load_entry_points()
        cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(
            f"unknown policy {name!r}; known policies: {', '.join(available_policies())}"
        )
    return cls
