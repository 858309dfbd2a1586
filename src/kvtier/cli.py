"""The ``kvtier`` command line: ``kvtier replay``, ``kvtier sweep`` and ``kvtier analyze``.

``kvtier replay [TRACE]`` replays a trace (default: the embedded Mooncake sample) through the
offloading manager for each ``--policy`` x ``--capacity`` and prints hit ratios and the
bookkeeping cost. ``kvtier sweep [TRACE]`` runs a log-spaced grid of capacities for several
policies in parallel and, with ``--plot FILE``, draws the miss-ratio curves. ``kvtier analyze
[TRACE]`` prints what the trace looks like (reuse distances, one-hit wonders, prefix sharing,
reuse times, working set). All write ``--json``.

Each command turns its flags into typed options once (:class:`ReplayCommand` /
:class:`SweepCommand`, holding a :class:`TraceSource`, :class:`kvtier.replay.ReplayOptions` and
:class:`OutputOptions`) and runs with :func:`run_replay` / :func:`run_sweep`.

Exit status: 0 on success, 1 on bad input or arguments (message on stderr), 2 on usage errors.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import math
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
import warnings
from array import array
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kvtier.admission_adaptive import ADMISSION_MODES
from kvtier.checks import counted
from kvtier.costmodel import PROFILES, CostModel, evaluate, input_lengths
from kvtier.policies import PolicyPluginError, available_policies, get_policy
from kvtier.replay import (
    DECIMAL_PATTERN,
    PROTOCOLS,
    ReplayOptions,
    ReplayResult,
    negated,
    parse_capacity,
    parse_count,
    replay,
)
from kvtier.trace import (
    FORMATS,
    TraceFormatError,
    TraceOptions,
    TraceWarning,
    count_unique_blocks,
    embedded_sample_path,
    find_shared_trace,
)

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


def _count_option(minimum: int, unit: str):
    """The ``parser`` of an int option: the text must be a count by
    :func:`kvtier.replay.parse_count`'s rule, the one ``--capacity`` uses (ASCII digits,
    optionally grouped by single ``_``), and at least ``minimum``. typer's own int took
    ``"\u0663"`` (Arabic-Indic 3), ``"+3"``, ``"3.0"`` or ``"1__0"``, depending on its
    version; ``min=`` is not applied to an option with a parser, so it is checked here."""
    def parse(value):
        if not isinstance(value, str):  # a default, passed through by click-based typer
            return value
        try:
            number = parse_count(value)
            rest = negated(value)  # "- 5" is no number
            negative = number is None and rest is not None and parse_count(rest)
        except ValueError as exc:  # more digits than Python converts (parse_count)
            raise typer.BadParameter(str(exc)) from None
        if negative:
            number = -1  # a negative count: said as below the minimum, as --capacity -5 is
        return _at_least(number, minimum, unit, value, "a whole number", _COUNT_FORMS)

    return parse


_COUNT_FORMS = "in ASCII digits, optionally grouped by _ (1000, 16_000)"
_DECIMAL_FORMS = ("in ASCII digits, optionally grouped by _, with an optional fraction and "
                  "exponent (25, 2.5, 1e4, 1_000.5)")


def _at_least(number, minimum, unit: str, value: str, kind: str, forms: str):
    """The two option parsers' common end: ``number`` (None when ``value`` is not of the
    option's ``kind``) must be at least ``minimum``; raises typer.BadParameter naming the
    rule, else returns ``number``."""
    least = f"{minimum:g}" if isinstance(minimum, float) else str(minimum)
    if number is None:
        raise typer.BadParameter(f"must be {kind} >= {least} ({unit}) {forms}, got {value!r}")
    if number < minimum:
        raise typer.BadParameter(f"must be >= {least} ({unit}), got {value!r}")
    return number


# a float option's number: the rule of --capacity's percentages, without the "%" (its digits
# by the count options' rule, replay.DIGITS_PATTERN)
_DECIMAL_RE = re.compile(rf"^\s*{DECIMAL_PATTERN}\s*$", re.ASCII)


def _number_option(minimum: float, unit: str):
    """The ``parser`` of a float option: the text must be a decimal number in ASCII digits,
    grouped by ``_`` as the counts are (:data:`kvtier.replay.DECIMAL_PATTERN`), with an
    optional fraction and exponent (``25``, ``2.5``, ``1e4``, ``.5``, ``1_000.5``), finite,
    and at least ``minimum``. typer's float took, depending on its version, ``"nan"``,
    ``"inf"`` or ``"\u0663"`` (Arabic-Indic 3); ``min=`` is not applied to an option with a
    parser, so it is checked here."""
    def parse(value):
        if not isinstance(value, str):  # a default, passed through by click-based typer
            return value
        m = _DECIMAL_RE.match(value)
        number = float(m.group(1)) if m else None
        if number is not None and not math.isfinite(number):
            number = None
        rest = negated(value)  # "- 5" is no number
        if m is None and rest is not None and _DECIMAL_RE.match(rest):
            number = -math.inf  # a negative number: said as below the minimum
        return _at_least(number, minimum, unit, value, "a finite number", _DECIMAL_FORMS)

    return parse


# -- shared option types -------------------------------------------------------------------
TraceArg = Annotated[
    Optional[Path],
    typer.Argument(help="Trace file (Mooncake JSONL, token-id JSONL or text/CSV; .gz/.zst ok; "
                   "'-' reads standard input). "
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
                                             parser=_count_option(1, "tokens"),
                                             help="Tokens per block (token-id traces; token counts).")]
InflightOpt = Annotated[int, typer.Option("--inflight", "-W", min=0,
                                          parser=_count_option(0, "requests"),
                                          help="Requests whose loads/stores stay in flight.")]
ProtocolOpt = Annotated[str, typer.Option("--protocol", help="'prefix' (engine, explicit touch), 'request' (engine, vLLM 0.33's request-scoped use) or 'get' (one get per block).")]
ThresholdOpt = Annotated[int, typer.Option("--store-threshold", min=1,
                                           parser=_count_option(1, "lookups"),
                                           help="Admission: store blocks looked up at least N times.")]
AdmissionOpt = Annotated[str, typer.Option(
    "--admission", help="Admission: 'all' (store every new block), 'adaptive' (learn online "
                        "whether to store only blocks seen before) or 'tinylfu' (frequency "
                        "sketch vs the tier's victims); not with --store-threshold.")]
SkipOpt = Annotated[bool, typer.Option("--skip-bad-lines", help="Skip and count bad trace lines.")]
StrictOpt = Annotated[bool, typer.Option(
    "--strict", help="Make suspicious trace input an error (e.g. Mooncake input_length that "
                     "disagrees with the number of hash_ids at --block-tokens).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Write results as JSON here ('-': stdout).")]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress",
                                                     help="Progress bar (default: on long runs).")]


# the spaces the number rules ignore around an item (re.ASCII's \s): str.strip() also
# stripped Unicode spaces, so replay --capacity took "\u00a05", which parse_capacity refuses
_SPACES = " \t\n\r\f\v"


def _split(values: list[str] | None, default: list[str], option: str) -> list[str]:
    out: list[str] = []
    for value in values or default:
        out.extend(v.strip(_SPACES) for v in value.split(",") if v.strip(_SPACES))
    if values and not out:
        raise _CliError(f"{option} was given but names nothing ({values!r})")
    twice = sorted({v for v in out if out.count(v) > 1})
    if twice:  # each would be replayed twice and printed as two rows
        raise _CliError(f"{option} names {', '.join(twice)} more than once; give each once")
    return out


def _check_writable(target: Path | None, option: str,
                    trace: Path | str | None = None) -> None:
    """Fail before any work when an output file cannot be written: the file is opened for
    appending (created if missing, then removed again), so whatever the OS would refuse
    after the run (no folder, no permission, a read-only or virtual file system) is found
    now; a directory gets its own message. ``trace``: the command's trace file, which an
    output must not be (``--json trace.jsonl`` overwrote the trace with the results)."""
    if target is None or str(target) == "-":
        return
    if trace is not None and not _is_stream(Path(trace)):
        try:
            same = target.exists() and os.path.samefile(target, trace)
        except OSError:  # the trace is missing: the reader says so
            same = False
        if same:
            raise _CliError(f"{option} {target}: is the trace file itself; writing there "
                            "would overwrite the trace with the results: give another file "
                            "name")
    if target.is_dir():
        raise _CliError(f"{option} {target}: is a directory; give a file name, e.g. "
                        f"{option} {target / ('results.json' if option == '--json' else 'mrc.png')}")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise _CliError(f"{option} {target}: cannot write there (no such folder {parent})")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        raise _CliError(f"{option} {target}: cannot write there ({exc.strerror or exc})") from None
    if not existed:
        target.unlink()


def _check_distinct_outputs(json_out: Path | None, plot: Path | None) -> None:
    """``--json`` and ``--plot`` must be two files: the plot, written last, replaced the
    JSON without a word (``kvtier analyze --json a.png --plot a.png``)."""
    if json_out is None or plot is None or str(json_out) == "-":
        return
    same = json_out.resolve() == plot.resolve()
    if not same and json_out.exists() and plot.exists():
        same = os.path.samefile(json_out, plot)
    if same:
        raise _CliError(f"--json {json_out} and --plot {plot} name one file: the image would "
                        "replace the JSON; give two file names")


def _check_plot_format(target: Path) -> None:
    """Fail before any work when matplotlib cannot write the image format the suffix names,
    or when ``target`` is ``-``: only ``--json -`` means standard output; ``--plot -`` wrote
    the image nowhere (matplotlib's ``savefig("-")``) and said "written to -"."""
    if str(target) == "-":
        raise _CliError("--plot -: the image cannot go to standard output (only --json - "
                        "does); give a file name, e.g. --plot mrc.png")
    suffix = target.suffix.lower().lstrip(".")
    if not suffix:
        return  # matplotlib's default format (PNG)
    from matplotlib.figure import Figure

    supported = Figure().canvas.get_supported_filetypes()
    if suffix not in supported:
        raise _CliError(f"--plot {target}: matplotlib cannot write .{suffix} files; use one of "
                        f"{', '.join('.' + ext for ext in sorted(supported))}")


_COST_OPTIONS = {"kv_bytes_per_token": "--kv-bytes-per-token",
                 "prefill_tokens_per_s": "--prefill-tps", "read_gb_per_s": "--read-gbps",
                 "instances": "--instances", "block_tokens": "--block-tokens"}
"""CostModel's argument names -> the replay options that set them (for error messages)."""


def _capacities(specs, unique_blocks: int) -> list[int]:
    """The distinct capacities (blocks) of ``specs`` on a trace of ``unique_blocks`` distinct
    blocks, each warned about as :func:`_warn_capacity` says. Raises _CliError for a bad
    spec (before any warning)."""
    caps = [_capacity(spec, unique_blocks) for spec in specs]
    out = []
    for spec, cap in zip(specs, caps, strict=True):
        _warn_capacity(spec, cap, unique_blocks)
        if cap not in out:
            out.append(cap)
    return out


def _check_range(cap_min: str, lo: int, cap_max: str, hi: int) -> None:
    """Raise _CliError when sweep's ``--min`` (``lo`` blocks) is above its ``--max``."""
    if hi < lo:
        raise _CliError(f"--min {cap_min} ({counted(lo, 'block')}) is above --max "
                        f"{cap_max} ({counted(hi, 'block')})")


def _capacity(spec, unique_blocks: int | None) -> int:
    """``parse_capacity(spec, unique_blocks)``, its ValueError as a _CliError; no warning."""
    try:
        return parse_capacity(spec, unique_blocks)
    except ValueError as exc:
        raise _CliError(str(exc)) from None


def _warn_capacity(spec, cap: int, unique_blocks: int) -> None:
    """Warn when capacity ``spec`` (``cap`` blocks) holds every distinct block of the trace,
    or is a percentage that gives under half a block (run at 1 block)."""
    if cap > unique_blocks:
        _warn(f"capacity {spec} = {counted(cap, 'block')} exceeds the trace's "
              f"{counted(unique_blocks, 'distinct block')}: every block fits, nothing is "
              "ever evicted")
    elif cap == 1 and isinstance(spec, str) and spec.strip().endswith("%"):
        # parse_capacity's "at least 1 block": say what the percentage itself gives
        pct = spec.strip()[:-1].strip()
        blocks = unique_blocks * float(pct) / 100.0
        if round(blocks) < 1:
            # a float that underflows (1e-400%) is shown from the decimal text, not as 0;
            # decimal imported here only: importing it in the replay's process cost +9
            # instructions per block reference (instr_count.py replay lru 16000 0,
            # 6,339 with it imported by replay.py vs 6,329 without)
            from decimal import Decimal

            shown = (f"{blocks:.2g}" if blocks else
                     f"{Decimal(unique_blocks) * Decimal(pct) / 100:.2g}")
            _warn(f"capacity {spec} gives 0 blocks of the trace's {unique_blocks:,} "
                  f"distinct blocks ({shown} blocks): run at 1 block, the smallest "
                  "tier")


def _warn(message: str) -> None:
    _err.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


@contextmanager
def _warnings_to_stderr():
    """Warnings raised while a command runs (a TraceWarning, a plugin skipped) are printed
    as ``warning: ...`` lines instead of Python's file:line format."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                text = str(w.message)
                if text not in seen:
                    seen.add(text)
                    _warn(text)


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
# the same columns with headers of at most 6 characters a line, for narrow consoles
_COMPACT = dict(zip(_COLUMNS, ("policy", "tier\nblocks", "reqs", "block\nrefs", "hit\nblocks",
                               "block\nhit %", "token\nhit %", "store\nfails", "evic-\ntions",
                               "time\nms", "ns/\nref"), strict=True))
_UNIFORM = {"requests", "block\nrefs"}  # the same in every row: dropped only as a last resort


def _results_table(results: list[ReplayResult], title: str, console: Console) -> Table:
    """The results table, as wide as it needs. On a narrower console (80 columns) the same
    columns get shorter headers and one space between columns; only when even that does not
    fit are the two columns that are the same in every row (requests, block refs; also in the
    caption) left out. Cells are never wrapped or truncated."""
    layouts = (
        (_COLUMNS, {c: c for c in _COLUMNS}, False),
        (_COLUMNS, _COMPACT, True),
        (tuple(c for c in _COLUMNS if c not in _UNIFORM), _COMPACT, True),
    )
    for columns, header, compact in layouts:
        # title_justify "default": left, unpadded ("left" pads the title line to the
        # table's width with trailing spaces); the same in the cost and analyze tables
        table = Table(title=title, title_justify="default", box=box.SIMPLE_HEAD,
                      pad_edge=False, collapse_padding=True, show_edge=False,
                      padding=0 if compact else (0, 1))
        for name in columns:
            table.add_column(header[name], justify="left" if name == "policy" else "right",
                             no_wrap=True)
        for r in results:
            cells = dict(zip(_COLUMNS, (
                r.policy, f"{r.capacity:,}", f"{r.requests:,}", f"{r.block_refs:,}",
                f"{r.hit_blocks:,}", f"{r.block_hit_ratio * 100:.2f}",
                f"{r.token_hit_ratio * 100:.2f}", f"{r.store_failures:,}", f"{r.evictions:,}",
                f"{r.bookkeeping_s * 1e3:,.1f}", f"{r.ns_per_block_ref:,.0f}",
            ), strict=True))
            table.add_row(*(cells[c] for c in columns))
        natural = Measurement.get(console, console.options.update_width(10_000), table)
        if natural.maximum <= console.width:
            break
    else:  # even the narrowest layout is too wide: the console grows, no cell is cut
        _widen(console, natural.maximum)
    return table


def _widen(console: Console, width: int) -> None:
    """Let ``console`` print a table of ``width`` columns whole: rich cuts the cells of a
    table wider than its console ("3…" for 33.5, "255,…" for 255,487: a figure changed);
    a pipe or file has no width, and a terminal wraps the longer lines (found by a newcomer
    session: a pipe's 96 columns cut the cost table of --prefill-tps 1 --instances 1)."""
    console.width = width


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
    # escaped: a path or value may hold '[...]' (a folder '[red]x', 'kvtier[redis]')
    _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True,
               soft_wrap=True)
    return typer.Exit(1)


def _trace_info(path: Path, reader, n_req: int, n_refs: int, unique: int, parse_s: float) -> dict:
    return {
        "path": "<stdin>" if str(path) == "-" else str(path),
        "format": reader.fmt,
        "requests": n_req,
        "block_refs": n_refs,
        "unique_blocks": unique,
        "bad_lines": reader.bad_lines,
        "length_mismatches": reader.length_mismatches,
        "parse_s": parse_s,
        "parse_refs_per_s": n_refs / parse_s if parse_s > 0 else None,
    }


def _interrupted_note(done: int, total: int, noun: str) -> str:
    """What Ctrl-C left: ``done`` of ``total`` runs (or grid points) finished, their rows
    printed and written; with none finished, says so ("0 ... finished; their rows are
    above" pointed at an empty table)."""
    if not done:
        return (f"interrupted (Ctrl-C): none of the {counted(total, noun)} finished; no row "
                "to show")
    return (f"interrupted (Ctrl-C): {done:,} of {counted(total, noun)} finished; "
            f"{'its row is' if done == 1 else 'their rows are'} above")


def _trace_caption(info: dict) -> str:
    rate = info["parse_refs_per_s"]
    name = info["path"]
    if name == str(embedded_sample_path()):
        name = f"embedded sample {Path(name).name}"
    text = (f"{name} ({info['format']}): {counted(info['requests'], 'request')}, "
            f"{counted(info['block_refs'], 'block ref')}, "
            f"{counted(info['unique_blocks'], 'distinct block')}; "
            f"parsed in {info['parse_s'] * 1e3:,.0f} ms"
            + (f" ({rate / 1e6:.2f} M refs/s)" if rate else ""))
    if info["bad_lines"]:
        text += f"; {counted(info['bad_lines'], 'bad line')} skipped"
    return text


# -- the options a command runs with ------------------------------------------------------
@dataclass(frozen=True)
class TraceSource:
    """Which trace a command reads and how: the file, its :class:`TraceOptions` and an
    optional request limit."""

    path: Path
    options: TraceOptions = TraceOptions()
    limit: int | None = None

    def open(self):
        """``(reader, iterable of requests)``: the reader keeps the counts (bad lines)."""
        reader = self.options.open(self.path)
        return reader, (_limited(reader, self.limit) if self.limit else reader)


def _limited(reader, limit: int):
    """The first ``limit`` requests of ``reader``; then its warning about lengths that
    disagree with --block-tokens, which a pass stopped before the end would not give."""
    # a limit beyond sys.maxsize (islice's bound) is beyond any trace: no limit
    yield from itertools.islice(reader, limit if limit <= sys.maxsize else None)
    reader.report_lengths()


class _Interrupted(Exception):
    """Ctrl-C: the finished rows were printed; exit status 130."""


def _is_stream(path: Path) -> bool:
    """Standard input, a pipe or a device: bytes that can be read only once."""
    if str(path) == "-":
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode)


