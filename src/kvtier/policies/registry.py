"""Name -> policy class registry.

Built-in policies register themselves when :mod:`kvtier.policies` is imported. Third-party
packages add theirs through the ``kvtier.policies`` entry-point group (the entry point's name is
the policy name, its object a :class:`~kvtier.policies.base.CachePolicy` subclass), or at run
time with :func:`register_policy`.

A plugin that fails to load (its module is missing or raises on import, its object is not a
``CachePolicy`` subclass) does not take the others down: it is skipped with a
:class:`PolicyPluginWarning` naming the entry point, its distribution and the error; every other
policy stays available, and asking for the broken one by name raises :class:`PolicyPluginError`
with that error. Entry points are read once per process, on the first lookup of a name that is
not built in (or the first :func:`available_policies`). The registry is meant to be filled at
start-up; registering from several threads at once is not supported.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

from kvtier.policies.base import CachePolicy

ENTRY_POINT_GROUP = "kvtier.policies"

_REGISTRY: dict[str, type[CachePolicy]] = {}
_BROKEN: dict[str, PolicyPluginError] = {}  # entry-point name -> why it did not load
_entry_points_loaded = False


class PolicyPluginWarning(RuntimeWarning):
    """A ``kvtier.policies`` entry point could not be loaded and was skipped."""


class PolicyPluginError(ValueError):
    """The policy asked for comes from a ``kvtier.policies`` entry point that failed to load.

    Attributes:
        name: the policy (entry point) name.
        target: the entry point's ``module:object``.
        dist: the distribution that declares it (``None`` when unknown).
        error: the exception loading it raised.
    """

    def __init__(self, name: str, target: str, dist: str | None, error: BaseException) -> None:
        self.name, self.target, self.dist, self.error = name, target, dist, error
        origin = f" (from distribution {dist})" if dist else ""
        super().__init__(
            f"policy plugin {name!r} = {target}{origin} could not be loaded: "
            f"{type(error).__name__}: {error}"
        )

    def __reduce__(self):  # rebuilt from its fields (e.g. sent by a sweep worker process)
        return (type(self), (self.name, self.target, self.dist, self.error))


def register_policy(name: str, cls: type[CachePolicy]) -> type[CachePolicy]:
    """Register ``cls`` under ``name`` and return it.

    Raises:
        TypeError: ``cls`` is not a :class:`CachePolicy` subclass, or leaves abstract hooks
            unimplemented (it could not be built).
        ValueError: ``name`` is empty, has a comma, whitespace or a character that does
            not print (``str.isprintable``: a control code, a zero-width space; the CLI's
            ``-p a,b`` splits on commas, and the others would break its tables), or is already
            taken by another class. A class may be registered under several names; a manager
            built from a name reports that name in its errors.
    """
    if not isinstance(cls, type) or not issubclass(cls, CachePolicy):
        raise TypeError(f"policy {name!r}: {cls!r} is not a CachePolicy subclass")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:  # building a manager with it would fail: refuse it now, by name
        raise TypeError(f"policy {name!r}: {cls.__name__} is abstract (not implemented: "
                        f"{', '.join(missing)})")
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy name must be a non-empty str, got {name!r}")
    # the CLI splits -p a,b on commas; a space breaks its tables, a control or invisible
    # character (isprintable is False for every whitespace but the space) prints as nothing
    if "," in name or " " in name or not name.isprintable():
        raise ValueError(f"policy name {name!r} cannot be chosen on the command line "
                         "(-p a,b): no comma and no whitespace (space, tab, newline), only "
                         "printable characters")
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
    try:
        found = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # noqa: BLE001 - unreadable metadata of some distribution
        warnings.warn(f"kvtier: cannot list the {ENTRY_POINT_GROUP!r} entry points "
                      f"({type(exc).__name__}: {exc}); only built-in policies are available",
                      PolicyPluginWarning, stacklevel=3)
        return
    for ep in found:
        if ep.name in _REGISTRY:
            continue
        try:
            cls = ep.load()
            register_policy(ep.name, cls)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the others
            dist = getattr(getattr(ep, "dist", None), "name", None)
            error = PolicyPluginError(ep.name, ep.value, dist, exc)
            _BROKEN[ep.name] = error
            warnings.warn(f"kvtier: {error}; skipped, the other policies are available",
                          PolicyPluginWarning, stacklevel=3)


def available_policies() -> list[str]:
    """Sorted names of every registered policy (built-in and entry points that loaded)."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get_policy(name: str) -> type[CachePolicy]:
    """Return the policy class registered as ``name``.

    Raises:
        PolicyPluginError: (a ``ValueError``) ``name`` is a plugin that failed to load; the
            message and ``.error`` give its error.
        ValueError: no policy has that name, or ``name`` is not a str (the message lists
            the known names).
    """
    if not isinstance(name, str):  # ValueError as for an unknown name (callers catch it)
        raise ValueError(  # noqa: TRY004
            f"unknown policy {name!r}: a policy name is a str; known policies: "
            f"{', '.join(available_policies())}")
    cls = _REGISTRY.get(name)
    if cls is None:
        _load_entry_points()
        cls = _REGISTRY.get(name)
    if cls is None and name in _BROKEN:
        broken = _BROKEN[name]
        raise PolicyPluginError(broken.name, broken.target, broken.dist, broken.error) \
            from broken.error
    if cls is None:
        raise ValueError(
            f"unknown policy {name!r}; known policies: {', '.join(available_policies())}"
        )
    return cls
