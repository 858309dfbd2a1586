"""Sharing one :class:`~kvtier.OffloadingManager` between threads.

The manager itself is **not thread-safe**: it is written for one thread (an engine's
scheduler loop), and two threads calling it at once can hand one slot to two keys or leave its
counts wrong (issue #12 fault 2: four threads on ``OffloadingManager(64, "lru")`` ended with
keys sharing a slot and internal ``KeyError``s). Either call it from one thread, or wrap it::

    from kvtier.threadsafe import ThreadSafeManager

    m = ThreadSafeManager(OffloadingManager(4096, "arc"))
    n = m.lookup_prefix(keys)                   # each call runs under m.lock
    with m.lock:                                # several calls that must see one state
        n = m.lookup_prefix(keys)
        slots = m.prepare_load(keys[:n])        # no other thread evicts keys[:n] in between

:class:`ThreadSafeManager` runs every public method of the manager it wraps under one
re-entrant lock (``threading.RLock``), the same design as vLLM's offloading manager, whose
callers hold its ``lock``. It forwards whatever public methods the manager has (it is not a
copy of their list), so it keeps working when the manager's methods change. It costs one lock
round trip per call; ``benchmarks/bench_threadsafe.py`` measures it (figures in
docs/manager.md, section "Threads"). It is opt-in: a plain ``OffloadingManager`` takes no lock.

What it does not make safe: the policy object (``m.policy``) and any object the manager
returns that is mutable are used outside the lock; a compound step (lookup, then load) is only
atomic inside ``with m.lock``. Without that, another thread may evict a block between
``lookup_prefix`` and ``prepare_load``, and ``prepare_load`` then raises ``BlockStateError``
(a clean error; the manager stays consistent).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from kvtier.manager import OffloadingManager

__all__ = ["ThreadSafeManager"]


_PLAIN_LOCK = type(threading.Lock())


class ThreadSafeManager:
    """Every public method of ``manager`` (an :class:`~kvtier.OffloadingManager` or anything
    with its interface) called under one lock.

    Args:
        manager: the manager to share. Do not keep calling it directly: calls that bypass the
            wrapper take no lock.
        lock: the lock to use (default: a new ``threading.RLock``). It must be re-entrant:
            callers hold it across several calls (``with m.lock: ...``), and a plain
            ``threading.Lock`` (or a semaphore) would deadlock there at the first call, so
            it is refused.

    Attributes:
        lock: the lock every call takes; hold it to make several calls atomic.
        manager: the wrapped manager.

    Public attributes that are not methods (``num_blocks``, ``policy``, ...) are read through
    as they are, and setting (or deleting) one (``m.enable_events = True``) sets it on the
    manager, under the lock. Names starting with ``_`` are not forwarded (``AttributeError``):
    internal state read without the lock is what this class exists to prevent. ``manager``
    and ``lock`` are set once, by the constructor (``AttributeError`` on a later assignment
    or ``del``: the forwarded methods keep the lock they were made with).

    Raises:
        TypeError: ``manager`` is itself a :class:`ThreadSafeManager` (a second lock around
            the first: a thread holding the inner ``lock`` and calling through the outer one
            takes them in the opposite order to a caller of the outer one, a deadlock); or
            ``lock`` does not have ``__enter__``/``__exit__``, or is a plain
            (non-re-entrant) ``threading.Lock``, a ``threading.Semaphore`` /
            ``BoundedSemaphore``, or any other lock that the thread holding it cannot take
            again (tried once, without blocking, e.g. ``threading.Condition(Lock())``).
    """

    def __init__(self, manager: OffloadingManager, lock: Any = None) -> None:
        if isinstance(manager, ThreadSafeManager):
            raise TypeError(
                f"manager is already a ThreadSafeManager ({manager!r}): its calls already run "
                "under its lock, and a second wrapper would add a second lock, taken in the "
                "opposite order by whoever holds the inner one (a deadlock); share that "
                "ThreadSafeManager, or wrap its .manager to use another lock")
        if lock is None:
            lock = threading.RLock()
        elif not (hasattr(lock, "__enter__") and hasattr(lock, "__exit__")):
            raise TypeError(f"lock must be a context manager (e.g. threading.RLock), got {lock!r}")
        elif isinstance(lock, (_PLAIN_LOCK, threading.Semaphore)):
            raise TypeError(
                f"lock is a {type(lock).__name__}, which is not re-entrant: a call made inside "
                "`with m.lock:` would deadlock; pass a threading.RLock (or omit lock)")
        elif not _reentrant(lock):
            raise TypeError(
                f"lock {lock!r} is not re-entrant (the thread holding it cannot take it again): "
                "a call made inside `with m.lock:` would deadlock; pass a threading.RLock "
                "(or omit lock)")
        if not all(callable(getattr(manager, m, None)) for m in ("lookup", "prepare_store",
                                                                 "complete_store", "stats")):
            raise TypeError(
                f"ThreadSafeManager wraps an OffloadingManager (lookup, prepare_store, ...), "
                f"got {type(manager).__name__}")
        self.manager = manager
        self.lock = lock

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set on the wrapper: the first use of each method.
        if name.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__} does not forward private attribute {name!r}"
            )
        attr = getattr(self.manager, name)
        if not callable(attr):
            return attr  # plain data (num_blocks, policy, ...): read through each time
        locked = _locked(attr, self.lock)
        # cached on the instance: later calls skip __getattr__ (one dict lookup, as a method)
        self.__dict__[name] = locked
        return locked

    def __setattr__(self, name: str, value: Any) -> None:
        # a public attribute set on the wrapper would shadow the manager's: written to the
        # manager instead (under the lock), so `m.enable_events = True` does what it says
        if name in ("manager", "lock"):
            if name in self.__dict__:  # the cached methods hold the first lock and manager
                raise AttributeError(
                    f"{type(self).__name__}.{name!r} is set once, by the constructor; "
                    "wrap the other manager / lock in a new ThreadSafeManager")
            object.__setattr__(self, name, value)
        elif name.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__} does not forward private attribute {name!r}")
        else:
            self.__dict__.pop(name, None)  # a cached locked method of that name
            with self.lock:
                setattr(self.manager, name, value)

    def __delattr__(self, name: str) -> None:
        # as __setattr__: `del m.lock` then `m.lock = RLock()` got round the set-once rule
        # (the cached methods kept the first lock, so `with m.lock:` no longer excluded them)
        if name in ("manager", "lock"):
            raise AttributeError(
                f"{type(self).__name__}.{name!r} is set once, by the constructor, and cannot "
                "be deleted")
        if name.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__} does not forward private attribute {name!r}")
        self.__dict__.pop(name, None)  # a cached locked method of that name
        with self.lock:
            delattr(self.manager, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__())
                      | {n for n in dir(self.manager) if not n.startswith("_")})

    def __len__(self) -> int:
        with self.lock:
            return len(self.manager)

    def __contains__(self, key: Hashable) -> bool:
        with self.lock:
            return key in self.manager

    def __repr__(self) -> str:
        return f"ThreadSafeManager({self.manager!r})"


def _reentrant(lock: Any) -> bool:
    """False when ``lock`` is seen not to be re-entrant: taken once (without blocking), the
    same thread cannot take it again (a ``threading.Condition`` over a plain ``Lock``, a
    ``multiprocessing.Lock``). True when it can, or when it cannot be tried: no ``acquire``,
    or held by another thread right now. Leaves the lock as it found it."""
    acquire = getattr(lock, "acquire", None)
    if not callable(acquire):
        return True
    try:
        if not acquire(False):  # held elsewhere: cannot tell
            return True
    except TypeError:  # an acquire without a blocking argument
        return True
    try:
        again = acquire(False)
        if again:
            lock.release()
        return bool(again)
    finally:
        lock.release()


def _locked(method: Callable[..., Any], lock: Any) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    call.__name__ = getattr(method, "__name__", "call")
    call.__qualname__ = f"ThreadSafeManager.{call.__name__}"
    call.__doc__ = getattr(method, "__doc__", None)
    call.__wrapped__ = method  # type: ignore[attr-defined]
    return call
