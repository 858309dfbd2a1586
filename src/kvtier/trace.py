"""Streaming readers for request traces: Mooncake JSONL, token-id JSONL and plain text/CSV.

Every reader yields one :class:`Request` per request line, in file order, and holds only the
current line in memory, so a trace larger than memory can be replayed. gzip and zstd files
are recognised by their magic bytes (not their name) and decompressed on the fly.

Formats (``fmt``):

``"mooncake"``
    The Mooncake FAST'25 trace release (kvcache-ai/Mooncake, ``FAST25-release/traces``): one
    JSON object per line with ``hash_ids`` (list of ints, the request's prefix blocks, 512
    tokens each), ``input_length`` (tokens, required), ``output_length`` (tokens) and
    ``timestamp`` (ms). The ``hash_ids`` are used as block keys as they are.
``"tokens"``
    One JSON object per line with ``token_ids`` (list of ints >= 0). kvtier chains the block
    keys itself with :func:`chain_block_hashes`; a trailing partial block is not cacheable
    and gets no key. ``input_length``, if given, must equal ``len(token_ids)``.
``"jsonl"``
    Either of the two above, decided per line (``hash_ids`` wins when both are present).
``"text"``
    One request per line; its block keys separated by spaces and/or commas. A key written as a
    canonical ASCII decimal integer (``0``, ``17``, ``-3``) becomes an ``int``; any other key
    stays a ``str`` (so ``01`` and ``1`` are different keys). Lines starting with ``#`` are
    comments (a ``#`` later in a line is an ordinary key character). Lengths and timestamps
    are ``None``.
``"auto"``
    ``.jsonl`` / ``.json`` / ``.ndjson`` -> ``"jsonl"``; ``.txt`` / ``.csv`` / ``.tsv`` ->
    ``"text"`` (after stripping ``.gz`` / ``.zst``); otherwise the first non-blank line
    decides (``{`` -> ``"jsonl"``, a list of keys -> ``"text"``).

Blank lines are ignored in every format. Bad input raises :class:`TraceFormatError` naming
the file, the line and the rule broken; with ``skip_bad_lines=True`` bad lines are skipped and
counted in :attr:`TraceReader.bad_lines` instead. A line that is not UTF-8 is a bad line like
any other (reported at its own line number). A trace with no request at all is an error.

Mooncake lines carry both ``input_length`` (tokens) and ``hash_ids`` (one per block, the last
one possibly partial), so at ``block_tokens`` = B a line should have ``ceil(input_length / B)``
hash ids (all 12,031 lines of the conversation trace do at B = 512). Lines that do not are
counted (:attr:`TraceReader.length_mismatches`) and, once per pass over the file, a
:class:`TraceWarning` says how many disagree and which block size fits most of them: token hit
ratios are then not meaningful at this B, block hit ratios still are (some traces have blocks
of varying token counts). With ``strict=True`` the first such line is an error.

A block hash names its whole prefix, so one request cannot name the same hash twice
(``"hash_ids": [1, 1, 1]``). Such requests are replayed as given, counted
(:attr:`TraceReader.repeated_hash_requests`) and, once per pass, a :class:`TraceWarning` says
how many there are; with ``strict=True`` the first such line is an error.

The path ``"-"`` reads standard input (as does ``/dev/stdin``), compressed or not; it can be
read once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import sys
import warnings
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, NamedTuple

from kvtier.checks import check_bool, check_positive_int, counted

__all__ = [
    "FORMATS",
    "SHARED_TRACE_NAME",
    "Request",
    "TraceFormatError",
    "TraceOptions",
    "TraceReader",
    "TraceWarning",
    "chain_block_hashes",
    "count_unique_blocks",
    "embedded_sample_path",
    "find_shared_trace",
    "read_trace",
]

FORMATS = ("auto", "jsonl", "mooncake", "tokens", "text")
"""Accepted values of ``fmt``."""

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_EMBEDDED_NAME = "mooncake_conversation_500.jsonl.gz"
_JSON_SUFFIXES = {".jsonl", ".json", ".ndjson"}
_TEXT_SUFFIXES = {".txt", ".csv", ".tsv"}
_SPLIT = re.compile(r"[\s,]+")
_ROOT_HASH = b"\x00" * 8
_STDIN_NAMES = ("-",)
# block sizes tried when a Mooncake trace's lengths disagree with block_tokens
_CANDIDATE_BLOCK_TOKENS = tuple(2**k for k in range(17))
_INF = float("inf")  # a timestamp must be below it (JSON 1e400 parses as inf)
_MAX_FLOAT = sys.float_info.max  # and a JSON int timestamp at most this (a float holds it)


class TraceWarning(UserWarning):
    """A trace is readable but something in it makes some results questionable (see
    :class:`TraceReader`); ``strict=True`` turns it into :class:`TraceFormatError`."""


class Request(NamedTuple):
    """One request of a trace.

    Attributes:
        keys: the request's block keys, head of the prompt first (ints for Mooncake and
            token traces; ints or strs for text traces). One key per block of
            ``block_tokens`` tokens.
        input_length: prompt length in tokens, or ``None`` when the format has none (text).
        output_length: generated length in tokens, or ``None``.
        timestamp: arrival time in ms since the trace start, or ``None``.
    """

    keys: list
    input_length: int | None
    output_length: int | None
    timestamp: float | None


def not_a_request(
    exc: AttributeError, req: object, index: int, fields: tuple[str, ...], caller: str
) -> TypeError | None:
    """The error for a request object missing one of ``fields`` (an AttributeError ``exc``
    raised while reading request number ``index``, ``req``), or ``None`` when ``exc`` came
    from elsewhere (then the caller re-raises it). Shared by :func:`kvtier.replay.replay` and
    :func:`kvtier.analyze.analyze`, whose usual mistake is a bare key list."""
    if exc.name not in fields or getattr(exc, "obj", req) is not req:
        return None
    return TypeError(
        f"request {index} ({req!r:.60}) has no .{exc.name}: {caller}() takes Request "
        "objects (kvtier.trace.Request(keys, input_length, output_length, timestamp)), not "
        "bare key lists"
    )


class TraceFormatError(ValueError):
    """Bad trace input. The message names the file, the line (1-based) and the rule broken.

    Attributes:
        path: the trace file.
        line: 1-based line number, or ``None`` for whole-file problems (empty file, unknown
            format, bad compression).
        reason: the rule broken, without the location.
    """

    def __init__(self, path: str | os.PathLike, line: int | None, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # pickled by sweep's worker processes: rebuilt from its fields
        return (type(self), (self.path, self.line, self.reason))


def embedded_sample_path() -> Path:
    """Path of the trace shipped inside the package.

    The first 500 requests (14,162 block references, 11,879 distinct blocks) of the Mooncake
    FAST'25 conversation trace (kvcache-ai/Mooncake, ``FAST25-release/traces/
    conversation_trace.jsonl``, Apache-2.0), gzip-compressed Mooncake JSONL.
    """
    return Path(str(resources.files("kvtier").joinpath("data", _EMBEDDED_NAME)))


SHARED_TRACE_NAME = Path("shared", "traces", "mooncake_conversation.jsonl")


def find_shared_trace(start: Path | str) -> Path:
    """Path of the full Mooncake conversation trace in the development layout.

    ``$KVTIER_SHARED_TRACE`` when set; else the first ``shared/traces/
    mooncake_conversation.jsonl`` found in a parent directory of ``start`` (a checkout's
    ``../shared``, or a git worktree's ``../../shared``); else ``start``'s
    ``../shared/traces/mooncake_conversation.jsonl``, which does not exist: callers test
    ``.is_file()`` and fall back to :func:`embedded_sample_path` or skip. Used by the tests,
    ``scripts/`` and ``benchmarks/``; the library itself never reads it.
    """
    env = os.environ.get("KVTIER_SHARED_TRACE")
    if env:
        return Path(env)
    parents = Path(start).resolve().parents
    for parent in parents:
        candidate = parent / SHARED_TRACE_NAME
        if candidate.is_file():
            return candidate
    return parents[0] / SHARED_TRACE_NAME


_LOW_HALF_BYTES = bytes(range(0x80))


def chain_block_hashes(token_ids: list[int], block_tokens: int = 512) -> list[int]:
    """Prefix-chained block keys of a token sequence, as vLLM's prefix caching chains them.

    Block ``i`` covers tokens ``[i*B, (i+1)*B)`` with ``B = block_tokens``; only full blocks
    get a key (a trailing partial block is not cacheable). With ``h_{-1}`` = 8 zero bytes::

        h_i = BLAKE2b(digest_size=8)( h_{i-1} || tokens of block i as int64 little-endian )

    and the key is ``h_i`` read as an unsigned big-endian int (0 <= key < 2**64). Because each
    hash covers its parent's, equal keys mean equal whole prefixes, and the keys are the same
    in every process and on every machine (unlike Python's ``hash``).

    Args:
        token_ids: token ids, ints in ``[0, 2**63)``.
        block_tokens: tokens per block (>= 1).

    Returns:
        ``len(token_ids) // block_tokens`` keys.

    Raises:
        OverflowError / TypeError: a token id is not an int in range (named, with its
            position).
        ValueError: ``block_tokens`` is not an int >= 1, or a token id of a full block is
            negative.
    """
    if type(block_tokens) is not int or block_tokens < 1:  # (the usual int: one test)
        # numpy integers are taken, as by the readers (check_positive_int); bools are not
        block_tokens = check_positive_int("block_tokens", block_tokens, "tokens")
    n_full = len(token_ids) // block_tokens
    if n_full == 0:
        return []
    try:
        data = array("q", token_ids[: n_full * block_tokens])
    except (OverflowError, TypeError) as exc:  # name the id (the error path only)
        for i, token in enumerate(token_ids[: n_full * block_tokens]):
            try:
                array("q", [token])
            except (OverflowError, TypeError):
                raise type(exc)(f"token ids must be ints in [0, 2**63), found {token!r} at "
                                f"position {i}") from None
        raise
    if sys.byteorder != "little":
        data.byteswap()
    raw = data.tobytes()
    # a negative id has the top bit of its last (little-endian) byte set; C-level slicing and
    # translate, not a Python pass (docs/performance.md, "Token-id hashing": min() +30 %)
    if raw[7::8].translate(None, _LOW_HALF_BYTES):
        raise ValueError(f"token ids must be ints >= 0, found {min(data)}")
    step = block_tokens * 8
    blake = hashlib.blake2b
    parent = _ROOT_HASH
    keys = []
    for start in range(0, n_full * step, step):
        parent = blake(parent + raw[start : start + step], digest_size=8).digest()
        keys.append(int.from_bytes(parent, "big"))
    return keys


class _ZstdReader(io.RawIOBase):
    """Decompress a zstd file frame after frame, failing loudly on damage.

    ``zstandard``'s ``stream_reader`` returns the data of a truncated file as if the file
    ended there; a trace cut short would then replay silently. Here a file that ends inside a
    frame raises ``EOFError``, and a corrupt frame ``OSError``.
    """

    _CHUNK = 1 << 16  # compressed bytes read at a time

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self._raw = raw
        self._zstd = zstandard
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = None  # decompressor of the frame being read
        self._out = memoryview(b"")
        self._carry = b""  # compressed bytes after the end of the last frame

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while not self._out:
            data = self._carry or self._raw.read(self._CHUNK)
            self._carry = b""
            if not data:
                if self._frame is not None:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            try:
                self._out = memoryview(self._frame.decompress(data))
            except self._zstd.ZstdError as exc:
                raise OSError(f"corrupt zstd data: {exc}") from None
            if self._frame.eof:
                self._carry = self._frame.unused_data
                self._frame = None
        size = min(len(buffer), len(self._out))
        buffer[:size] = self._out[:size]
        self._out = self._out[size:]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Prefixed(io.RawIOBase):
    """The bytes ``head`` then the rest of ``raw``: magic-byte sniffing on a stream that
    cannot seek (a pipe)."""

    def __init__(self, head: bytes, raw: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_binary(path: Path) -> IO[bytes]:
    """Open ``path`` (``-``: standard input) for reading bytes, decompressing gzip / zstd by
    magic bytes. Works on pipes: nothing is read twice."""
    if str(path) in _STDIN_NAMES:
        raw: IO[bytes] = open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the returned stream
    try:
        if raw.seekable():
            head = raw.read(4)
            raw.seek(0)
        else:
            head = raw.read(4)  # blocks until 4 bytes or the end
            raw = io.BufferedReader(_Prefixed(head, raw))
        if head[:2] == _GZIP_MAGIC:
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            stream.myfileobj = raw  # GzipFile.close() then closes the file too
            return stream  # type: ignore[return-value]
        if head == _ZSTD_MAGIC:
            return io.BufferedReader(_ZstdReader(raw))
        return raw
    except BaseException:
        raw.close()
        raise


def _strip_compression_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in (".gz", ".gzip", ".zst", ".zstd"):
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _bad_length(value: object) -> bool:
    return type(value) is not int or value < 0


class TraceReader:
    """A streaming iterator of :class:`Request` over one trace file (see module docstring).

    ``next()`` continues the current pass over the file. ``iter()`` on a reader whose pass
    has ended (all requests read, or an error) opens the file again and starts a new pass
    from the first line (the counts restart), so a second ``replay(reader)`` replays the whole
    trace again; standard input cannot be read twice and raises ``TraceFormatError`` instead.

    Attributes:
        path: the trace file.
        fmt: the format asked for (``"auto"`` until the file is opened, then the one used).
        block_tokens: tokens per block (for ``"tokens"``; recorded for the others).
        skip_bad_lines: skip and count bad lines instead of raising.
        requests: requests yielded so far.
        block_refs: block references (keys) yielded so far.
        bad_lines: bad lines skipped so far.
        lines: lines read so far.
        length_mismatches: Mooncake lines whose ``input_length`` needs another number of
            blocks of ``block_tokens`` than they have ``hash_ids`` (see the module docstring).
        fitting_block_tokens: after a pass with mismatches, ``(B, lines)``: the block size
            (a power of two up to 65,536) that fits the most of the lines that disagree, and
            how many of them it fits; else ``None``.
        repeated_hash_requests: requests whose ``hash_ids`` name one hash more than once
            (replayed as given; see the module docstring).
        strict: mismatches and repeated hashes are errors instead of a warning.

    Thread safety: none; a reader is one pass at a time on one thread (two threads
    iterating one reader interleave its lines). Open one reader per thread, or per process as
    ``kvtier sweep``'s workers do.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fmt: str = "auto",
        block_tokens: int = 512,
        skip_bad_lines: bool = False,
        strict: bool = False,
    ) -> None:
        if fmt not in FORMATS:
            raise TraceFormatError(
                path, None, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}"
            )
        block_tokens = check_positive_int("block_tokens", block_tokens, "tokens")
        skip_bad_lines = check_bool("skip_bad_lines", skip_bad_lines)
        strict = check_bool("strict", strict)
        self.path = Path(path)
        self.fmt = fmt
        self.block_tokens = block_tokens
        self.skip_bad_lines = skip_bad_lines
        self.strict = strict
        self.requests = 0
        self.block_refs = 0
        self.bad_lines = 0
        self.lines = 0
        self.length_mismatches = 0
        self.fitting_block_tokens: tuple[int, int] | None = None
        self.repeated_hash_requests = 0
        self._first_repeat: int | None = None  # line of the first such request this pass
        self._repeat_warned = False
        self._gen: Iterator[Request] | None = None
        self._mismatched: dict[tuple[int, int], int] | None = None
        self._reported = False
        self._longest_tokens = -1  # most token_ids of a line this pass; -1: no such line
        self._passes = 0  # passes started
        self._ended = False  # the current pass ended (exhausted or failed)

    def __iter__(self) -> TraceReader:
        if self._ended:
            self._restart()
        return self

    def __next__(self) -> Request:
        if self._gen is None:
            self._restart()
        try:
            return next(self._gen)  # type: ignore[arg-type]
        except BaseException:
            self._ended = True
            raise

    def _restart(self) -> None:
        if self._passes and str(self.path) in _STDIN_NAMES:
            raise TraceFormatError(
                "<stdin>", None, "standard input can be read only once; save the trace to a "
                "file to read it again"
            )
        self._passes += 1
        self._ended = False
        self.requests = self.block_refs = self.bad_lines = self.lines = 0
        self.length_mismatches = 0
        self.fitting_block_tokens = None
        self.repeated_hash_requests = 0
        self._first_repeat = None
        self._repeat_warned = False
        self._mismatched = None
        self._reported = False  # this pass's length warning was given
        self._longest_tokens = -1
        self._gen = self._generate()

    # -- internals -----------------------------------------------------------------------
    def _resolve_format(self, first_line: str | None) -> str:
        if self.fmt != "auto":
            return self.fmt
        suffix = _strip_compression_suffix(self.path)
        if suffix in _JSON_SUFFIXES:
            return "jsonl"
        if suffix in _TEXT_SUFFIXES:
            return "text"
        if first_line is None:
            return "text"  # empty: reported as empty below
        stripped = first_line.strip()
        if stripped.startswith("{"):
            return "jsonl"
        if stripped.startswith("#") or _looks_like_keys(stripped):
            return "text"
        raise TraceFormatError(
            self.path,
            None,
            "unknown format: the first line is neither a JSON object nor a list of block "
            "keys; pass fmt= one of " + ", ".join(FORMATS[1:]),
        )

    def _generate(self) -> Iterator[Request]:
        path = self.path
        shown = "<stdin>" if str(path) in _STDIN_NAMES else path
        try:
            fh = _open_binary(path)
        except FileNotFoundError:
            raise TraceFormatError(path, None, "no such file") from None
        except IsADirectoryError:
            raise TraceFormatError(path, None, "is a directory, not a trace file") from None
        # Undecodable bytes become lone surrogates (surrogateescape) instead of failing the
        # whole chunk being decoded at a wrong line; each non-ASCII line is checked on its
        # own (str.isascii is O(1)), so a bad byte is one bad line at its own number.
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline=None)
        with text:
            lines = _numbered_lines(text, shown)
            first = None
            for lineno, line in lines:
                if line.strip():
                    first = (lineno, line)
                    break
            if first is not None and self.fmt == "auto" and not first[1].isascii():
                problem = _undecodable(first[1])
                if problem:
                    raise TraceFormatError(
                        shown, first[0], f"not UTF-8 text ({problem}): a binary file or an "
                        "unsupported compression?"
                    )
            fmt = self._resolve_format(None if first is None else first[1])
            self.fmt = fmt
            if first is None:
                raise TraceFormatError(shown, None, "empty trace: no request lines")
            parse = self._parser(fmt)
            skip = self.skip_bad_lines
            pending = [first]
            for source in (pending, lines):
                for lineno, line in source:
                    self.lines = lineno
                    if not line or line.isspace():
                        continue
                    try:
                        if not line.isascii():
                            problem = _undecodable(line)
                            if problem:
                                raise _LineError(f"not UTF-8 text ({problem})")
                        req = parse(line)
                    except _LineError as exc:
                        if skip:
                            self.bad_lines += 1
                            self._uncount_mismatch(lineno)
                            continue
                        raise TraceFormatError(shown, lineno, str(exc)) from None
                    if req is None:  # comment
                        continue
                    self.requests += 1
                    self.block_refs += len(req.keys)
                    yield req
        if self.requests == 0:
            if self.bad_lines:
                raise TraceFormatError(
                    shown, None, "no valid request: "
                    + (f"all {self.bad_lines:,} request lines are bad" if self.bad_lines > 1
                       else "its one request line is bad")
                )
            raise TraceFormatError(shown, None, "empty trace: no request lines")
        self._report_lengths(shown)

    def _uncount_mismatch(self, lineno: int) -> None:
        """A line skipped as bad is no request: take back the length mismatch the parser
        counted for it before a later check refused it (error path only)."""
        last = self._last_mismatch
        if last is None or last[0] != lineno:
            return
        pair = last[1]
        mismatched = self._mismatched
        mismatched[pair] -= 1
        if not mismatched[pair]:
            del mismatched[pair]
        if self._first_mismatch == lineno:  # this line set it: no earlier mismatch
            self._first_mismatch = None
        self._last_mismatch = None

    def report_lengths(self) -> None:
        """Warn now about the lines of the current pass so far whose ``input_length``
        disagrees with ``block_tokens`` (and set :attr:`length_mismatches` and
        :attr:`fitting_block_tokens`), for a pass stopped before the end of the file (e.g.
        ``--limit``); a pass that reaches the end does this by itself. At most one warning
        per pass; nothing before the first request was read."""
        if self._gen is None or getattr(self, "_mismatched", None) is None:
            return
        self._report_lengths("<stdin>" if str(self.path) in _STDIN_NAMES else self.path)

    def _report_lengths(self, shown: object) -> None:
        """Count, and warn once per pass about, Mooncake lines whose length disagrees with
        block_tokens; and warn when the token_ids lines gave no block at all."""
        repeats = self.repeated_hash_requests
        if repeats and not self._repeat_warned:
            self._repeat_warned = True
            warnings.warn(
                f"{shown}: {repeats:,} of {counted(self.requests, 'request')} "
                + ("names a block hash twice in its hash_ids" if repeats == 1 else
                   "name a block hash twice in their hash_ids")
                + f" (first at line {self._first_repeat}), replayed as given; a hash names "
                "its whole prefix, so it cannot repeat within one request (a trace written "
                "with per-block instead of prefix hashes?). strict=True / --strict makes this "
                "an error.",
                TraceWarning, stacklevel=4,
            )
        longest = self._longest_tokens
        if 0 <= longest < self.block_tokens and not self.block_refs and self.requests:
            # a token_ids trace of short prompts at the default 512-token blocks: every
            # request names no block, so every tier hits 0 % (said before only by the
            # capacity warning's "0 distinct blocks")
            self._longest_tokens = -1  # once per pass
            bt = self.block_tokens
            warnings.warn(
                f"{shown}: "
                + (f"none of its {self.requests:,} requests has a" if self.requests > 1
                   else "its one request has no")
                + f" full block of {counted(bt, 'token')} (the longest token_ids has "
                f"{longest:,}): only full blocks get a key, "
                "so nothing can be stored or hit; a smaller --block-tokens (block_tokens=) "
                "gives them blocks (vLLM's default block size is 16 tokens)",
                TraceWarning, stacklevel=4,
            )
        pairs = self._mismatched
        bad = sum(pairs.values())
        self.length_mismatches = bad
        if not bad:
            return
        bt = self.block_tokens

        def fitting(b: int) -> int:
            return sum(c for (length, n), c in pairs.items() if (length + b - 1) // b == n)

        best = max(_CANDIDATE_BLOCK_TOKENS, key=fitting)  # ties: the smallest block size
        fits = fitting(best)
        self.fitting_block_tokens = (best, fits) if fits else None
        if self._reported:  # said already in this pass (report_lengths): counts updated only
            return
        self._reported = True
        if not self.block_refs:
            # every hash_ids is empty: "needs another number of 512-token blocks ... no
            # power-of-two block size fits" sent the user after --block-tokens, which no
            # value fixes (found by a newcomer pass)
            longest = max(length for length, _ in pairs)
            warnings.warn(
                f"{shown}: "
                + (f"every one of its {self.requests:,} requests has" if self.requests > 1
                   else "its one request has")
                + f" an empty hash_ids (input_length up to {counted(longest, 'token')}): no "
                "request names a block, so nothing can be stored or hit and every hit ratio "
                "is 0; a trace needs each request's block hashes in hash_ids (or its "
                "token_ids). strict=True / --strict makes this an error.",
                TraceWarning, stacklevel=4,
            )
            return
        hint = (f"; block size {best} fits {fits:,} of them (--block-tokens {best})" if fits
                else "; no power-of-two block size up to 65,536 fits any of them")
        warnings.warn(
            f"{shown}: {bad:,} of {counted(self.requests, 'request')} "
            + ("has an input_length that needs another number of "
               f"{bt}-token blocks than its hash_ids" if bad == 1 else
               "have an input_length that needs another number of "
               f"{bt}-token blocks than their hash_ids")
            + f" (first at line {self._first_mismatch})"
            f"{hint}. Token hit ratios assume {bt} tokens per block; block hit ratios are "
            "unaffected. strict=True / --strict makes this an error.",
            TraceWarning, stacklevel=4,
        )

    def _parser(self, fmt: str):
        loads = json.loads
        block_tokens = self.block_tokens
        strict = self.strict
        # (input_length, len(hash_ids)) -> lines, of the lines that disagree with block_tokens
        mismatched: dict[tuple[int, int], int] = {}
        self._mismatched = mismatched
        self._first_mismatch: int | None = None
        self._last_mismatch: tuple[int, tuple[int, int]] | None = None  # (line, pair)
        reader = self
        want_hash = fmt in ("mooncake", "jsonl")
        want_tokens = fmt in ("tokens", "jsonl")

        def parse_json(line: str) -> Request:
            try:
                obj = loads(line)
            except ValueError as exc:
                raise _LineError(f"not valid JSON ({exc})") from None
            if type(obj) is not dict:
                raise _LineError(f"expected a JSON object, got {type(obj).__name__}")
            ids = obj.get("hash_ids") if want_hash else None
            if ids is not None:
                if type(ids) is not list:
                    raise _LineError("'hash_ids' must be a list of ints")
                for h in ids:
                    if type(h) is not int:
                        raise _LineError(f"'hash_ids' must be a list of ints, found {h!r}")
                input_length = obj.get("input_length")
                if input_length is None:
                    raise _LineError("missing field 'input_length' (tokens)")
                if type(input_length) is not int or input_length < 0:  # before the arithmetic
                    raise _LineError(
                        f"'input_length' must be an int >= 0 (tokens), got {input_length!r}"
                    )
                if (input_length + block_tokens - 1) // block_tokens != len(ids):
                    if strict:
                        need = (input_length + block_tokens - 1) // block_tokens
                        raise _LineError(
                            f"'input_length' {input_length} needs {counted(need, 'block')} of "
                            f"{counted(block_tokens, 'token')} but 'hash_ids' has {len(ids)} "
                            "(--block-tokens sets the block size)"
                        )
                    pair = (input_length, len(ids))
                    mismatched[pair] = mismatched.get(pair, 0) + 1
                    if reader._first_mismatch is None:
                        reader._first_mismatch = reader.lines
                    # a later check of this line may still find it bad: _generate then
                    # takes this count back (_uncount_mismatch)
                    reader._last_mismatch = (reader.lines, pair)
                keys = ids
            else:
                tokens = obj.get("token_ids") if want_tokens else None
                if tokens is None:
                    if fmt == "mooncake":
                        raise _LineError("missing field 'hash_ids'")
                    if fmt == "tokens":
                        raise _LineError("missing field 'token_ids'")
                    raise _LineError("missing field: need 'hash_ids' or 'token_ids'")
                if type(tokens) is not list:
                    raise _LineError("'token_ids' must be a list of ints")
                for t in tokens:
                    if type(t) is not int or t < 0:
                        raise _LineError(
                            f"'token_ids' must be a list of ints >= 0, found {t!r}"
                        )
                try:
                    keys = chain_block_hashes(tokens, block_tokens)
                except OverflowError:
                    big = next(i for i, t in enumerate(tokens) if t >= 1 << 63)
                    raise _LineError(
                        f"token id {tokens[big]} (token {big}) does not fit in 63 bits"
                    ) from None
                input_length = obj.get("input_length", len(tokens))
                if _bad_length(input_length):
                    raise _LineError(
                        f"'input_length' must be an int >= 0 (tokens), got {input_length!r}"
                    )
                if input_length != len(tokens):
                    raise _LineError(
                        f"'input_length' {input_length} does not match the "
                        f"{len(tokens)} 'token_ids'"
                    )
                if input_length > reader._longest_tokens:
                    reader._longest_tokens = input_length
            output_length = obj.get("output_length")
            if output_length is not None and _bad_length(output_length):
                raise _LineError(
                    f"'output_length' must be an int >= 0 (tokens), got {output_length!r}"
                )
            ts = obj.get("timestamp")
            if ts is not None and (
                type(ts) not in (int, float) or not 0 <= ts < _INF  # NaN, inf (1e400)
                or ts > _MAX_FLOAT  # an int of 309+ digits (analyze, --cost: OverflowError)
            ):
                got = (f"an int of {len(str(ts)):,} digits, more than a float holds"
                       if type(ts) is int and ts > _MAX_FLOAT else repr(ts))
                raise _LineError(f"'timestamp' must be a finite number >= 0 (ms), got {got}")
            # after every check of the line, so a line skipped as bad is not counted;
            # O(len(hash_ids)), when reading only
            if ids is not None and len(ids) > 1 and len(set(ids)) != len(ids):
                if strict:
                    seen: set[int] = set()
                    twice = next(h for h in ids if h in seen or seen.add(h))
                    raise _LineError(
                        f"'hash_ids' names block hash {twice} twice: a hash names its whole "
                        "prefix, so it cannot repeat within one request"
                    )
                reader.repeated_hash_requests += 1
                if reader._first_repeat is None:
                    reader._first_repeat = reader.lines
            return Request(keys, input_length, output_length, ts)

        def parse_text(line: str) -> Request | None:
            stripped = line.strip()
            if stripped.startswith("#"):
                return None
            parts = _SPLIT.split(stripped)
            keys: list = []
            append = keys.append
            for part in parts:
                if not part:
                    raise _LineError("empty key (two separators in a row)")
                digits = part[1:] if part[0] == "-" else part
                if digits.isdecimal() and digits.isascii() and (
                    digits[0] != "0" or part == "0"
                ):  # canonical ASCII decimal: "01", "+1", "1_000" and "-0" stay strings
                    try:
                        append(int(part))
                    except ValueError:  # more digits than sys.get_int_max_str_digits()
                        raise _LineError(
                            f"key of {len(digits):,} digits: more than Python converts to an "
                            f"int ({sys.get_int_max_str_digits():,}, "
                            "sys.set_int_max_str_digits)") from None
                elif part[0] in "{[\"'":
                    raise _LineError(
                        f"{part[:20]!r} is not a block key (is this a JSON trace? read it "
                        "as jsonl: --format jsonl, or fmt='jsonl' in the API)"
                    )
                else:
                    append(part)
            return Request(keys, None, None, None)

        if fmt == "text":
            return parse_text
        return parse_json


class _LineError(Exception):
    """A rule broken by one line (internal; becomes TraceFormatError with the location)."""


def _numbered_lines(fh: IO[str], path: object) -> Iterator[tuple[int, str]]:
    lineno = 0
    try:
        for line in fh:
            lineno += 1
            yield lineno, line
    except (EOFError, OSError) as exc:  # truncated / corrupt gzip or zstd stream
        raise TraceFormatError(path, lineno + 1, f"cannot decompress: {exc}") from None


def _undecodable(line: str) -> str | None:
    """Where ``line`` (decoded with surrogateescape) held a byte that is not UTF-8, or None."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(line[exc.start]) - 0xDC00  # surrogateescape maps byte b to U+DC00 + b
        return f"byte 0x{byte:02x} at column {exc.start + 1}"
    return None


def _looks_like_keys(line: str) -> bool:
    return bool(line) and line.isprintable() and not line.startswith(("{", "[", '"'))


def read_trace(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_tokens: int = 512,
    skip_bad_lines: bool = False,
    strict: bool = False,
) -> TraceReader:
    """Stream the requests of a trace file (see the module docstring for the formats).

    Args:
        path: trace file; gzip / zstd compression is detected from its magic bytes.
        fmt: one of :data:`FORMATS`.
        block_tokens: tokens per block, used to chain keys of ``token_ids`` traces (>= 1).
        skip_bad_lines: skip bad lines (counted in ``.bad_lines``) instead of raising.
        strict: make the warnings of :class:`TraceReader` errors.

    Returns:
        A :class:`TraceReader`: an iterator of :class:`Request` in file order, with running
        counts ``.requests``, ``.block_refs``, ``.bad_lines``.

    Raises:
        TraceFormatError: unknown ``fmt`` (at once); while iterating: missing or unreadable
            file, unknown format, a bad line (unless skipped), or no request at all.
        ValueError: ``block_tokens`` is not a positive int, or ``skip_bad_lines`` /
            ``strict`` is not a bool.
    """
    return TraceReader(path, fmt=fmt, block_tokens=block_tokens, skip_bad_lines=skip_bad_lines,
                       strict=strict)


@dataclass(frozen=True)
class TraceOptions:
    """How to read a trace file (everything but its path), as :func:`read_trace` takes it.

    Attributes:
        fmt: one of :data:`FORMATS`.
        block_tokens: tokens per block (>= 1): chains ``token_ids`` traces, checks Mooncake
            ``input_length`` against ``hash_ids``.
        skip_bad_lines: skip and count bad lines instead of raising.
        strict: turn warnings about suspicious but readable input (see
            :class:`TraceReader`) into :class:`TraceFormatError`.

    Raises:
        TraceFormatError: unknown ``fmt``. ValueError: ``block_tokens`` not a positive int,
            or a flag that is not a bool.
    """

    fmt: str = "auto"
    block_tokens: int = 512
    skip_bad_lines: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise TraceFormatError(
                "<options>", None,
                f"unknown format {self.fmt!r}; expected one of {', '.join(FORMATS)}",
            )
        check_positive_int("block_tokens", self.block_tokens, "tokens")
        # kept as plain bools ("no" would read as true; numpy's bool taken)
        object.__setattr__(self, "skip_bad_lines", check_bool("skip_bad_lines",
                                                              self.skip_bad_lines))
        object.__setattr__(self, "strict", check_bool("strict", self.strict))

    def open(self, path: str | os.PathLike) -> TraceReader:
        """``read_trace(path)`` with these options."""
        return TraceReader(path, fmt=self.fmt, block_tokens=self.block_tokens,
                           skip_bad_lines=self.skip_bad_lines, strict=self.strict)


def count_unique_blocks(requests) -> tuple[int, int, int]:
    """One pass over ``requests``: ``(requests, block references, distinct block keys)``."""
    seen: set = set()
    update = seen.update
    n_req = 0
    n_refs = 0
    for req in requests:
        keys = req.keys
        n_req += 1
        n_refs += len(keys)
        update(keys)
    return n_req, n_refs, len(seen)
