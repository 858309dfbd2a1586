"""What a trace looks like, for sizing a KV tier: ``kvtier analyze TRACE``.

One streaming pass over the requests (memory O(distinct blocks + block references): one
position per reference for the reuse distances, see below) computes:

* **counts**: requests, block references, distinct blocks;
* **one-hit wonders**: distinct blocks referenced exactly once, and their share of the
  distinct blocks (no tier can ever hit them);
* **reuse distance** of every re-reference: the number of *distinct other* blocks referenced
  since the previous reference of the same block (Mattson et al., "Evaluation techniques for
  storage hierarchies", IBM Systems Journal 9(2), 1970: the LRU stack distance minus one). An
  LRU tier of ``C`` blocks under the ``get`` replay protocol hits a re-reference exactly when
  its reuse distance is ``< C``, so the sorted distances give LRU's whole hit-ratio curve
  (:meth:`TraceAnalysis.lru_hits`; tested equal to the replay). Computed with a Fenwick tree
  (Fenwick, "A new data structure for cumulative frequency tables", Software: Practice and
  Experience 24(3), 1994) over the positions of each block's last reference, O(log n) per
  reference (Bennett & Kruskal, "LRU stack processing", IBM J. R&D 19(4), 1975, count
  distinct references the same way);
* **prefix-sharing depth** per request: how many leading blocks of the request were already
  referenced by an earlier request (the longest shared prefix; with prefix-chained keys such
  as Mooncake's ``hash_ids`` that is the prefix an infinite tier would serve, so its sum is
  the ``prefix`` protocol's hit count at unbounded capacity; tested);
* **time between reuses** (seconds) of every re-reference whose two requests have timestamps;
* **working set over time**: distinct blocks referenced per window (``window_s`` seconds of
  arrival time when the trace has timestamps, else ``window_requests`` requests), and the
  cumulative footprint (distinct blocks so far) at each window's end (a trace shorter than
  one window is one window: its plot shows one marked point per series).

Not thread-safe; an :class:`Analyzer` is fed by one thread.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.checks import _as_int, key_list, unhashable_error
from kvtier.trace import not_a_request

__all__ = ["Analyzer", "TraceAnalysis", "analyze", "percentile", "plot_analysis"]

_PROGRESS_EVERY = 1024  # requests between progress callbacks
PERCENTILES = (50, 90, 99)
"""Percentiles reported for each distribution."""


_MAX_FLOAT = sys.float_info.max


def _float_finite(value: numbers.Real) -> bool:
    """``value`` is finite as a float (an int too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least ``p`` % of the values at or
    below it) of an ascending sequence; ``None`` when it is empty.

    Raises:
        ValueError: ``p`` not in (0, 100].
    """
    if not 0 < p <= 100:
        raise ValueError(f"percentile p must be in (0, 100], got {p!r}")
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[max(0, math.ceil(p / 100.0 * n) - 1)]


def _log2_histogram(sorted_values: Sequence[float]) -> list[dict]:
    """Counts per power-of-two bucket: ``[0, 1)``, ``[1, 2)``, ``[2, 4)``, ... (the first
    bucket holds the zeros, and of real values everything below 1), as ``[{"lo", "hi",
    "count"}, ...]`` over non-empty buckets."""
    out: list[dict] = []
    i, n = 0, len(sorted_values)
    lo = 0.0
    hi = 1.0
    while i < n:
        j = bisect_left(sorted_values, hi, i)
        if j > i:
            out.append({"lo": lo, "hi": hi, "count": j - i})
        i = j
        lo, hi = hi, hi * 2
    return out


def _summary(sorted_values: Sequence[float]) -> dict:
    n = len(sorted_values)
    out: dict = {"count": n,
                 "mean": (math.fsum(sorted_values) / n) if n else None,
                 "min": sorted_values[0] if n else None,
                 "max": sorted_values[-1] if n else None}
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(sorted_values, p)
    return out


class _Fenwick:
    """Fenwick tree of 0/1 marks over positions 1..size, grown by doubling (rebuilt in O(size)
    from the marks, so O(1) amortized per position)."""

    __slots__ = ("tree", "marks", "size")

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self.tree = [0] * (size + 1)
        self.marks = bytearray(size + 1)

    def grow(self) -> None:
        size = self.size * 2
        marks = self.marks + bytearray(size - self.size)
        tree = list(marks)
        for i in range(1, size + 1):
            j = i + (i & -i)
            if j <= size:
                tree[j] += tree[i]
        self.size, self.tree, self.marks = size, tree, marks

    def add(self, i: int, delta: int) -> None:
        self.marks[i] += delta
        tree, size = self.tree, self.size
        while i <= size:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Marks at positions 1..i."""
        tree = self.tree
        s = 0
        while i:
            s += tree[i]
            i &= i - 1
        return s