@contextmanager
def _rereadable(source: TraceSource, needed: bool):
    """``source``, or when it must be read more than once (``needed``) and is a stream
    (``-``, ``/dev/stdin``, a pipe), a copy of it: the stream's bytes, compressed or not,
    spooled to a temporary file that is removed afterwards."""
    if not needed or not _is_stream(source.path):
        yield source
        return
    with tempfile.NamedTemporaryFile(prefix="kvtier-stream-") as tmp:
        if str(source.path) == "-":
            shutil.copyfileobj(sys.stdin.buffer, tmp)
        else:
            with open(source.path, "rb") as fh:
                shutil.copyfileobj(fh, tmp)
        tmp.flush()
        yield dataclasses.replace(source, path=Path(tmp.name))


@dataclass(frozen=True)
class OutputOptions:
    """Where results go: ``json`` file (``-``: stdout; ``None``: none) and the progress bar
    (``None``: only on long runs)."""

    json: Path | None = None
    progress: bool | None = None


@dataclass(frozen=True)
class ReplayCommand:
    """Everything ``kvtier replay`` was asked to do, as typed values."""

    source: TraceSource
    policies: tuple[str, ...]
    capacities: tuple[str, ...]  # block counts or percentages, parsed against the trace
    replay: ReplayOptions = ReplayOptions()
    output: OutputOptions = OutputOptions()
    stream: bool = False
    cost_model: CostModel | None = None  # --cost: bytes moved, prefill time saved, TTFT


