"""Miss-ratio curves: replay a grid of (policy, capacity) points in parallel and plot them.

Grid points are independent, so each runs in its own worker process
(:class:`concurrent.futures.ProcessPoolExecutor`, one worker per core by default). Each worker
reads the trace once (in its initializer) and keeps it in memory for all the points it runs.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from kvtier.checks import _as_int, check_nonnegative_int, check_positive_int, counted
from kvtier.manager import MAX_BLOCKS
from kvtier.policies import get_policy
from kvtier.replay import ReplayOptions, ReplayResult, check_capacity, log_grid, replay
from kvtier.trace import TraceOptions, TraceWarning

__all__ = ["DEFAULT_POINTS", "default_grid", "plot_mrc", "run_grid"]

DEFAULT_POINTS = 12
"""Capacities in the default grid."""

_worker_trace: list | None = None
_worker_error: Exception | None = None  # why _init_worker could not read the trace


def default_grid(unique_blocks: int, points: int = DEFAULT_POINTS,
                 lo: int | None = None, hi: int | None = None) -> list[int]:
    """Capacities (blocks) spaced evenly on a log scale (:func:`kvtier.replay.log_grid`).

    Defaults: from 0.5% of the trace's distinct blocks (at least 1) to 100% of them (the
    cache that never has to evict a block it will see again), the count first capped at
    :data:`kvtier.manager.MAX_BLOCKS` (2,147,483,647, the most a tier can hold).

    Args:
        unique_blocks: the trace's distinct blocks (an int >= 0; numpy ints taken).
        points: how many capacities (>= 1; fewer come back when the range holds fewer
            distinct sizes).
        lo, hi: the smallest / largest capacity, in blocks (1 to ``MAX_BLOCKS``); ``None``
            for the defaults above.

    Raises:
        ValueError: ``unique_blocks`` negative or not an int; ``points``, ``lo`` or ``hi``
            below 1 or not an int; ``lo`` or ``hi`` above ``MAX_BLOCKS``; ``hi < lo``.
            Each names the argument, the rule and the value.
    """
    unique_blocks = check_nonnegative_int("unique_blocks", unique_blocks, "distinct blocks")
    points = check_positive_int("points", points, "capacities")
    bounds = {}
    for name, value in (("lo", lo), ("hi", hi)):
        if value is not None:
            value = check_positive_int(name, value, "blocks")
            if value > MAX_BLOCKS:
                raise ValueError(f"{name} must be at most {MAX_BLOCKS:,} blocks (the most a "
                                 f"tier can hold), got {value:,}")
        bounds[name] = value
    lo, hi = bounds["lo"], bounds["hi"]
    cacheable = min(unique_blocks, MAX_BLOCKS)  # (also keeps a huge count's float finite)
    if lo is None:
        lo = max(1, round(cacheable * 0.005))
    if hi is None:
        hi = max(lo, cacheable)
    if hi < lo:
        raise ValueError(f"hi ({counted(hi, 'block')}) must be >= lo ({counted(lo, 'block')})")
    return log_grid(lo, hi, points)


def _read(path: str, trace: TraceOptions, limit: int | None) -> list:
    """The trace's requests, only the first ``limit`` when given."""
    # a limit beyond sys.maxsize (islice's bound) is beyond any trace: no limit
    return list(itertools.islice(trace.open(path),
                                 limit if limit is None or limit <= sys.maxsize else None))


def _init_worker(path: str, trace: TraceOptions, limit: int | None = None) -> None:
    global _worker_trace, _worker_error
    try:
        with warnings.catch_warnings():  # the parent read the trace first and warned once
            warnings.simplefilter("ignore", TraceWarning)
            _worker_trace = _read(path, trace, limit)
    except Exception as exc:  # noqa: BLE001 - raised again by each point: an initializer's
        _worker_error = exc  # error only breaks the pool ("BrokenProcessPool": no cause named)


def _run_point(policy: str, capacity: int, options: ReplayOptions) -> ReplayResult:
    if _worker_error is not None:
        raise _worker_error
    if _worker_trace is None:  # _init_worker did not run: a bug, not bad input
        raise RuntimeError("sweep worker has no trace loaded")
    return replay(_worker_trace, policy, capacity, options)


