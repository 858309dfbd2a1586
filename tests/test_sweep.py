"""kvtier.sweep.run_grid called as a library (the CLI's sweep is tested in test_cli.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kvtier.manager import MAX_BLOCKS
from kvtier.sweep import default_grid, run_grid
from kvtier.trace import TraceFormatError


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_trace_raises_its_trace_error_from_worker_processes_too(tmp_path, workers):
    """Found by a newcomer session: with worker processes, a missing or malformed trace made
    every worker's initializer fail, and run_grid raised "BrokenProcessPool: A process in
    the process pool was terminated abruptly" (plus a traceback per worker on stderr), where
    the docstring promises TraceFormatError (as with workers=1)."""
    with pytest.raises(TraceFormatError, match="no such file"):
        run_grid(tmp_path / "missing.jsonl", ["lru"], [10, 20], workers=workers)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 512, "hash_ids": [1]}\n{"hash_ids": "x"}\n')
    with pytest.raises(TraceFormatError, match="line 2") as err:
        run_grid(bad, ["lru"], [10, 20], workers=workers)
    assert (err.value.line, err.value.path) == (2, str(bad))


@pytest.mark.parametrize("workers", [0, -3, 2.5, True])
def test_a_bad_worker_count_is_refused(workers):
    """Found by a newcomer session: workers=0 or -3 ran in this process and 2.5 started 2
    workers, with no word."""
    from kvtier.trace import embedded_sample_path

    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        run_grid(embedded_sample_path(), ["lru"], [10], workers=workers)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("field", ["trace", "options"])
def test_trace_and_options_of_the_wrong_type_are_named(workers, field):
    """Found by newcomer10: run_grid(..., trace={}) raised AttributeError "'dict' object has
    no attribute 'open'" (in each worker process with workers > 1), while options={} was
    named, but only by the first replay."""
    from kvtier.trace import embedded_sample_path

    kind = {"trace": "TraceOptions", "options": "ReplayOptions"}[field]
    with pytest.raises(TypeError, match=rf"^{field} must be a {kind} \(or None\), got dict$"):
        run_grid(embedded_sample_path(), ["lru"], [10, 20], workers=workers, **{field: {}})


@pytest.mark.parametrize(("policies", "capacities", "name"), [
    ("lru", [10], "policies"), (["lru"], "100", "capacities"), (["lru"], 100, "capacities")])
def test_a_lone_str_or_number_is_not_a_list(policies, capacities, name):
    """Found by a newcomer session: run_grid(path, "lru", [10]) iterated the str and failed
    with "unknown policy 'l'", and capacities "100" with 'num_blocks must be a positive int,
    got '1''."""
    from kvtier.trace import embedded_sample_path

    with pytest.raises(TypeError, match=f"{name} must be a list"):
        run_grid(embedded_sample_path(), policies, capacities, workers=1)


def test_plot_mrc_refuses_bad_input_and_closes_its_figure(tmp_path):
    """Found by a newcomer session: plot_mrc([], ...) drew an empty image (matplotlib warned
    'no positive values'), unique_blocks=-5 drew a top axis in negative %, a lone
    ReplayResult raised "'ReplayResult' object is not iterable", and a failed save (no such
    folder, unknown suffix) left its figure open, one more per call (matplotlib warns past
    20 in a notebook)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvtier.replay import replay
    from kvtier.sweep import plot_mrc
    from kvtier.synthetic import generate

    trace = generate(sessions=20, seed=1)
    results = [replay(trace, "lru", c) for c in (10, 100)]
    open_before = len(plt.get_fignums())
    with pytest.raises(ValueError, match=r"results must be a non-empty list of ReplayResult"):
        plot_mrc([], tmp_path / "a.png")
    with pytest.raises(TypeError, match=r"results must be a non-empty list of ReplayResult, "
                                        r"got one ReplayResult"):
        plot_mrc(results[0], tmp_path / "a.png")
    with pytest.raises(TypeError, match=r"results\[1\] must be a ReplayResult, got int"):
        plot_mrc([results[0], 3], tmp_path / "a.png")
    for name in ("unique_blocks", "block_refs"):
        for bad in (-5, 2.5, True):
            with pytest.raises(ValueError, match=rf"{name} must be an int >= 0 or None, got "):
                plot_mrc(results, tmp_path / "a.png", **{name: bad})
    for out in (tmp_path / "no" / "a.png", tmp_path / "a.xyz"):
        with pytest.raises((OSError, ValueError)):
            plot_mrc(results, out)
    assert len(plt.get_fignums()) == open_before
    assert not (tmp_path / "a.png").exists()
    assert plot_mrc(results, tmp_path / "b.png", unique_blocks=500, block_refs=900).exists()
    assert len(plt.get_fignums()) == open_before


def test_plot_mrc_shows_belady_at_a_single_capacity(tmp_path, monkeypatch):
    """Found by a newcomer session: `kvtier sweep -p lru,belady -c 100 --plot x.png` drew
    LRU's point and a legend entry for belady, but no belady point: the offline reference was
    a dashed line without markers, and one point makes no line. It has markers now."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from kvtier.replay import replay
    from kvtier.sweep import plot_mrc
    from kvtier.synthetic import generate

    lines = {}
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        lines.update({line.get_label(): line for line in fig.axes[0].lines})
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    trace = generate(sessions=20, seed=1)
    results = [replay(trace, "lru", 100), replay(trace, "belady", 100)]
    plot_mrc(results, tmp_path / "one.png")
    belady = lines["belady (offline)"]
    assert len(belady.get_xdata()) == 1
    assert belady.get_marker() not in (None, "", " ", "None")
    assert belady.get_linestyle() == "--"