@dataclass(frozen=True)
class SweepCommand:
    """Everything ``kvtier sweep`` was asked to do, as typed values. ``capacities`` (explicit
    sizes) and the grid (``points``, ``cap_min``, ``cap_max``) exclude each other."""

    source: TraceSource
    policies: tuple[str, ...]
    capacities: tuple[str, ...] = ()
    points: int | None = None
    cap_min: str | None = None
    cap_max: str | None = None
    replay: ReplayOptions = ReplayOptions()
    output: OutputOptions = OutputOptions()
    plot: Path | None = None
    workers: int | None = None


def _options(fmt: str, block_tokens: int, skip_bad_lines: bool, strict: bool, inflight: int,
             protocol: str, store_threshold: int,
             admission: str = "all") -> tuple[TraceOptions, ReplayOptions]:
    """The typed options of the flags both commands share, checked with the flag names."""
    if fmt not in FORMATS:
        raise _CliError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    if protocol not in PROTOCOLS:
        raise _CliError(f"unknown protocol {protocol!r}; choose from: {', '.join(PROTOCOLS)}")
    if protocol == "get" and inflight:
        raise _CliError("--inflight needs --protocol prefix or request")
    if admission not in ADMISSION_MODES:
        raise _CliError(f"unknown --admission {admission!r}; choose from: "
                        f"{', '.join(ADMISSION_MODES)}")
    if admission != "all" and store_threshold > 1:
        raise _CliError(f"--admission {admission} and --store-threshold {store_threshold} are "
                        "two admission rules; give one")
    return (TraceOptions(fmt=fmt, block_tokens=block_tokens, skip_bad_lines=skip_bad_lines,
                         strict=strict),
            ReplayOptions(inflight=inflight, protocol=protocol, block_tokens=block_tokens,
                          store_threshold=store_threshold, admission=admission))