def run_grid(
    path: str | os.PathLike,
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    trace: TraceOptions | None = None,
    options: ReplayOptions | None = None,
    workers: int | None = None,
    on_result: Callable[[ReplayResult], object] | None = None,
    limit: int | None = None,
) -> list[ReplayResult]:
    """Replay every (policy, capacity) of the grid on the trace at ``path``.

    Args:
        path: trace file (any format :func:`kvtier.trace.read_trace` reads).
        policies: policy names.
        capacities: tier sizes in blocks.
        workers: worker processes (default: one per core, at most one per point). ``1``
            runs in this process.
        on_result: called with each result as it finishes (for a progress bar).
        trace: how to read the file (default ``TraceOptions()``).
        options: how each point replays (default ``ReplayOptions()``).
        limit: replay only the trace's first ``limit`` requests (>= 1; default: all). Every
            worker process re-reads the file and stops there.

    Returns:
        One :class:`~kvtier.replay.ReplayResult` per point, policy-major, capacities in
        the given order.

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT); the worker processes are ended first, whenever
            it came (points running, or being handed out), and none is left behind.
        kvtier.trace.TraceFormatError: bad trace. ValueError: bad policy or argument (e.g.
            ``workers`` or ``limit`` not an int >= 1). TypeError: ``policies`` or
            ``capacities`` is a lone str or number, not a list; ``trace`` / ``options`` not a
            TraceOptions / ReplayOptions.
    """
    # numpy integers are taken as plain ints (as by replay's capacities); bools are not
    if limit is not None:
        number = _as_int(limit)
        if number is None or number < 1:
            raise ValueError(f"limit must be an int >= 1 (requests), got {limit!r}")
        limit = number
    if workers is not None:
        number = _as_int(workers)
        if number is None or number < 1:  # 0 or -3 ran in-process, 2.5 as 2 workers
            raise ValueError(f"workers must be an int >= 1 (processes) or None, got {workers!r}")
        workers = number
    for name, value, what in (("policies", policies, "policy names"),
                              ("capacities", capacities, "block counts")):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(f"{name} must be a list of {what}, not a single {value!r} (wrap it "
                            "in a list)")
    # checked here, not first in each worker process
    for name, value, kind in (("trace", trace, TraceOptions), ("options", options, ReplayOptions)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be a {kind.__name__} (or None), got "
                            f"{type(value).__name__}")
    trace = TraceOptions() if trace is None else trace
    options = ReplayOptions() if options is None else options
    # checked here too: a bad size or name failed in each worker after it read the trace,
    # naming the manager's num_blocks
    capacities = [check_capacity(c, f"capacities[{i}]") for i, c in enumerate(capacities)]
    for p in policies:
        if isinstance(p, str):
            get_policy(p)  # unknown name: ValueError naming it and the known ones
    points = [(p, c) for p in policies for c in capacities]
    if not points:
        return []
    if workers is None:
        workers = os.cpu_count() or 1
    workers = max(1, min(workers, len(points)))
    init_args = (str(path), trace, limit)
    results: dict[tuple[str, int], ReplayResult] = {}
    if workers == 1:
        requests = _read(str(path), trace, limit)
        for p, c in points:
            res = replay(requests, p, c, options)
            results[(p, c)] = res
            if on_result is not None:
                on_result(res)
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                 initargs=init_args) as pool:
            # biggest capacities first: they are the slowest, so the pool ends evenly
            order = sorted(points, key=lambda pc: -pc[1])
            # the submits inside the try too: Ctrl-C while the points were handed out (the
            # workers start at the first submit) left the pool's `with` waiting for every
            # point handed out so far to run to its end
            try:
                futures = {pool.submit(_run_point, p, c, options): (p, c) for p, c in order}
                for fut in as_completed(futures):
                    res = fut.result()
                    results[futures[fut]] = res
                    if on_result is not None:
                        on_result(res)
            except BaseException:  # Ctrl-C, or a point failed: stop the other points now
                _stop_workers(pool)
                raise
    return [results[pc] for pc in points]


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the pool's worker processes at once. Cancelling the futures is not enough: the
    points running and those already handed to a worker (the executor queues one more per
    worker) would run to their end before the pool shuts down, so Ctrl-C during a sweep of
    the full trace waited 6-13 s, and for as long as a point runs (a slow policy at a large
    size: minutes). The executor has no public way to end its workers before Python 3.14,
    hence its private ``_processes`` (pid -> Process)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(5)
        if proc.is_alive():  # SIGTERM not taken within 5 s (a loaded host): SIGKILL
            proc.kill()
            proc.join(5)