@dataclass
class TraceAnalysis:
    """The figures of one trace (see the module docstring for each definition).

    Attributes:
        requests, block_refs, distinct_blocks: counts.
        one_hit_blocks: distinct blocks referenced exactly once.
        reuse_distances: ascending, one per re-reference, in distinct blocks.
        sharing_depths: per request (trace order), leading blocks already seen, in blocks.
        request_blocks: per request, its number of blocks.
        reuse_times_s: ascending, one per re-reference with both timestamps, in seconds.
        window_unit: ``"s"`` (windows of arrival time) or ``"requests"``.
        window: window length in that unit.
        windows: per window ``{"start", "requests", "refs", "distinct", "new", "footprint"}``:
            start (s since the first timestamp, or the first request's index), blocks
            referenced, distinct blocks in the window, blocks never seen before, distinct
            blocks so far. Windows of arrival time in which no request arrived are not in
            the list (they would count 0 distinct blocks): ``empty_windows`` counts them.
        empty_windows: windows of arrival time between the first and the last request in
            which no request arrived (0 for windows in requests).
        has_timestamps: whether the analysis used timestamps: the first request had one
            (:meth:`Analyzer.result` warns about requests that differ from it).
    """

    requests: int
    block_refs: int
    distinct_blocks: int
    one_hit_blocks: int
    reuse_distances: array
    sharing_depths: array
    request_blocks: array
    reuse_times_s: array
    window_unit: str
    window: float
    windows: list[dict] = field(default_factory=list)
    has_timestamps: bool = False
    empty_windows: int = 0

    @property
    def one_hit_share(self) -> float:
        """one_hit_blocks / distinct_blocks (0.0 for an empty trace)."""
        return self.one_hit_blocks / self.distinct_blocks if self.distinct_blocks else 0.0

    @property
    def reuse_refs(self) -> int:
        """Re-references: block_refs - distinct_blocks."""
        return self.block_refs - self.distinct_blocks

    def lru_hits(self, capacity: int) -> int:
        """Hits of an LRU tier of ``capacity`` blocks under the ``get`` protocol: the
        re-references whose reuse distance is below ``capacity``. O(log n).

        Raises:
            ValueError: ``capacity`` is not an int >= 1.
        """
        number = _as_int(capacity)
        if number is None or number < 1:
            raise ValueError(f"capacity must be an int >= 1 (blocks), got {capacity!r}")
        return bisect_left(self.reuse_distances, number)

    def lru_hit_ratio(self, capacity: int) -> float:
        """:meth:`lru_hits` / block_refs."""
        return self.lru_hits(capacity) / self.block_refs if self.block_refs else 0.0

    @property
    def shared_blocks(self) -> int:
        """Sum of the sharing depths: the ``prefix`` protocol's hits with an unbounded tier."""
        return sum(self.sharing_depths)

    def to_dict(self, capacities_pct: Sequence[float] = (1, 3, 10, 30, 100)) -> dict:
        """JSON-ready summary: counts, shares, percentiles, log2 histograms, LRU's hit ratio
        at ``capacities_pct`` % of the distinct blocks, and the working-set windows."""
        depths = sorted(self.sharing_depths)
        lru = []
        for pct in capacities_pct:
            cap = max(1, round(self.distinct_blocks * pct / 100.0))
            lru.append({"capacity_pct": pct, "capacity_blocks": cap,
                        "hits": self.lru_hits(cap), "hit_ratio": self.lru_hit_ratio(cap)})
        distinct_per_window = sorted(w["distinct"] for w in self.windows)
        return {
            "requests": self.requests,
            "block_refs": self.block_refs,
            "distinct_blocks": self.distinct_blocks,
            "reuse_refs": self.reuse_refs,
            "one_hit_blocks": self.one_hit_blocks,
            "one_hit_share": self.one_hit_share,
            "reuse_distance_blocks": {**_summary(self.reuse_distances),
                                      "histogram_log2": _log2_histogram(self.reuse_distances),
                                      "lru_get_protocol": lru},
            "sharing_depth_blocks": {
                **_summary(depths),
                "requests_sharing": sum(1 for d in depths if d),
                "requests_sharing_share": (sum(1 for d in depths if d) / self.requests
                                           if self.requests else 0.0),
                "shared_blocks": self.shared_blocks,
                "shared_block_share": (self.shared_blocks / self.block_refs
                                       if self.block_refs else 0.0),
                "histogram_log2": _log2_histogram(depths),
            },
            "reuse_time_s": ({**_summary(self.reuse_times_s),
                              "histogram_log2": _log2_histogram(self.reuse_times_s)}
                             if self.has_timestamps else None),
            "working_set": {
                "window_unit": self.window_unit,
                "window": self.window,
                "windows": len(self.windows),
                "empty_windows": self.empty_windows,  # not in "windows" nor the summary
                "distinct_per_window": _summary(distinct_per_window),
                "series": self.windows,
            },
        }