def _check_policies(policies: tuple[str, ...]) -> None:
    known = available_policies()
    for p in policies:
        if p not in known:
            try:
                get_policy(p)  # a plugin that failed to load: its own error
            except PolicyPluginError as exc:
                raise _CliError(str(exc)) from None
            except ValueError:
                pass
            raise _CliError(f"unknown policy {p!r}; choose from: {', '.join(known)}")


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
    strict: StrictOpt = False,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1,
                                                 parser=_count_option(1, "requests"),
                                                 help="Replay only the first N requests.")] = None,
    stream: Annotated[bool, typer.Option(
        "--stream", help="Re-read the trace for each run instead of holding it in memory "
                         "(for traces larger than memory). Not with --policy belady, which "
                         "needs the whole trace up front.")] = False,
    json_out: JsonOpt = None,
    progress: ProgressOpt = None,
    tiers: Annotated[Optional[str], typer.Option(
        "--tiers", help="Simulate a tier stack instead, top down: host:CAP[,disk:CAP]"
                        "[,redis://HOST:PORT] (CAP = blocks or %); hit ratio per tier. "
                        "See docs/tiers.md.")] = None,
    demotion: Annotated[Optional[str], typer.Option(
        "--demotion", help="With --tiers: write-back (host victims go down) or "
                           "write-through (every host store goes down).  "
                           "\\[default: write-back]")] = None,
    cost: Annotated[bool, typer.Option(
        "--cost", help="Add the cost model's table (bytes moved, prefill seconds saved, "
                       "TTFT with/without the tier); on when any cost option is given.")] = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Cost model: KV shape from a built-in profile: "
                        + ", ".join(sorted(PROFILES)) + ".  \\[default: llama-3.1-8b]")] = None,
    kv_bytes: Annotated[Optional[int], typer.Option(
        "--kv-bytes-per-token", min=1, parser=_count_option(1, "bytes"),
        help="Cost model: KV bytes per token (instead of --model).")] = None,
    prefill_tps: Annotated[Optional[float], typer.Option(
        "--prefill-tps", min=0.001, parser=_number_option(0.001, "tokens/s"),
        help="Cost model: prefill tokens/s of one instance.  "
             "\\[default: 10,000, an assumption]")] = None,
    read_gbps: Annotated[Optional[float], typer.Option(
        "--read-gbps", min=0.001, parser=_number_option(0.001, "GB/s"),
        help="Cost model: tier read bandwidth, GB/s.  "
             "\\[default: 25, an assumption]")] = None,
    instances: Annotated[Optional[int], typer.Option(
        "--instances", min=1, parser=_count_option(1, "prefill instances"),
        help="Cost model: prefill instances serving the arrivals.  \\[default: auto, fewest "
             "keeping no-tier utilization <= 0.8]")] = None,
) -> None:
    """Replay a trace through the offloading manager: hit ratios and bookkeeping cost.

    One run per --policy x --capacity, each on a fresh manager. --policy belady is the
    offline reference (Belady's MIN: furthest next use first; optimal under --protocol get,
    near-optimal under prefix); it reads the whole trace up front, so it cannot run with
    --stream. --cost adds bytes moved, prefill seconds saved and TTFT (assumptions printed).
    """
    try:
        cost_model = None
        if cost or any(v is not None for v in (model, kv_bytes, prefill_tps, read_gbps,
                                                instances)):
            try:
                cost_model = CostModel.build(
                    model=model, kv_bytes_per_token=kv_bytes, prefill_tokens_per_s=prefill_tps,
                    read_gb_per_s=read_gbps, instances=instances, block_tokens=block_tokens)
            except ValueError as exc:
                message = str(exc).replace("give a model profile", "give --model")
                for name, option in _COST_OPTIONS.items():  # the option the user typed
                    message = message.replace(name, option)
                raise _CliError(message) from None
        trace_opts, replay_opts = _options(fmt, block_tokens, skip_bad_lines, strict, inflight,
                                           protocol, store_threshold, admission)
        command = ReplayCommand(
            source=TraceSource(trace if trace is not None else embedded_sample_path(),
                               trace_opts, limit),
            policies=tuple(_split(policy, ["lru", "arc"], "--policy")),
            capacities=tuple(_split(capacity, ["5%", "20%", "50%"], "--capacity")),
            replay=replay_opts,
            output=OutputOptions(json_out, progress),
            stream=stream,
            cost_model=cost_model,
        )
        if demotion is not None and tiers is None:  # it would be silently ignored
            raise _CliError(f"--demotion {demotion} needs --tiers (it chooses how a tier "
                            "stack's host victims go down)")
        with _warnings_to_stderr():
            if tiers is not None:
                from kvtier.tiersim import replay_tiers_cli

                replay_tiers_cli(command, tiers, demotion or "write-back",
                                 capacity_given=bool(capacity))
            else:
                run_replay(command)
    except (_CliError, TraceFormatError, ValueError, OSError) as exc:
        raise _fail(exc) from None
    except _Interrupted:
        raise typer.Exit(128 + signal.SIGINT) from None