def plot_mrc(
    results: Sequence[ReplayResult],
    out: str | os.PathLike,
    *,
    title: str = "",
    unique_blocks: int | None = None,
    block_refs: int | None = None,
) -> Path:
    """Draw miss ratio (1 - block hit ratio) vs tier size, one line per policy, to an image.
    ``belady`` (the offline policy) is drawn as a black dashed line with ``x`` markers. The
    y-axis spans the curves (and the compulsory-miss floor) with a margin, above 1.0 too when
    a curve reaches it (no tick is named above 1.0), so a tier that never hits is drawn
    inside the frame, not on its top edge.

    Args:
        results: replay results (any mix of policies and capacities; at least one).
        out: image path to write; its suffix picks matplotlib's format (``.png``, ``.svg``).
        title: figure title.
        unique_blocks: the trace's distinct blocks; adds a top axis in % of them (0 or
            ``None``: no such axis).
        block_refs: the trace's block references; with ``unique_blocks`` draws the
            compulsory-miss floor ``unique_blocks / block_refs`` (an infinite cache).

    Returns:
        The path written.

    Raises:
        ValueError: ``results`` is empty, ``unique_blocks`` / ``block_refs`` is not an int
            >= 0 (nor ``None``), or matplotlib has no writer for ``out``'s suffix.
        TypeError: ``results`` is not a list of ReplayResult.
        OSError: ``out`` cannot be written. The figure is closed whatever happens.
    """
    if isinstance(results, ReplayResult) or not isinstance(results, Sequence):
        raise TypeError("results must be a non-empty list of ReplayResult, got one "
                        f"{type(results).__name__}")
    if not results:
        raise ValueError("results must be a non-empty list of ReplayResult, got none")
    for i, r in enumerate(results):
        if not isinstance(r, ReplayResult):
            raise TypeError(f"results[{i}] must be a ReplayResult, got {type(r).__name__}")
    for name, value in (("unique_blocks", unique_blocks), ("block_refs", block_refs)):
        if value is not None and (isinstance(value, bool) or _as_int(value) is None
                                  or value < 0):
            raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    # a wrapped policy ("prefix-lru") shares its base's colour and marker, dashed and
    # drawn on top, so the two stay visible when their curves coincide
    markers = "osD^v<>ph*"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bases = sorted({name.rsplit("-", 1)[-1] for name in by_policy if name != "belady"})
    for policy, rs in sorted(by_policy.items(), key=lambda kv: ("-" in kv[0], kv[0])):
        if policy == "belady":  # the offline reference: a black dashed line
            rs = sorted(rs, key=lambda r: r.capacity)
            # small markers: a single capacity makes no line (before, no belady point at all)
            ax.plot([r.capacity for r in rs], [r.miss_ratio for r in rs], color="black",
                    linestyle="--", linewidth=1.6, marker="x", markersize=4,
                    label="belady (offline)", zorder=5)
            continue
        i = bases.index(policy.rsplit("-", 1)[-1])
        wrapped = "-" in policy
        rs = sorted(rs, key=lambda r: r.capacity)
        ax.plot([r.capacity for r in rs], [r.miss_ratio for r in rs],
                color=colors[i % len(colors)], marker=markers[i % len(markers)],
                markersize=3 if wrapped else 5, markerfacecolor="white" if wrapped else None,
                linestyle=(0, (4, 2)) if wrapped else "-", linewidth=1.2 if wrapped else 1.8,
                label=policy)
    if unique_blocks and block_refs:
        floor = unique_blocks / block_refs
        ax.axhline(floor, color="grey", linestyle="--", linewidth=1,
                   label=f"compulsory misses ({floor:.3f})")
    ax.set_xscale("log")
    ax.set_xlabel("tier size (blocks)")
    ax.set_ylabel("block miss ratio")
    ys = [r.miss_ratio for r in results]
    if unique_blocks and block_refs:
        ys.append(unique_blocks / block_refs)
    if ys:
        # room above the highest curve, even at 1.0: a top limit capped at 1.0 drew a tier
        # that never hits on the frame's top spine, its markers cut in half; ticks stop at 1
        ax.set_ylim(bottom=max(0.0, min(ys) - 0.05), top=max(ys) + 0.03)
        ax.set_yticks([t for t in ax.get_yticks() if t <= 1.0 + 1e-9])
        ax.set_ylim(bottom=max(0.0, min(ys) - 0.05), top=max(ys) + 0.03)
    ax.grid(True, which="both", alpha=0.3)
    if unique_blocks:
        sec = ax.secondary_xaxis(
            "top",
            functions=(lambda x: x * 100.0 / unique_blocks,
                       lambda p: p * unique_blocks / 100.0),
        )
        sec.set_xlabel("tier size (% of distinct blocks)")
    if title:
        fig.suptitle(title, fontsize=9)
    ax.legend(fontsize=8, ncol=2 if len(by_policy) > 5 else 1)
    out = Path(out)
    try:
        fig.tight_layout()
        fig.savefig(out)
    finally:  # a failed save must not leave the figure open (pyplot keeps every one)
        plt.close(fig)
    return out