class Analyzer:
    """Streaming trace analysis: :meth:`add` each request in trace order, then :meth:`result`.

    Args:
        window_s: working-set window in seconds of arrival time (traces with timestamps).
        window_requests: working-set window in requests (traces without timestamps).

    Raises:
        ValueError: a window is not positive (``window_s``: a finite number of seconds, not a
            bool).

    Thread safety: none; one analyzer per thread (it keeps the pass's running state).
    """

    def __init__(self, window_s: float = 60.0, window_requests: int = 1000) -> None:
        # numpy numbers are taken (as by the manager), kept as a plain float / int; inf
        # printed "working set per infs", an int too large for a float raised OverflowError
        if isinstance(window_s, bool) or type(window_s).__name__ == "bool_" \
                or not isinstance(window_s, numbers.Real) \
                or not 0 < window_s < math.inf or not _float_finite(window_s):
            raise ValueError(f"window_s must be a finite number > 0 (seconds), got {window_s!r}")
        requests = _as_int(window_requests)
        if requests is None or requests < 1:
            raise ValueError(f"window_requests must be an int >= 1, got {window_requests!r}")
        self.window_s = float(window_s)
        self.window_requests = requests
        self._fenwick = _Fenwick()
        self._last_pos: dict = {}   # key -> 1-based position of its last reference
        self._last_ts: dict = {}    # key -> timestamp (ms) of its last reference
        self._reused: set = set()   # keys referenced at least twice
        self._distances = array("q")
        self._times = array("d")
        self._depths = array("l")
        self._lengths = array("l")
        self._pos = 0
        self._requests = 0
        self._has_ts: bool | None = None  # decided by the first request
        self._t0 = 0.0
        self._last_arrival = -math.inf  # latest timestamp so far (ms)
        self._backwards = 0  # requests stamped before an earlier request
        self._odd_stamps = 0  # requests whose timestamp presence differs from the first's
        self._first_backwards: tuple | None = None  # (request number, its ms, latest ms)
        self._win_start = 0.0
        self._win_index = 0  # the current window of time: [index, index + 1) windows from t0
        self._window_ms = self.window_s * 1000.0
        self._win: set = set()
        self._win_refs = self._win_reqs = self._win_new = 0
        self._windows: list[dict] = []
        self._empty_windows = 0  # windows of time skipped because no request arrived

    def add(self, keys: Sequence, timestamp: float | None = None) -> None:
        """One request: its block keys (head first) and arrival time in ms (or ``None``).
        O(len(keys) · log references).

        Raises:
            ValueError: ``timestamp`` is not a finite number (nor ``None``), or is an int
                too large for a float (309 digits or more).
            TypeError: ``keys`` is a single str/bytes or not iterable, or a key is not
                hashable. Nothing is counted then.
        """
        if type(keys) is not list and type(keys) is not tuple:  # (the usual: no copy)
            keys = key_list(keys, f"analyze: request {self._requests + 1}")
        # checked first, as the trace reader checks them: a NaN arrival dropped the
        # request's reuse times in silence, a str one failed half-way
        if timestamp is not None and not (
                type(timestamp) is float and math.isfinite(timestamp)
                or type(timestamp) is int and -_MAX_FLOAT <= timestamp <= _MAX_FLOAT
        ):  # (the usual: two tests)
            if (isinstance(timestamp, bool) or not isinstance(timestamp, numbers.Real)
                    or not _float_finite(timestamp)):
                # an int too large for a float is refused too (it raised OverflowError in
                # the window arithmetic: found by a newcomer session)
                raise ValueError(f"analyze: request {self._requests + 1}: timestamp must be "
                                 f"a finite number of ms or None, got {timestamp!r:.40}")
        try:
            hash(tuple(keys))  # every key hashable before anything is counted
        except TypeError:
            raise unhashable_error(keys, f"analyze: request {self._requests + 1}") from None
        if self._has_ts is None:
            self._has_ts = timestamp is not None
            self._t0 = float(timestamp) if timestamp is not None else 0.0
        ts = timestamp if self._has_ts else None
        if (timestamp is not None) != self._has_ts:  # warned at result()
            self._odd_stamps += 1
        if ts is not None:
            if ts < self._last_arrival:  # out of arrival order: counted, warned at result()
                self._backwards += 1
                if self._first_backwards is None:
                    self._first_backwards = (self._requests + 1, ts, self._last_arrival)
            else:
                self._last_arrival = ts
        self._window_step(ts)
        last_pos = self._last_pos
        fen = self._fenwick
        distances = self._distances
        win = self._win
        new = 0
        depth = 0
        shared = True
        pos = self._pos
        for key in keys:
            pos += 1
            if pos > fen.size:
                fen.grow()
            prev = last_pos.get(key)
            if prev is None:
                shared = False
                new += 1
            else:
                if shared:
                    depth += 1
                # marks at positions <= prev, the key's own included; every distinct key
                # seen so far has exactly one mark, all before pos
                distances.append(len(last_pos) - fen.prefix(prev))
                fen.add(prev, -1)
                self._reused.add(key)
                if ts is not None:
                    before = self._last_ts.get(key)
                    if before is not None and ts >= before:  # a reuse stamped earlier: no time
                        self._times.append((ts - before) / 1000.0)
            fen.add(pos, 1)
            last_pos[key] = pos
            if ts is not None:
                self._last_ts[key] = ts
            elif self._has_ts:
                self._last_ts.pop(key, None)  # no time for this reference: no reuse time
            win.add(key)
        self._pos = pos
        self._requests += 1
        self._depths.append(depth)
        self._lengths.append(len(keys))
        self._win_refs += len(keys)
        self._win_reqs += 1
        self._win_new += new

    def _window_step(self, ts: float | None) -> None:
        if self._has_ts:
            if ts is None:
                return  # a request without a timestamp joins the current window
            # the window's number from the first timestamp, in ms: exact for whole-ms
            # arrivals and windows (a running float sum of the windows' starts drifted
            # below the boundaries, so requests every 200 ms over 0.2 s windows shared
            # windows and left "empty" ones: found by a newcomer session)
            index = math.floor((ts - self._t0) / self._window_ms)
            if self._win_reqs and index > self._win_index:
                self._close_window()
                # the windows jumped over had no request
                self._empty_windows += index - self._win_index - 1
                self._win_index = index
                self._win_start = index * self.window_s
        elif self._win_reqs >= self.window_requests:
            self._close_window()
            self._win_start = float(self._requests)

    def _close_window(self) -> None:
        if not self._win_reqs:
            return
        self._windows.append({"start": self._win_start, "requests": self._win_reqs,
                              "refs": self._win_refs, "distinct": len(self._win),
                              "new": self._win_new, "footprint": len(self._last_pos)})
        self._win = set()
        self._win_refs = self._win_reqs = self._win_new = 0

    def result(self) -> TraceAnalysis:
        """The figures so far (closes the current window; call once, at the end).

        Warns (``UserWarning``) when timestamps go backwards: reuse times and time windows
        assume arrival order; a re-reference stamped before its previous reference gets no
        reuse time, and a request stamped before the current window joins it. Warns too when
        some requests have a timestamp and others not (the first request decides whether
        timestamps are used)."""
        if self._backwards:
            i, ts, latest = self._first_backwards  # type: ignore[misc]
            # (a count of requests, not of steps back: 5, 1, 3, 3 steps back once)
            warnings.warn(
                f"timestamps go backwards, first at request {i} (stamped {ts:g} ms, after a "
                f"request stamped {latest:g} ms); {self._backwards:,} of {self._requests:,} "
                "requests are stamped before an earlier request, and time between reuses and "
                "working-set windows assume arrival order (sort the trace by timestamp)",
                stacklevel=2)
        if self._odd_stamps:
            n, total = self._odd_stamps, self._requests
            warnings.warn(
                f"{n:,} of {total:,} requests {'has' if n == 1 else 'have'} no timestamp: "
                "their references get no "
                "time between reuses and they join the current working-set window"
                if self._has_ts else
                f"{n:,} of {total:,} requests {'has' if n == 1 else 'have'} a timestamp but "
                "the first request has "
                "none: the timestamps are ignored (no time between reuses; working-set "
                "windows in requests)", stacklevel=2)
        self._close_window()
        distances = array("q", sorted(self._distances))
        times = array("d", sorted(self._times))
        has_ts = bool(self._has_ts)
        return TraceAnalysis(
            requests=self._requests, block_refs=self._pos, distinct_blocks=len(self._last_pos),
            one_hit_blocks=len(self._last_pos) - len(self._reused),
            reuse_distances=distances, sharing_depths=self._depths,
            request_blocks=self._lengths, reuse_times_s=times,
            window_unit="s" if has_ts else "requests",
            window=self.window_s if has_ts else self.window_requests,
            windows=self._windows, has_timestamps=has_ts,
            empty_windows=self._empty_windows if has_ts else 0,
        )