def run_replay(cmd: ReplayCommand) -> list[ReplayResult]:
    """Run ``kvtier replay`` as ``cmd`` says: print the table, write the JSON, return the
    results. Raises the errors the command reports (``_CliError``, ``TraceFormatError``,
    ``ValueError``, ``OSError``); on Ctrl-C prints the rows that finished, writes them to the
    JSON and raises ``_Interrupted``."""
    _check_policies(cmd.policies)
    offline = [p for p in cmd.policies if getattr(get_policy(p), "needs_future", False)]
    if cmd.stream and offline:
        raise _CliError(f"--policy {offline[0]} needs the whole trace up front (each block's "
                        "next use), so it cannot run with --stream; drop --stream")
    _check_writable(cmd.output.json, "--json", cmd.source.path)
    cost_model = cmd.cost_model
    if cost_model is not None and cmd.replay.protocol == "get":
        # the model reads a request's hit blocks as its prefix; under get they need not be
        # one (said since a newcomer session found the figures counting such hits)
        _warn("--cost under --protocol get counts every hit block as read, also one after a "
              "request's first miss, which an engine computes again (its prefix is not "
              "there): the prefill saved is an upper bound; the default --protocol prefix "
              "counts only the leading hits")
    per_request_hits: list = []
    with _rereadable(cmd.source, needed=cmd.stream) as source:
        try:
            reader, it = source.open()
            t0 = time.perf_counter()
            if cmd.stream:
                n_req, n_refs, unique = count_unique_blocks(it)
                requests = None
            else:
                requests = list(it)
                parse_end = time.perf_counter()
                n_req, n_refs, unique = count_unique_blocks(requests)
                t0 += time.perf_counter() - parse_end  # the distinct-block count is not parsing
        except KeyboardInterrupt:
            _warn("interrupted while reading the trace: nothing was replayed")
            raise _Interrupted from None
        parse_s = time.perf_counter() - t0
        info = _trace_info(cmd.source.path, reader, n_req, n_refs, unique, parse_s)
        capacities = _capacities(cmd.capacities, unique)

        runs = [(p, c) for p in cmd.policies for c in capacities]
        results: list[ReplayResult] = []
        interrupted = False
        bar = _progress(cmd.output.progress, n_refs * len(runs))
        try:
            with bar if bar is not None else nullcontext():
                task = bar.add_task("replay", total=n_req * len(runs)) if bar is not None else None
                advance = (lambda n: bar.advance(task, n)) if bar is not None else None
                for p, c in runs:
                    if bar is not None:
                        bar.update(task, description=f"{p} @ {c:,}")
                    requests_now = requests if not cmd.stream else source.open()[1]
                    hits_out = array("l") if cost_model is not None else None
                    results.append(replay(requests_now, p, c, cmd.replay, progress=advance,
                                          hits_out=hits_out))
                    per_request_hits.append(hits_out)
        except KeyboardInterrupt:
            interrupted = True
        costs = None
        if cost_model is not None and not interrupted:
            meta = requests if requests is not None else list(source.open()[1])
            lengths = input_lengths(meta, cmd.replay.block_tokens)
            stamps = [r.timestamp for r in meta]
            costs = [evaluate(cost_model, lengths, hits, stamps, r.stored_blocks)
                     for r, hits in zip(results, per_request_hits, strict=True)]

    opts = cmd.replay
    out = _out_console(cmd.output.json)
    out.print(_results_table(
        results,
        f"kvtier replay — protocol {opts.protocol}, in-flight window {opts.inflight}"
        + (f", store threshold {opts.store_threshold}" if opts.store_threshold > 1 else "")
        + (f", admission {opts.admission}" if opts.admission != "all" else ""),
        out,
    ))
    out.print(_trace_caption(info), highlight=False, markup=False, soft_wrap=True)
    payload = {"trace": info, "results": [r.to_dict() for r in results]}
    if costs is not None:
        out.print(_cost_table(results, costs, out))
        out.print(cost_model.describe(), highlight=False, markup=False, soft_wrap=True)
        for row, cost in zip(payload["results"], costs, strict=True):
            row["cost"] = cost
        payload["cost_model"] = cost_model.to_dict()
    if interrupted:
        payload["interrupted"] = True
    _write_json(cmd.output.json, payload)
    if interrupted:
        _warn(_interrupted_note(len(results), len(runs), "run"))
        raise _Interrupted
    return results


_COST_COLUMNS = ("policy", "tier\nblocks", "read\nGB", "written\nGB", "prefill s\nsaved",
                 "saved\n%", "TTFT p50 s\nno tier→tier", "TTFT p99 s\nno tier→tier",
                 "utilization\nno tier→tier")
# the same columns with shorter headers, for narrow consoles (80 columns)
_COST_COMPACT = ("policy", "tier\nblocks", "read\nGB", "writ-\nten GB", "saved\ns",
                 "saved\n%", "TTFT p50\nno→tier", "TTFT p99\nno→tier", "util.\nno→tier")


def _cost_table(results: list[ReplayResult], costs: list[dict], console: Console) -> Table:
    """Per (policy, capacity): bytes moved, prefill seconds saved, TTFT without / with.

    As wide as it needs; on a narrower console (80 columns) the same columns get shorter
    headers and one space between columns, as in :func:`_results_table` (before, an
    80-column terminal cut the README's ``--cost`` table: "bela…", "10.105→9.8…")."""
    c0 = costs[0] if costs else {}
    queue = (f"FIFO over {c0.get('instances'):,} prefill instance(s)"
             if c0.get("queue") == "fifo" else "no queue (no timestamps)")

    def pair(a, b, fmt):
        return "-" if a is None else f"{a:{fmt}}→{b:{fmt}}"

    def fmt_for(values):  # one decimal while a column stays below 100: the full trace fits
        return ",.1f" if max((abs(v) for v in values), default=0) < 100 else ",.0f"

    read_f = fmt_for([c["read_bytes"] / 1e9 for c in costs])
    write_f = fmt_for([c["write_bytes"] / 1e9 for c in costs])
    saved_f = fmt_for([c["prefill_s_saved"] for c in costs])
    rows = []
    for r, c in zip(results, costs, strict=True):
        base = c["prefill_s_no_tier"]
        t0, t1 = c["ttft_no_tier_s"], c["ttft_with_tier_s"]
        rows.append((
            r.policy, f"{r.capacity:,}", f"{c['read_bytes'] / 1e9:{read_f}}",
            f"{c['write_bytes'] / 1e9:{write_f}}", f"{c['prefill_s_saved']:{saved_f}}",
            f"{c['prefill_s_saved'] / base * 100:,.1f}" if base else "-",
            pair(t0["median"], t1["median"], ",.3f"), pair(t0["p99"], t1["p99"], ",.3f"),
            pair(c["utilization_no_tier"], c["utilization_with_tier"], ",.2f"),
        ))
    for headers, compact in ((_COST_COLUMNS, False), (_COST_COMPACT, True)):
        table = Table(title=f"cost model — {queue}", title_justify="default",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      show_edge=False, padding=0 if compact else (0, 1))
        for name in headers:
            table.add_column(name, justify="left" if name == "policy" else "right",
                             no_wrap=True)
        for row in rows:
            table.add_row(*row)
        natural = Measurement.get(console, console.options.update_width(10_000), table)
        if natural.maximum <= console.width:
            break
    else:  # even the compact form is too wide: the console grows, no figure is cut
        _widen(console, natural.maximum)
    return table