def test_plot_mrc_shows_a_curve_at_miss_ratio_one(tmp_path, monkeypatch):
    """A tier that never hits (miss ratio 1.0) drew its line on the y-axis' top limit, capped
    at 1.0: under the frame's top spine, its markers cut in half. The axis now leaves room
    above 1.0, and names no tick above it."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from kvtier.replay import replay
    from kvtier.sweep import plot_mrc
    from kvtier.trace import Request

    seen = {}
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen["ylim"] = ax.get_ylim()
        seen["ticks"] = [t.get_text() for t in ax.get_yticklabels()]
        seen["tick_values"] = list(ax.get_yticks())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    never = [Request([i, i + 1000], None, None, None) for i in range(50)]  # no reuse
    results = [replay(never, "lru", c) for c in (4, 40)]
    assert {r.miss_ratio for r in results} == {1.0}
    plot_mrc(results, tmp_path / "m.png")
    low, high = seen["ylim"]
    assert high > 1.0 and low < 1.0
    assert seen["tick_values"] and max(seen["tick_values"]) <= 1.0


def test_numpy_limit_and_workers_are_taken():
    import numpy as np

    from kvtier.trace import embedded_sample_path

    results = run_grid(embedded_sample_path(), ["lru"], [100], workers=np.int64(1),
                       limit=np.int64(5))
    assert results[0].requests == 5
    for kw in ({"limit": np.bool_(True)}, {"workers": np.int64(0)}, {"limit": 2.0}):
        with pytest.raises(ValueError, match="limit|workers"):
            run_grid(embedded_sample_path(), ["lru"], [100], **kw)


_SIGINT_SCRIPT = r'''
import os, signal, sys, time
import concurrent.futures.process as cfp
import kvtier.sweep
from kvtier.trace import embedded_sample_path
at = int(sys.argv[1])  # the pool submit at which the process sends itself SIGINT (0: none)
real_submit = cfp.ProcessPoolExecutor.submit
count = [0]
def submit(self, *args, **kwargs):
    count[0] += 1
    if count[0] == at:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the KeyboardInterrupt is raised here
    return real_submit(self, *args, **kwargs)
cfp.ProcessPoolExecutor.submit = submit
real = kvtier.sweep.replay
def slow(trace, policy, capacity, options):  # in the workers (fork): a long point
    time.sleep(120)
    return real(trace, policy, capacity, options)
kvtier.sweep.replay = slow
print("ready", flush=True)
kvtier.sweep.run_grid(embedded_sample_path(), ["lru", "arc"], [10, 20, 30], workers=2)
'''


def _session_processes(sid: int) -> list[int]:
    """Live processes (not zombies) of session ``sid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc") or sys.platform != "linux",
                    reason="reads the session's processes from /proc (Linux)")
@pytest.mark.parametrize("how", ["submit", "group"])
def test_a_real_sigint_ends_the_sweep_and_its_workers_at_once(how):
    """A real SIGINT to a process running run_grid over 2 workers whose points take 120 s:
    ``submit``: the process signals itself while it hands out the points (the 2nd submit, the
    workers started): before, the KeyboardInterrupt came before the try that ends the
    workers, and leaving the pool's ``with`` waited for every point handed out (2 x 120 s);
    ``group``: SIGINT to the whole process group while the points run, as Ctrl-C in a
    terminal does: the workers ignore it (no traceback of theirs), the parent ends them.
    Either way the process exits within seconds and leaves no worker behind."""
    import multiprocessing
    import signal
    import subprocess
    import time

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the slow replay reaches the workers only through fork")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_SCRIPT, "2" if how == "submit" else "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        if how == "group":
            deadline = time.monotonic() + 60
            while len(_session_processes(proc.pid)) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)  # the parent and its 2 workers
            assert len(_session_processes(proc.pid)) >= 3, "the workers never started"
            time.sleep(1)  # the workers are in their points
            t0 = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
        else:
            t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=100)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "KeyboardInterrupt" in stderr and took < 30, (took, stderr[-2000:])
    assert stderr.count("Traceback") == 1, stderr[-3000:]  # the parent's only
    deadline = time.monotonic() + 10
    while _session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_processes(proc.pid) == []


def test_default_grid_refuses_a_negative_count_and_stays_within_a_tier():
    """Found by a newcomer session: default_grid(-5) returned [1] (a grid for a trace of -5
    distinct blocks), and default_grid(10**12) sizes up to 10**12 blocks, above the most a
    tier can hold (MAX_BLOCKS), so every such point failed later in the manager. Now the
    count must be an int >= 0, the defaults are capped at MAX_BLOCKS, and an explicit lo / hi
    above it, below 1, or hi < lo is refused, naming the argument."""
    assert default_grid(182_790, 12)[0] == 914 and default_grid(182_790, 12)[-1] == 182_790
    for bad in (-5, 2.5, True, "100"):
        with pytest.raises(ValueError, match=r"unique_blocks must be an int >= 0 \(distinct "
                                             rf"blocks\), got {bad!r}"):
            default_grid(bad)
    for big in (10**12, 10**400):
        grid = default_grid(big, 5)
        assert grid[-1] == MAX_BLOCKS and len(grid) == 5 and grid == sorted(set(grid))
    with pytest.raises(ValueError, match=r"hi must be at most 2,147,483,647 blocks .*got "
                                         r"1,000,000,000,000"):
        default_grid(100, hi=10**12)
    with pytest.raises(ValueError, match=r"lo must be a positive int \(blocks\), got 0"):
        default_grid(100, lo=0)
    with pytest.raises(ValueError, match=r"points must be a positive int"):
        default_grid(100, points=0)
    with pytest.raises(ValueError, match=r"hi \(10 blocks\) must be >= lo \(50 blocks\)"):
        default_grid(100, lo=50, hi=10)
