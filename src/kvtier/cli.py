"""The ``kvtier`` command line: ``kvtier replay`` and ``kvtier sweep``.

``kvtier replay [TRACE]`` replays a trace (default: the embedded Mooncake sample) through the
offloading manager for each ``--policy`` x ``--capacity`` and prints hit ratios and the
bookkeeping cost. ``kvtier sweep [TRACE]`` runs a log-spaced grid of capacities for several
policies in parallel and draws the miss-ratio curves to a PNG. Both write ``--json``.

Exit status: 0 on success, 1 on bad input or arguments (message on stderr), 2 on usage errors.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvtier.policies import available_policies
from kvtier.replay import PROTOCOLS, ReplayResult, parse_capacity, replay
from kvtier.trace import FORMATS, TraceFormatError, count_unique_blocks, embedded_sample_path, read_trace

app = typer.Typer(
    name="kvtier",
    help="Replay LLM request traces through kvtier's offloaded KV-cache tier.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_err = Console(stderr=True)
_AUTO_PROGRESS_REFS = 1_000_000  # show a progress bar when a run replays more references


class _CliError(Exception):
    """A user error: printed without a traceback, exit status 1."""


@app.callback()
def _main() -> None:
    """kvtier: bookkeeping, policies and replay for the offloaded tier of an LLM KV cache."""


# -- shared option types -------------------------------------------------------------------
TraceArg = Annotated[
    Optional[Path],
    typer.Argument(help="Trace file (Mooncake JSONL, token-id JSONL or text/CSV; .gz/.zst ok). "
                   "Default: the embedded 500-request Mooncake conversation sample."),
]
PolicyOpt = Annotated[
    Optional[list[str]],
    typer.Option("--policy", "-p", help="Policy name; repeat or comma-separate for several "
                 "(default: lru,arc). Choices: "
                 + ", ".join(available_policies()) + "."),
]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help=f"Trace format: {', '.join(FORMATS)}.")]
BlockTokensOpt = Annotated[int, typer.Option("--block-tokens", min=1,
                                             help="Tokens per block (token-id traces; token counts).")]
InflightOpt = Annotated[int, typer.Option("--inflight", "-W", min=0,
                                          help="Requests whose loads/stores stay in flight.")]
ProtocolOpt = Annotated[str, typer.Option("--protocol", help="'prefix' (engine) or 'get' (one get per block).")]
ThresholdOpt = Annotated[int, typer.Option("--store-threshold", min=1,
                                           help="Admission: store blocks looked up at least N times.")]
AdmissionOpt = Annotated[str, typer.Option(
    "--admission", help="Admission: 'all' (store every new block) or 'adaptive' (learn online "
                        "whether to store only blocks seen before; not with --store-threshold).")]
SkipOpt = Annotated[bool, typer.Option("--skip-bad-lines", help="Skip and count bad trace lines.")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Write results as JSON here ('-': stdout).")]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress",
                                                     help="Progress bar (default: on long runs).")]


def _split(values: list[str] | None, default: list[str], option: str) -> list[str]:
    out: list[str] = []
    for value in values or default:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    if values and not out:
        raise _CliError(f"{option} was given but names nothing ({values!r})")
    return out


def _check_writable(target: Path | None, option: str) -> None:
    """Fail before any work when an output file cannot be created."""
    if target is None or str(target) == "-":
        return
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK) or target.is_dir():
        raise _CliError(f"{option} {target}: cannot write there (no such writable folder)")


def _check_plot_format(target: Path) -> None:
    """Fail before any work when matplotlib cannot write the image format the suffix names."""
    suffix = target.suffix.lower().lstrip(".")
    if not suffix:
        return  # matplotlib's default format (PNG)
    from matplotlib.figure import Figure

    supported = Figure().canvas.get_supported_filetypes()
    if suffix not in supported:
        raise _CliError(f"--plot {target}: matplotlib cannot write .{suffix} files; use one of "
                        f"{', '.join('.' + ext for ext in sorted(supported))}")


def _check_common(policies: list[str], fmt: str, protocol: str, inflight: int) -> None:
    known = available_policies()
    for p in policies:
        if p not in known:
            raise _CliError(f"unknown policy {p!r}; choose from: {', '.join(known)}")
    if fmt not in FORMATS:
        raise _CliError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    if protocol not in PROTOCOLS:
        raise _CliError(f"unknown protocol {protocol!r}; choose from: {', '.join(PROTOCOLS)}")
    if protocol == "get" and inflight:
        raise _CliError("--inflight needs --protocol prefix")


def _check_admission(admission: str, store_threshold: int) -> None:
    from kvtier.admission_adaptive import ADMISSION_MODES

    if admission not in ADMISSION_MODES:
        raise _CliError(f"unknown --admission {admission!r}; choose from: "
                        f"{', '.join(ADMISSION_MODES)}")
    if admission != "all" and store_threshold > 1:
        raise _CliError(f"--admission {admission} and --store-threshold {store_threshold} are "
                        "two admission rules; give one")


def _capacities(specs: list[str], unique_blocks: int) -> list[int]:
    out = []
    for spec in specs:
        try:
            cap = parse_capacity(spec, unique_blocks)
        except ValueError as exc:
            raise _CliError(str(exc)) from None
        if cap not in out:
            out.append(cap)
    return out


def _progress(enabled: bool | None, total_refs: int) -> Progress | None:
    if enabled is None:
        enabled = total_refs >= _AUTO_PROGRESS_REFS
    if not enabled:
        return None
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True,
    )


_COLUMNS = ("policy", "tier\nblocks", "requests", "block\nrefs", "hit\nblocks",
            "block\nhit %", "token\nhit %", "store\nfails", "evictions", "time\nms",
            "ns per\nref")
_UNIFORM = {"requests", "block\nrefs"}  # the same in every row: dropped first when narrow


def _results_table(results: list[ReplayResult], title: str, console: Console) -> Table:
    """The results table; on a console too narrow for it, the two columns that are the
    same in every row (requests, block refs; also in the caption) are left out."""
    for columns in (_COLUMNS, tuple(c for c in _COLUMNS if c not in _UNIFORM)):
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                      pad_edge=False, collapse_padding=True, show_edge=False)
        for name in columns:
            table.add_column(name, justify="left" if name == "policy" else "right",
                             no_wrap=True)
        for r in results:
            cells = dict(zip(_COLUMNS, (
                r.policy, f"{r.capacity:,}", f"{r.requests:,}", f"{r.block_refs:,}",
                f"{r.hit_blocks:,}", f"{r.block_hit_ratio * 100:.2f}",
                f"{r.token_hit_ratio * 100:.2f}", f"{r.store_failures:,}", f"{r.evictions:,}",
                f"{r.bookkeeping_s * 1e3:,.1f}", f"{r.ns_per_block_ref:,.0f}",
            )))
            table.add_row(*(cells[c] for c in columns))
        natural = Measurement.get(console, console.options.update_width(10_000), table)
        if natural.maximum <= console.width:
            break
    return table


def _out_console(json_out: Path | None) -> Console:
    """Where tables go: stdout, or stderr when the JSON goes to stdout. Never narrower
    than the table when not writing to a terminal (files, pipes, CI logs)."""
    console = Console(stderr=str(json_out) == "-")
    if not console.is_terminal:
        console.width = max(console.width, 96)
    return console


def _write_json(target: Path | None, payload: dict) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
    else:
        try:
            target.write_text(text)
        except OSError as exc:
            raise _CliError(f"cannot write JSON to {target}: {exc}") from None


def _fail(exc: BaseException) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(1)


def _trace_info(path: Path, reader, n_req: int, n_refs: int, unique: int, parse_s: float) -> dict:
    return {
        "path": str(path),
        "format": reader.fmt,
        "requests": n_req,
        "block_refs": n_refs,
        "unique_blocks": unique,
        "bad_lines": reader.bad_lines,
        "parse_s": parse_s,
        "parse_refs_per_s": n_refs / parse_s if parse_s > 0 else None,
    }


def _count(n: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _trace_caption(info: dict) -> str:
    rate = info["parse_refs_per_s"]
    name = info["path"]
    if name == str(embedded_sample_path()):
        name = f"embedded sample {Path(name).name}"
    text = (f"{name} ({info['format']}): {_count(info['requests'], 'request')}, "
            f"{info['block_refs']:,} block refs, {info['unique_blocks']:,} distinct blocks; "
            f"parsed in {info['parse_s'] * 1e3:,.0f} ms"
            + (f" ({rate / 1e6:.2f} M refs/s)" if rate else ""))
    if info["bad_lines"]:
        text += f"; {_count(info['bad_lines'], 'bad line')} skipped"
    return text


# -- replay --------------------------------------------------------------------------------
@app.command("replay")
def replay_cmd(
    trace: TraceArg = None,
    policy: PolicyOpt = None,
    capacity: Annotated[Optional[list[str]], typer.Option(
        "--capacity", "-c",
        help="Tier size: blocks (4000) or % of the trace's distinct blocks (10%); repeat or "
             "comma-separate. Default: 5%,20%,50%.")] = None,
    fmt: FormatOpt = "auto",
    block_tokens: BlockTokensOpt = 512,
    inflight: InflightOpt = 0,
    protocol: ProtocolOpt = "prefix",
    store_threshold: ThresholdOpt = 1,
    admission: AdmissionOpt = "all",
    skip_bad_lines: SkipOpt = False,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1,
                                                 help="Replay only the first N requests.")] = None,
    stream: Annotated[bool, typer.Option(
        "--stream", help="Re-read the trace for each run instead of holding it in memory "
                         "(for traces larger than memory).")] = False,
    json_out: JsonOpt = None,
    progress: ProgressOpt = None,
) -> None:
    """Replay a trace through the offloading manager: hit ratios and bookkeeping cost.

    One run per --policy x --capacity, each on a fresh manager.
    """
    try:
        _check_admission(admission, store_threshold)
        _replay(trace, policy, capacity, fmt, block_tokens, inflight, protocol,
                store_threshold, skip_bad_lines, limit, stream, json_out, progress, admission)
    except (_CliError, TraceFormatError, ValueError, OSError) as exc:
        raise _fail(exc) from None


def _replay(trace, policy, capacity, fmt, block_tokens, inflight, protocol, store_threshold,
            skip_bad_lines, limit, stream, json_out, progress, admission="all") -> None:
    path = trace if trace is not None else embedded_sample_path()
    policies = _split(policy, ["lru", "arc"], "--policy")
    _check_common(policies, fmt, protocol, inflight)
    _check_writable(json_out, "--json")
    capacity_specs = _split(capacity, ["5%", "20%", "50%"], "--capacity")

    def open_trace():
        reader = read_trace(path, fmt=fmt, block_tokens=block_tokens,
                            skip_bad_lines=skip_bad_lines)
        return reader, (itertools.islice(reader, limit) if limit else reader)

    reader, it = open_trace()
    t0 = time.perf_counter()
    if stream:
        n_req, n_refs, unique = count_unique_blocks(it)
        requests = None
    else:
        requests = list(it)
        parse_end = time.perf_counter()
        n_req, n_refs, unique = count_unique_blocks(requests)
        t0 += time.perf_counter() - parse_end  # the distinct-block count is not parsing
    parse_s = time.perf_counter() - t0
    info = _trace_info(path, reader, n_req, n_refs, unique, parse_s)
    capacities = _capacities(capacity_specs, unique)

    runs = [(p, c) for p in policies for c in capacities]
    results: list[ReplayResult] = []
    bar = _progress(progress, n_refs * len(runs))
    with bar if bar is not None else nullcontext():
        task = bar.add_task("replay", total=n_req * len(runs)) if bar is not None else None
        advance = (lambda n: bar.advance(task, n)) if bar is not None else None
        for p, c in runs:
            if bar is not None:
                bar.update(task, description=f"{p} @ {c:,}")
            source = requests if not stream else open_trace()[1]
            results.append(replay(source, p, c, inflight=inflight, protocol=protocol,
                                  block_tokens=block_tokens, store_threshold=store_threshold,
                                  progress=advance, admission=admission))

    out = _out_console(json_out)
    out.print(_results_table(
        results,
        f"kvtier replay — protocol {protocol}, in-flight window {inflight}"
        + (f", store threshold {store_threshold}" if store_threshold > 1 else "")
        + (f", admission {admission}" if admission != "all" else ""),
        out,
    ))
    out.print(_trace_caption(info), highlight=False, soft_wrap=True)
    _write_json(json_out, {"trace": info, "results": [r.to_dict() for r in results]})


# -- sweep ---------------------------------------------------------------------------------
@app.command("sweep")
def sweep_cmd(
    trace: TraceArg = None,
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", "-p", help="Policies to compare; repeat or comma-separate. "
                               "Default: every registered policy.")] = None,
    points: Annotated[Optional[int], typer.Option(
        "--points", min=1, help="Capacities in the log-spaced grid.  [default: 12]")] = None,
    cap_min: Annotated[Optional[str], typer.Option(
        "--min", help="Smallest capacity of the grid (blocks or %).  [default: 0.5%]")] = None,
    cap_max: Annotated[Optional[str], typer.Option(
        "--max", help="Largest capacity of the grid (blocks or %).  [default: 100%]")] = None,
    capacity: Annotated[Optional[list[str]], typer.Option(
        "--capacity", "-c", help="Explicit capacities instead of the grid.")] = None,
    fmt: FormatOpt = "auto",
    block_tokens: BlockTokensOpt = 512,
    inflight: InflightOpt = 0,
    protocol: ProtocolOpt = "prefix",
    store_threshold: ThresholdOpt = 1,
    admission: AdmissionOpt = "all",
    skip_bad_lines: SkipOpt = False,
    plot: Annotated[Path, typer.Option("--plot", help="Image file for the miss-ratio curves (PNG; the suffix picks matplotlib's format). Always written.")] = Path("mrc.png"),
    json_out: JsonOpt = None,
    workers: Annotated[Optional[int], typer.Option("--workers", "-j", min=1,
                                                   help="Processes (default: one per core).")] = None,
    progress: ProgressOpt = None,
) -> None:
    """Miss-ratio curves: a log-spaced grid of capacities for several policies, plotted.

    One process per core; writes the PNG (--plot), the table and --json.
    """
    try:
        _check_admission(admission, store_threshold)
        _sweep(trace, policy, points, cap_min, cap_max, capacity, fmt, block_tokens, inflight,
               protocol, store_threshold, skip_bad_lines, plot, json_out, workers, progress,
               admission)
    except (_CliError, TraceFormatError, ValueError, OSError) as exc:
        raise _fail(exc) from None


def _sweep(trace, policy, points, cap_min, cap_max, capacity, fmt, block_tokens, inflight,
           protocol, store_threshold, skip_bad_lines, plot, json_out, workers, progress,
           admission="all") -> None:
    from kvtier.replay import log_grid
    from kvtier.sweep import plot_mrc, run_grid

    path = trace if trace is not None else embedded_sample_path()
    policies = _split(policy, available_policies(), "--policy")
    _check_common(policies, fmt, protocol, inflight)
    _check_writable(json_out, "--json")
    _check_writable(plot, "--plot")
    _check_plot_format(plot)
    capacity_specs = _split(capacity, [], "--capacity")
    if capacity_specs:
        grid = [name for name, value in
                (("--points", points), ("--min", cap_min), ("--max", cap_max)) if value is not None]
        if grid:
            verb = "sets" if len(grid) == 1 else "set"
            raise _CliError(f"{', '.join(grid)} {verb} the log-spaced grid; with --capacity "
                            "there is no grid (give one or the other)")
    points = 12 if points is None else points
    cap_min = "0.5%" if cap_min is None else cap_min
    cap_max = "100%" if cap_max is None else cap_max
    reader = read_trace(path, fmt=fmt, block_tokens=block_tokens, skip_bad_lines=skip_bad_lines)
    t0 = time.perf_counter()
    n_req, n_refs, unique = count_unique_blocks(reader)
    info = _trace_info(path, reader, n_req, n_refs, unique, time.perf_counter() - t0)
    if capacity_specs:
        capacities = sorted(_capacities(capacity_specs, unique))
    else:
        lo, hi = _capacities([cap_min], unique)[0], _capacities([cap_max], unique)[0]
        if hi < lo:
            raise _CliError(f"--min {cap_min} ({lo} blocks) is above --max {cap_max} ({hi} blocks)")
        capacities = log_grid(lo, hi, points)
    n_workers = workers or os.cpu_count() or 1
    bar = _progress(progress, n_refs * len(policies) * len(capacities))
    with bar if bar is not None else nullcontext():
        task = (bar.add_task(f"sweep ({min(n_workers, len(policies) * len(capacities))} "
                             "processes)", total=len(policies) * len(capacities))
                if bar is not None else None)
        results = run_grid(
            path, policies, capacities, fmt=fmt, block_tokens=block_tokens,
            skip_bad_lines=skip_bad_lines, inflight=inflight, protocol=protocol,
            store_threshold=store_threshold, workers=n_workers, admission=admission,
            on_result=(lambda r: bar.advance(task)) if bar is not None else None,
        )
    title = (f"{Path(path).name}: {n_req:,} requests, {n_refs:,} block refs, "
             f"{unique:,} distinct blocks\nprotocol {protocol}, in-flight window {inflight}"
             + (f", admission {admission}" if admission != "all" else ""))
    # the table and the JSON first: a failing plot must not lose the results
    out = _out_console(json_out)
    out.print(_results_table(results, f"kvtier sweep — protocol {protocol}, "
                                      f"in-flight window {inflight}"
                                      + (f", admission {admission}" if admission != "all"
                                         else ""), out))
    out.print(_trace_caption(info), highlight=False, soft_wrap=True)
    _write_json(json_out, {"trace": info, "capacities": capacities, "plot": str(plot),
                           "results": [r.to_dict() for r in results]})
    try:
        plot_mrc(results, plot, title=title, unique_blocks=unique, block_refs=n_refs)
    except OSError as exc:
        raise _CliError(f"cannot write plot to {plot}: {exc}") from None
    out.print(f"miss-ratio curves written to {plot}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