# -- analyze -------------------------------------------------------------------------------
_AUTO_PROGRESS_BYTES = 20_000_000  # analyze shows a progress bar on trace files this large


@app.command("analyze")
def analyze_cmd(
    trace: TraceArg = None,
    fmt: FormatOpt = "auto",
    block_tokens: BlockTokensOpt = 512,
    skip_bad_lines: SkipOpt = False,
    strict: StrictOpt = False,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1,
                                                 parser=_count_option(1, "requests"),
                                                 help="Analyze only the first N requests.")] = None,
    window_s: Annotated[Optional[float], typer.Option(
        "--window-s", min=0.001, parser=_number_option(0.001, "seconds"),
        help="Working-set window, seconds (traces with timestamps).  "
             "\\[default: 60]")] = None,
    window_requests: Annotated[Optional[int], typer.Option(
        "--window-requests", min=1, parser=_count_option(1, "requests"),
        help="Working-set window, requests (traces without timestamps).  "
             "\\[default: 1000]")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Image of the distributions (PNG; log axes where they span decades).")] = None,
    json_out: JsonOpt = None,
    progress: ProgressOpt = None,
) -> None:
    """What a trace looks like: reuse distances, one-hit wonders, prefix sharing, reuse
    times and the working set, in one streaming pass.

    The reuse distance of a re-reference is the number of distinct other blocks referenced
    since the block's previous reference: an LRU tier of C blocks (--protocol get) hits it
    exactly when it is below C.
    """
    try:
        with _warnings_to_stderr():  # e.g. --block-tokens disagreeing with the trace's lengths
            _analyze(trace, fmt, block_tokens, skip_bad_lines, limit, window_s,
                     window_requests, plot, json_out, progress, strict)
    except (_CliError, TraceFormatError, ValueError, OSError) as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:  # exited 130 without a word before
        _warn("interrupted (Ctrl-C): nothing analyzed, nothing written (every figure needs "
              "the whole pass; --limit N analyzes the first N requests)")
        raise typer.Exit(128 + signal.SIGINT) from None


# Past 2**53 a float's integer digits are not all significant: timestamps near 1e308 ms gave
# reuse times and empty-window counts of 300 digits, mostly float noise, in the table
_EXACT_LIMIT = 2**53


def _fmt(value, spec: str = ",.0f", unit: str = "") -> str:
    """``value`` for the analyze table: ``spec`` below 2**53 in magnitude, 6 significant
    digits (``.6g``) from there; ``"-"`` for ``None``."""
    if value is None:
        return "-"
    return f"{value:{spec if abs(value) < _EXACT_LIMIT else '.6g'}}{unit}"


def _analysis_table(d: dict) -> Table:
    table = Table(title="kvtier analyze", title_justify="default", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, show_edge=False)
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("", no_wrap=False)
    rows = [
        ("requests", f"{d['requests']:,}", ""),
        ("block references", f"{d['block_refs']:,}", ""),
        ("distinct blocks", f"{d['distinct_blocks']:,}",
         f"re-refs {d['reuse_refs']:,} = {d['reuse_refs'] / max(1, d['block_refs']):.1%} of "
         "refs (unbounded tier, get)"),
        ("one-hit wonders", f"{d['one_hit_share']:.1%}",
         f"{counted(d['one_hit_blocks'], 'distinct block')} referenced once"),
    ]
    rd = d["reuse_distance_blocks"]
    rows.append(("reuse distance (blocks)",
                 f"p50 {_fmt(rd['p50'])}",
                 f"p90 {_fmt(rd['p90'])}, p99 {_fmt(rd['p99'])}, max {_fmt(rd['max'])}, "
                 f"mean {_fmt(rd['mean'])}"))
    for row in rd["lru_get_protocol"]:
        rows.append((f"  LRU hit ratio at {row['capacity_pct']:g}%",
                     f"{row['hit_ratio']:.2%}",
                     f"{counted(row['capacity_blocks'], 'block')}, get protocol"))
    sd = d["sharing_depth_blocks"]
    rows.append(("prefix-sharing depth (blocks)", f"p50 {_fmt(sd['p50'])}",
                 f"p90 {_fmt(sd['p90'])}, p99 {_fmt(sd['p99'])}, max {_fmt(sd['max'])}; "
                 f"{sd['requests_sharing_share']:.1%} of requests > 0"))
    rows.append(("  shared prefix blocks", f"{sd['shared_block_share']:.2%}",
                 f"{counted(sd['shared_blocks'], 'ref')} (unbounded tier, prefix)"))
    rt = d["reuse_time_s"]
    if rt is None:
        rows.append(("time between reuses", "-", "no timestamps in this trace"))
    else:
        rows.append(("time between reuses (s)", f"p50 {_fmt(rt['p50'], ',.1f')}",
                     f"p90 {_fmt(rt['p90'], ',.1f')}, p99 {_fmt(rt['p99'], ',.1f')}, "
                     f"max {_fmt(rt['max'], ',.1f')}"))
    ws = d["working_set"]
    dw = ws["distinct_per_window"]
    unit = ("s" if ws["window_unit"] == "s"
            else " request" if ws["window"] == 1 else " requests")
    empty = ws.get("empty_windows", 0)
    rows.append((f"working set per {ws['window']:g}{unit}", f"p50 {_fmt(dw['p50'])}",
                 f"min {_fmt(dw['min'])}, max {_fmt(dw['max'])} distinct blocks, "
                 f"{counted(ws['windows'], 'window')}"
                 + (f"; {_fmt(empty, ',')} empty window{'' if empty == 1 else 's'} (no "
                    "request arrived) skipped, not in these figures" if empty else "")))
    for row in rows:
        table.add_row(*row)
    return table