def analyze(
    requests: Iterable,
    *,
    window_s: float = 60.0,
    window_requests: int = 1000,
    progress: Callable[[int], object] | None = None,
) -> TraceAnalysis:
    """Analyze a trace in one streaming pass.

    Args:
        requests: :class:`~kvtier.trace.Request` s (``.keys``, ``.timestamp`` in ms or
            ``None``) in trace order; a reader from :func:`kvtier.trace.read_trace` streams.
        window_s, window_requests: working-set window (see :class:`Analyzer`).
        progress: called with the number of requests done since the previous call, every
            1,024 requests and once at the end.

    Returns:
        A :class:`TraceAnalysis`.

    Raises:
        ValueError: a bad window, or a timestamp that is not a finite number (nor
            ``None``). kvtier.trace.TraceFormatError: from a trace reader.
        TypeError: a request has no ``.keys`` / ``.timestamp`` (e.g. a bare list of keys), or
            an unhashable key (the message names the request and the key).
    """
    an = Analyzer(window_s=window_s, window_requests=window_requests)
    add = an.add
    n = 0
    req = None
    try:  # free when nothing raises (3.11+); a bare key list gets replay()'s clear TypeError
        for req in requests:
            add(req.keys, req.timestamp)
            n += 1
            if progress is not None and not n % _PROGRESS_EVERY:
                progress(_PROGRESS_EVERY)
    except AttributeError as exc:
        error = not_a_request(exc, req, n, ("keys", "timestamp"), "analyze")
        if error is None:
            raise
        raise error from None
    if progress is not None and n % _PROGRESS_EVERY:
        progress(n % _PROGRESS_EVERY)
    return an.result()