def _analyze(trace, fmt, block_tokens, skip_bad_lines, limit, window_s, window_requests, plot,
             json_out, progress, strict=False) -> None:
    from kvtier.analyze import analyze, plot_analysis

    path = trace if trace is not None else embedded_sample_path()
    if fmt not in FORMATS:
        raise _CliError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    # None: not given (the working set's window option that does not fit the trace is
    # warned about below, not ignored in silence)
    given_s, given_requests = window_s is not None, window_requests is not None
    window_s = 60.0 if window_s is None else window_s
    window_requests = 1000 if window_requests is None else window_requests
    _check_writable(json_out, "--json", path)
    _check_distinct_outputs(json_out, plot)
    if plot is not None:
        _check_writable(plot, "--plot", path)
        _check_plot_format(plot)
    reader = TraceOptions(fmt=fmt, block_tokens=block_tokens, skip_bad_lines=skip_bad_lines,
                          strict=strict).open(path)
    it = _limited(reader, limit) if limit else reader
    if progress is None:
        try:
            progress = Path(path).stat().st_size >= _AUTO_PROGRESS_BYTES
        except OSError:
            progress = False
    bar = (Progress(TextColumn("[bold]analyze"), BarColumn(), TextColumn("{task.completed:,} "
                    "requests"), TimeElapsedColumn(), console=_err, transient=True)
           if progress else None)
    t0 = time.perf_counter()
    with bar if bar is not None else nullcontext():
        task = bar.add_task("analyze", total=None) if bar is not None else None
        result = analyze(it, window_s=window_s, window_requests=window_requests,
                         progress=(lambda n: bar.advance(task, n)) if bar is not None else None)
    elapsed = time.perf_counter() - t0
    if given_requests and result.has_timestamps:
        _warn(f"--window-requests {window_requests} is for traces without timestamps; this one "
              f"has them, so the working set is per --window-s {window_s:g} s")
    elif given_s and not result.has_timestamps:
        _warn(f"--window-s {window_s:g} is for traces with timestamps; this one is read "
              f"without (its first request has none), so the working set is per "
              f"--window-requests {window_requests} "
              f"{'request' if window_requests == 1 else 'requests'}")
    d = result.to_dict()
    out = _out_console(json_out)
    out.print(_analysis_table(d))
    shown = "<stdin>" if str(path) == "-" else str(path)  # as replay and sweep name it
    name = shown
    if name == str(embedded_sample_path()):
        name = f"embedded sample {Path(name).name}"
    caption = (f"{name} ({reader.fmt}): analyzed in {elapsed:,.2f} s (parsing included)")
    if reader.bad_lines:
        caption += f"; {counted(reader.bad_lines, 'bad line')} skipped"
    out.print(caption, highlight=False, markup=False, soft_wrap=True)
    _write_json(json_out, {"trace": {"path": shown, "format": reader.fmt,
                                     "bad_lines": reader.bad_lines,
                                     "length_mismatches": reader.length_mismatches,
                                     "analyze_s": elapsed},
                           "analysis": d, "plot": str(plot) if plot else None})
    if plot is not None:
        try:
            plot_analysis(result, plot, title=f"{Path(shown).name}: "
                          f"{counted(d['requests'], 'request')}, "
                          f"{counted(d['block_refs'], 'block ref')}, "
                          f"{d['distinct_blocks']:,} distinct")
        except OSError as exc:
            raise _CliError(f"cannot write plot to {plot}: {exc}") from None
        out.print(f"distributions written to {plot}", highlight=False, markup=False,
                  soft_wrap=True)


# -- sweep ---------------------------------------------------------------------------------
@app.command("sweep")
def sweep_cmd(
    trace: TraceArg = None,
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", "-p", help="Policies to compare; repeat or comma-separate. "
                               "Default: every registered policy.")] = None,
    points: Annotated[Optional[int], typer.Option(
        "--points", min=1, parser=_count_option(1, "capacities"),
        help="Capacities in the log-spaced grid.  \\[default: 12]")] = None,
    cap_min: Annotated[Optional[str], typer.Option(
        "--min", help="Smallest capacity of the grid (blocks or %).  \\[default: 0.5%]")] = None,
    cap_max: Annotated[Optional[str], typer.Option(
        "--max", help="Largest capacity of the grid (blocks or %).  \\[default: 100%]")] = None,
    capacity: Annotated[Optional[list[str]], typer.Option(
        "--capacity", "-c", help="Explicit capacities instead of the grid.")] = None,
    fmt: FormatOpt = "auto",
    block_tokens: BlockTokensOpt = 512,
    inflight: InflightOpt = 0,
    protocol: ProtocolOpt = "prefix",
    store_threshold: ThresholdOpt = 1,
    admission: AdmissionOpt = "all",
    skip_bad_lines: SkipOpt = False,
    strict: StrictOpt = False,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1,
                                                 parser=_count_option(1, "requests"),
                                                 help="Replay only the first N requests.")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Draw the miss-ratio curves to this image file (the suffix picks "
                       "matplotlib's format, e.g. .png, .svg). Default: no image.")] = None,
    json_out: JsonOpt = None,
    workers: Annotated[Optional[int], typer.Option("--workers", "-j", min=1,
                                                   parser=_count_option(1, "processes"),
                                                   help="Processes (default: one per core).")] = None,
    progress: ProgressOpt = None,
) -> None:
    """Miss-ratio curves: a log-spaced grid of capacities for several policies.

    One process per core; prints the table, writes --json and, with --plot, the image.
    """
    try:
        trace_opts, replay_opts = _options(fmt, block_tokens, skip_bad_lines, strict, inflight,
                                           protocol, store_threshold, admission)
        command = SweepCommand(
            source=TraceSource(trace if trace is not None else embedded_sample_path(),
                               trace_opts, limit),
            policies=tuple(_split(policy, available_policies(), "--policy")),
            capacities=tuple(_split(capacity, [], "--capacity")),
            points=points, cap_min=cap_min, cap_max=cap_max,
            replay=replay_opts,
            output=OutputOptions(json_out, progress),
            plot=plot,
            workers=workers,
        )
        with _warnings_to_stderr():
            run_sweep(command)
    except (_CliError, TraceFormatError, ValueError, OSError) as exc:
        raise _fail(exc) from None
    except _Interrupted:
        raise typer.Exit(128 + signal.SIGINT) from None


def run_sweep(cmd: SweepCommand) -> list[ReplayResult]:
    """Run ``kvtier sweep`` as ``cmd`` says: print the table, write the JSON and the plot,
    return the results. Raises the errors the command reports."""
    from kvtier.replay import log_grid
    from kvtier.sweep import plot_mrc, run_grid

    _check_policies(cmd.policies)
    _check_writable(cmd.output.json, "--json", cmd.source.path)
    _check_distinct_outputs(cmd.output.json, cmd.plot)
    if cmd.plot is not None:
        _check_writable(cmd.plot, "--plot", cmd.source.path)
        _check_plot_format(cmd.plot)
    if cmd.capacities:
        grid = [name for name, value in
                (("--points", cmd.points), ("--min", cmd.cap_min), ("--max", cmd.cap_max))
                if value is not None]
        if grid:
            verb = "sets" if len(grid) == 1 else "set"
            raise _CliError(f"{', '.join(grid)} {verb} the log-spaced grid; with --capacity "
                            "there is no grid (give one or the other)")
    points = 12 if cmd.points is None else cmd.points
    cap_min = "0.5%" if cmd.cap_min is None else cmd.cap_min
    cap_max = "100%" if cmd.cap_max is None else cmd.cap_max
    if not cmd.capacities:
        # two block counts are compared before the trace is read (a percentage needs the
        # trace's distinct blocks; a bad spec is reported after the trace is read, as before)
        try:
            lo, hi = parse_capacity(cap_min), parse_capacity(cap_max)
        except ValueError:
            pass
        else:
            _check_range(cap_min, lo, cap_max, hi)
    with _rereadable(cmd.source, needed=True) as source:
        path = source.path
        try:
            reader, it = source.open()
            t0 = time.perf_counter()
            n_req, n_refs, unique = count_unique_blocks(it)
        except KeyboardInterrupt:
            _warn("interrupted while reading the trace: nothing was replayed")
            raise _Interrupted from None
        info = _trace_info(cmd.source.path, reader, n_req, n_refs, unique,
                           time.perf_counter() - t0)
        if cmd.capacities:
            capacities = sorted(_capacities(cmd.capacities, unique))
        else:
            # both checked, and the range, before any warning: `--min 10 --max 5` on a
            # trace of 4 distinct blocks warned that 10 and 5 blocks exceed the trace, then
            # failed on the range (warnings about a run that never happened)
            lo, hi = _capacity(cap_min, unique), _capacity(cap_max, unique)
            _check_range(cap_min, lo, cap_max, hi)
            # with --points 1 the grid is --max alone: --min is checked, not run nor warned
            # about (it said "capacity 0.5% gives 0 blocks ...: run at 1 block")
            if points != 1:
                _warn_capacity(cap_min, lo, unique)
            _warn_capacity(cap_max, hi, unique)
            capacities = log_grid(lo, hi, points)
            if len(capacities) < points:  # log_grid returns distinct sizes only
                _warn(f"--points {points}: {lo}..{hi} blocks hold only "
                      f"{counted(len(capacities), 'distinct size')}; sweeping those")
        n_workers = cmd.workers or os.cpu_count() or 1
        n_points = len(cmd.policies) * len(capacities)
        finished: list[ReplayResult] = []
        interrupted = False
        bar = _progress(cmd.output.progress, n_refs * n_points)
        try:
            with bar if bar is not None else nullcontext():
                procs = min(n_workers, n_points)
                task = (bar.add_task(f"sweep ({procs} process{'' if procs == 1 else 'es'})",
                                     total=n_points) if bar is not None else None)

                def on_result(r: ReplayResult) -> None:
                    finished.append(r)
                    if bar is not None:
                        bar.advance(task)

                results = run_grid(path, cmd.policies, capacities, trace=source.options,
                                   options=cmd.replay, workers=n_workers, on_result=on_result,
                                   limit=cmd.source.limit)
        except KeyboardInterrupt:
            interrupted = True
            order = {(p, c): i for i, (p, c) in
                     enumerate((p, c) for p in cmd.policies for c in capacities)}
            results = sorted(finished, key=lambda r: order[(r.policy, r.capacity)])
    path = cmd.source.path
    opts = cmd.replay
    # the table and the JSON first: a failing plot must not lose the results
    out = _out_console(cmd.output.json)
    out.print(_results_table(results, f"kvtier sweep — protocol {opts.protocol}, "
                                      f"in-flight window {opts.inflight}"
                                      + (f", admission {opts.admission}"
                                         if opts.admission != "all" else ""), out))
    out.print(_trace_caption(info), highlight=False, markup=False, soft_wrap=True)
    payload = {"trace": info, "capacities": capacities,
               "plot": None if cmd.plot is None else str(cmd.plot),
               "results": [r.to_dict() for r in results]}
    if interrupted:
        payload["interrupted"] = True
    _write_json(cmd.output.json, payload)
    if interrupted:
        _warn(_interrupted_note(len(results), n_points, "grid point") + " (no plot drawn)")
        raise _Interrupted
    if cmd.plot is None:
        out.print("no image written (--plot FILE.png draws the miss-ratio curves)",
                  highlight=False)
        return results
    shown = "<stdin>" if str(path) == "-" else Path(path).name
    title = (f"{shown}: {counted(n_req, 'request')}, {counted(n_refs, 'block ref')}, "
             f"{counted(unique, 'distinct block')}\nprotocol {opts.protocol}, "
             f"in-flight window {opts.inflight}"
             + (f", admission {opts.admission}" if opts.admission != "all" else ""))
    try:
        plot_mrc(results, cmd.plot, title=title, unique_blocks=unique, block_refs=n_refs)
    except OSError as exc:
        raise _CliError(f"cannot write plot to {cmd.plot}: {exc}") from None
    out.print(f"miss-ratio curves written to {cmd.plot}", highlight=False, markup=False,
              soft_wrap=True)
    return results


# -- shared-trace --------------------------------------------------------------------------
@app.command("shared-trace")
def shared_trace_cmd() -> None:
    """Print the full shared trace's path, for
    export KVTIER_SHARED_TRACE=$(kvtier shared-trace) in a development checkout.

    $KVTIER_SHARED_TRACE when set, else the first shared/traces/mooncake_conversation.jsonl
    in a folder above the current one (kvtier.trace.find_shared_trace, the look-up the tests,
    scripts/ and benchmarks/ use). A command, not python -c, so that it works in any folder
    of the checkout (in src/kvtier, python -c imports kvtier/types.py as the standard
    library's types). Exit status 1, nothing printed, when that file is not there.
    """
    path = find_shared_trace(".")
    if not path.is_file():
        env = os.environ.get("KVTIER_SHARED_TRACE")
        if env:
            reason = f"KVTIER_SHARED_TRACE={env!r} is not a file"
        else:
            reason = (f"no shared/traces/mooncake_conversation.jsonl in a folder above "
                      f"{Path.cwd()}; set KVTIER_SHARED_TRACE to the trace's path")
        raise _fail(_CliError(reason))
    print(path)


def _fold_help(doc: str | None) -> str | None:
    """A command docstring for typer's rich help: the hard line breaks inside each paragraph
    become spaces (typer keeps them, and rich then wraps the broken lines a second time)."""
    if not doc:
        return doc
    return "\n\n".join(" ".join(p.split("\n")) for p in inspect.cleandoc(doc).split("\n\n"))


for _command in app.registered_commands:
    _command.callback.__doc__ = _fold_help(_command.callback.__doc__)
del _command


if __name__ == "__main__":  # pragma: no cover
    app()