def _hist_axes(ax, sorted_values, xlabel: str, title: str, first_bar: str = "zeros") -> None:
    """Log2-bucket histogram; log x and log y when the values span decades. ``first_bar``
    names what bucket [0, 1) holds in the x label: the zeros of integer data, everything
    below 1 of real-valued data."""
    hist = _log2_histogram(sorted_values)
    if not hist:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=9)
        return
    # bucket [0, 1) is drawn at [0.5, 1) so a log axis can show it
    lefts = [h["lo"] if h["lo"] > 0 else 0.5 for h in hist]
    widths = [h["hi"] - left for h, left in zip(hist, lefts, strict=True)]
    counts = [h["count"] for h in hist]
    ax.bar(lefts, counts, width=widths, align="edge", edgecolor="black", linewidth=0.4)
    if hist[-1]["hi"] / lefts[0] >= 100:
        ax.set_xscale("log", base=10)
    if max(counts) / min(counts) >= 100:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel + (f"  (bar at 0.5-1: {first_bar})" if hist[0]["lo"] == 0 else ""))
    ax.set_ylabel("count")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)


_MARKED_WINDOWS = 50
"""The working-set panel marks each window's point when the trace has fewer windows than
this (one window is one point per series, invisible as a line alone)."""


def plot_analysis(result: TraceAnalysis, out: str | os.PathLike, *, title: str = "") -> Path:
    """Draw the distributions to an image (PNG by default; the suffix picks the format).

    Four panels: reuse distance (log2 histogram, with LRU's ``get``-protocol hit ratio vs
    capacity on a second axis), prefix-sharing depth, time between reuses (or a note when the
    trace has no timestamps) and the working set per window with the cumulative footprint
    (each window's point marked when there are fewer than 50 windows, so a trace that fits
    one window still shows its point). Log axes where a distribution spans two decades or more.

    Returns:
        The path written.

    Raises:
        TypeError: ``result`` is not a :class:`TraceAnalysis`.
        ValueError: matplotlib has no writer for ``out``'s suffix.
        OSError: the file cannot be written. The figure is closed whatever happens.
    """
    if not isinstance(result, TraceAnalysis):
        raise TypeError("result must be a TraceAnalysis (from analyze() or "
                        f"Analyzer.result()), got {type(result).__name__}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), dpi=110)
    try:  # a failed draw or save must not leave the figure open (pyplot keeps every one)
        return _draw_analysis(fig, axes, result, out, title)
    finally:
        plt.close(fig)


def _draw_analysis(fig: Any, axes: Any, result: TraceAnalysis, out: str | os.PathLike,
                   title: str) -> Path:
    ax = axes[0][0]
    _hist_axes(ax, result.reuse_distances, "reuse distance (distinct blocks)",
               "reuse distance")
    if len(result.reuse_distances) and result.block_refs:
        caps = sorted({max(1, round(result.distinct_blocks * f))
                       for f in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)})
        twin = ax.twinx()
        twin.plot(caps, [result.lru_hit_ratio(c) for c in caps], color="C3", marker="o",
                  markersize=3, label="LRU hit ratio (get) at capacity x")
        twin.set_ylabel("LRU hit ratio", color="C3")
        twin.set_ylim(0, 1)
        twin.legend(fontsize=7, loc="upper left")
    _hist_axes(axes[0][1], sorted(result.sharing_depths), "leading blocks shared with "
               "earlier requests", "prefix-sharing depth per request")
    ax = axes[1][0]
    if result.has_timestamps:
        _hist_axes(ax, result.reuse_times_s, "time between reuses (s)", "time between reuses",
                   first_bar="under 1 s, zeros included")  # seconds: not only zeros there
    else:
        ax.text(0.5, 0.5, "no timestamps in this trace", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_title("time between reuses", fontsize=9)
    ax = axes[1][1]
    xs = [w["start"] for w in result.windows]
    # points as markers when there are few: a trace of one window is one point per series,
    # which a line alone does not draw (the panel was empty)
    style = {"marker": "o", "markersize": 3} if len(xs) < _MARKED_WINDOWS else {}
    ax.plot(xs, [w["distinct"] for w in result.windows], label="distinct blocks per window",
            **style)
    ax.plot(xs, [w["new"] for w in result.windows], label="new blocks per window", **style)
    ax.plot(xs, [w["footprint"] for w in result.windows], label="footprint (distinct so far)",
            **style)
    unit = "s" if result.window_unit == "s" else "requests"
    ax.set_xlabel(f"window start ({unit})")
    ax.set_ylabel("blocks")
    vals = [w["footprint"] for w in result.windows] + [w["new"] for w in result.windows]
    if vals and min(v for v in vals if v >= 0) >= 1 and max(vals) / max(1, min(vals)) >= 100:
        ax.set_yscale("log")
    ax.set_title(f"working set over time ({result.window:g} {unit} windows)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out)
    return out
