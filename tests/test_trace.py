"""Trace readers: every format, compression, the chained hash, and bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest
import zstandard

from kvtier.trace import (
    SHARED_TRACE_NAME,
    Request,
    TraceFormatError,
    chain_block_hashes,
    count_unique_blocks,
    embedded_sample_path,
    find_shared_trace,
    read_trace,
)

MOONCAKE_LINES = [
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 5, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]},
    {"timestamp": 7.5, "input_length": 100, "output_length": 0, "hash_ids": [3]},
]


def write_jsonl(path: Path, objs) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def test_mooncake_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", MOONCAKE_LINES)
    reader = read_trace(path)
    reqs = list(reader)
    assert reqs == [
        Request([0, 1], 1000, 10, 0),
        Request([0, 1, 2], 1500, 20, 5),
        Request([3], 100, 0, 7.5),
    ]
    assert (reader.fmt, reader.requests, reader.block_refs, reader.bad_lines) == (
        "jsonl", 3, 6, 0
    )


def test_blank_lines_ignored_and_auto_sniffs_without_suffix(tmp_path):
    path = tmp_path / "trace"
    path.write_text("\n" + json.dumps(MOONCAKE_LINES[0]) + "\n\n  \n" + json.dumps(MOONCAKE_LINES[2]))
    reader = read_trace(path)
    assert [r.keys for r in reader] == [[0, 1], [3]]
    assert reader.fmt == "jsonl"


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_files_read_transparently(tmp_path, compress):
    raw = "".join(json.dumps(o) + "\n" for o in MOONCAKE_LINES).encode()
    # no telling suffix: detection is by magic bytes
    path = tmp_path / "trace.jsonl"
    if compress == "gzip":
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert [r.keys for r in read_trace(path)] == [[0, 1], [0, 1, 2], [3]]


def test_embedded_sample_is_real_mooncake_data():
    path = embedded_sample_path()
    assert path.is_file()
    assert count_unique_blocks(read_trace(path)) == (500, 14162, 11879)
    first = next(iter(read_trace(path)))
    assert first == Request(list(range(14)), 6758, 500, 0)


def _blake(parent: bytes, tokens) -> bytes:
    data = b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
    return hashlib.blake2b(parent + data, digest_size=8).digest()


def test_chain_block_hashes_definition():
    tokens = list(range(10))
    keys = chain_block_hashes(tokens, block_tokens=4)
    h0 = _blake(b"\x00" * 8, [0, 1, 2, 3])
    h1 = _blake(h0, [4, 5, 6, 7])
    assert keys == [int.from_bytes(h0, "big"), int.from_bytes(h1, "big")]  # 8, 9: partial
    assert chain_block_hashes([1, 2, 3], block_tokens=4) == []
    # a block's key depends on its whole prefix
    other = chain_block_hashes([9, 1, 2, 3, 4, 5, 6, 7], block_tokens=4)
    assert other[0] != keys[0] and other[1] != keys[1]
    # same prefix, same keys
    assert chain_block_hashes(tokens + [11, 12], block_tokens=4)[:2] == keys


@pytest.mark.parametrize("block_tokens", [0, -2, True, 2.0])
def test_chain_block_hashes_refuses_a_bad_block_size(block_tokens):
    """Found by a newcomer session: 0 raised ZeroDivisionError, -2 returned [] and True was
    read as 1 block token, with no word."""
    with pytest.raises(ValueError, match="block_tokens"):
        chain_block_hashes(list(range(8)), block_tokens)


def test_chain_block_hashes_refuses_a_negative_token_id():
    """The docstring says token ids are ints in [0, 2**63); a negative one was hashed."""
    with pytest.raises(ValueError, match="-1"):
        chain_block_hashes([1, -1, 2, 3], 2)
    # a trailing partial block is not hashed, so not checked
    assert chain_block_hashes([1, 2, -1], 2) == chain_block_hashes([1, 2], 2)


@pytest.mark.parametrize("bad, error, shown", [(2**63, OverflowError, "9223372036854775808"),
                                               (1.5, TypeError, "1.5"), ("7", TypeError, "'7'")])
def test_chain_block_hashes_names_a_token_id_out_of_range(bad, error, shown):
    """Found by a newcomer session: a token id of 2**63 or more raised a bare "OverflowError:
    int too big to convert", a float "TypeError: 'float' object cannot be interpreted as an
    integer", naming neither token_ids, the id nor the rule."""
    with pytest.raises(error, match=r"token ids must be ints in \[0, 2\*\*63\), found "
                                    + re.escape(shown) + " at position 2"):
        chain_block_hashes([1, 2, bad, 3], 2)


def test_token_ids_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "tok.jsonl",
        [
            {"token_ids": list(range(9)), "output_length": 3},
            {"token_ids": list(range(4)) + [99] * 4, "input_length": 8, "timestamp": 1},
        ],
    )
    reqs = list(read_trace(path, block_tokens=4))
    a, b = chain_block_hashes(list(range(9)), 4)
    assert reqs[0] == Request([a, b], 9, 3, None)
    assert reqs[1].keys[0] == a and reqs[1].keys[1] != b
    assert reqs[1].input_length == 8
    # fmt="tokens" refuses hash_ids lines
    with pytest.raises(TraceFormatError, match="line 1: missing field 'token_ids'"):
        list(read_trace(write_jsonl(tmp_path / "m.jsonl", MOONCAKE_LINES), fmt="tokens"))


def test_a_token_ids_trace_without_a_full_block_is_warned_about(tmp_path):
    # prompts of 40-103 tokens at the default 512-token blocks: no request names a block,
    # every tier hits 0 %, and nothing said why (only "the trace's 0 distinct blocks")
    from kvtier.trace import TraceWarning

    lines = [{"token_ids": list(range(n))} for n in (40, 103, 64)]
    path = write_jsonl(tmp_path / "short.jsonl", lines)
    with pytest.warns(TraceWarning, match=r"none of its 3 requests has a full block of 512 "
                      r"tokens \(the longest token_ids has 103\).*--block-tokens") as got:
        reader = read_trace(path)
        assert [r.keys for r in reader] == [[], [], []]
        reader.report_lengths()  # the CLI's call after a pass: no second warning
    assert len(got) == 1
    # at 16 tokens per block they have blocks: no warning; nor for a Mooncake line with
    # no hash_ids, whose blocks are the trace's own
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        assert sum(len(r.keys) for r in read_trace(path, block_tokens=16)) == 2 + 6 + 4
        empty = write_jsonl(tmp_path / "m.jsonl", [{"hash_ids": [], "input_length": 0}])
        assert [r.keys for r in read_trace(empty)] == [[]]


def test_text_and_csv(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("# a comment\n1 2 3\n1,2, 4\n\nx y\n")
    reqs = list(read_trace(path))
    assert [r.keys for r in reqs] == [[1, 2, 3], [1, 2, 4], ["x", "y"]]
    assert reqs[0] == Request([1, 2, 3], None, None, None)
    csv = tmp_path / "keys.csv"
    csv.write_text("5,6\n7\n")
    assert [r.keys for r in read_trace(csv)] == [[5, 6], [7]]
    # sniffed as text without suffix
    bare = tmp_path / "keys"
    bare.write_text("a b\n")
    assert [r.keys for r in read_trace(bare)] == [["a", "b"]]


def test_streaming_yields_before_reading_the_rest(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(MOONCAKE_LINES[0]) + "\n{broken\n")
    reader = read_trace(path)
    assert next(reader).keys == [0, 1]  # the bad line 2 is not read yet
    with pytest.raises(TraceFormatError, match="line 2"):
        next(reader)


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"input_length": 5}', "missing field: need 'hash_ids' or 'token_ids'"),
        ('{"hash_ids": [1, 2]}', "missing field 'input_length'"),
        ('{"hash_ids": [1], "input_length": -3}', "'input_length' must be an int >= 0"),
        ('{"hash_ids": [1], "input_length": 3, "output_length": -1}', "'output_length'"),
        ('{"hash_ids": [1, "a"], "input_length": 3}', "'hash_ids' must be a list of ints"),
        ('{"hash_ids": 7, "input_length": 3}', "'hash_ids' must be a list of ints"),
        ('{"token_ids": [1, -2]}', "'token_ids' must be a list of ints >= 0"),
        ('{"hash_ids": [1], "input_length": 3, "timestamp": "x"}', "'timestamp'"),
        # newcomer finding: 1e400 parses as inf and the cost model printed TTFT nan -> nan
        ('{"hash_ids": [1], "input_length": 3, "timestamp": 1e400}',
         "'timestamp' must be a finite number >= 0 (ms), got inf"),
        ('{"hash_ids": [1], "input_length": 3, "timestamp": NaN}',
         "'timestamp' must be a finite number >= 0 (ms), got nan"),
        # newcomer session 17: an int of 400 digits was taken, and kvtier analyze and
        # replay --cost ended in OverflowError tracebacks
        pytest.param('{"hash_ids": [1], "input_length": 3, "timestamp": 1' + "0" * 400 + "}",
                     "'timestamp' must be a finite number >= 0 (ms), got an int of 401 "
                     "digits, more than a float holds", id="int-too-large-for-a-float"),
    ],
)
def test_bad_jsonl_line_names_file_line_and_rule(tmp_path, line, rule):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(MOONCAKE_LINES[0]) + "\n\n" + line + "\n")
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    err = info.value
    assert str(err).startswith(f"{path}, line 3: ")
    assert rule in str(err)
    assert (err.line, err.path) == (3, str(path))


def test_skip_bad_lines_counts_them(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "{oops\n"
        + json.dumps(MOONCAKE_LINES[0]) + "\n"
        + '{"hash_ids": [1], "input_length": -1}\n'
        + json.dumps(MOONCAKE_LINES[2]) + "\n"
    )
    reader = read_trace(path, skip_bad_lines=True)
    assert [r.keys for r in reader] == [[0, 1], [3]]
    assert (reader.bad_lines, reader.requests) == (2, 2)


def test_all_lines_bad_is_an_error_even_when_skipping(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{a\n{b\n")
    with pytest.raises(TraceFormatError, match="all 2 request lines are bad"):
        list(read_trace(path, skip_bad_lines=True))


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=r"empty\.jsonl: empty trace"):
        list(read_trace(path))


def test_empty_gzip_file(tmp_path):
    path = tmp_path / "empty.gz"
    path.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceFormatError, match="empty trace"):
        list(read_trace(path))


def test_unknown_format(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(TraceFormatError, match=r"blob\.bin.*(unknown format|not UTF-8)"):
        list(read_trace(path))
    with pytest.raises(TraceFormatError, match="unknown format 'parquet'"):
        read_trace(path, fmt="parquet")
    odd = tmp_path / "odd"
    odd.write_text('"just a string"\n')
    with pytest.raises(TraceFormatError, match="unknown format"):
        list(read_trace(odd))


def test_json_in_a_text_file_is_reported(tmp_path):
    path = tmp_path / "oops.txt"
    path.write_text(json.dumps(MOONCAKE_LINES[0]) + "\n")
    with pytest.raises(TraceFormatError, match="line 1: .*--format jsonl"):
        list(read_trace(path))


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        list(read_trace(tmp_path / "nope.jsonl"))


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"hash_ids": [1], "input_length": 1}\n' * 100)[:40])
    with pytest.raises(TraceFormatError, match="cannot decompress"):
        list(read_trace(path))


def _text_lines(n: int) -> bytes:
    return "".join(f"{i} {i + 1} {i + 2}\n" for i in range(n)).encode()


def test_zstd_multiple_frames_all_read(tmp_path):
    raw = _text_lines(20_000)
    zstd = zstandard.ZstdCompressor()
    path = tmp_path / "t.txt.zst"
    path.write_bytes(zstd.compress(raw[:100_001]) + zstd.compress(raw[100_001:]))
    reqs = list(read_trace(path))
    assert len(reqs) == 20_000 and reqs[-1].keys == [19_999, 20_000, 20_001]


@pytest.mark.parametrize("keep", [0.1, 0.7])
def test_truncated_zstd_is_an_error_not_a_shorter_trace(tmp_path, keep):
    data = zstandard.ZstdCompressor().compress(_text_lines(50_000))
    path = tmp_path / "t.txt.zst"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(TraceFormatError, match="cannot decompress: .*truncated"):
        list(read_trace(path))


def test_corrupt_zstd(tmp_path):
    path = tmp_path / "t.txt.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"garbage" * 10)
    with pytest.raises(TraceFormatError, match="line 1: cannot decompress: corrupt zstd"):
        list(read_trace(path))


def test_text_keys_int_only_when_canonical(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("01 1 +1 -1 1_000 0 -0 \u0661\u0662 abc 17,18\n", encoding="utf-8")
    (req,) = read_trace(path)
    assert req.keys == ["01", 1, "+1", -1, "1_000", 0, "-0", "\u0661\u0662", "abc", 17, 18]


@pytest.mark.parametrize("fmt_suffix", ["jsonl", "txt"])
def test_utf8_bom_is_skipped(tmp_path, fmt_suffix):
    path = tmp_path / f"t.{fmt_suffix}"
    line = json.dumps(MOONCAKE_LINES[0]) if fmt_suffix == "jsonl" else "5 6"
    path.write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\n")
    assert [r.keys for r in read_trace(path)] == [[0, 1] if fmt_suffix == "jsonl" else [5, 6]]


def test_token_ids_lines_check_length_and_63_bit_ids(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"token_ids": [1, 2, 3, 4], "input_length": 5}])
    with pytest.raises(TraceFormatError, match="line 1: 'input_length' 5 does not match the 4"):
        list(read_trace(path, block_tokens=2))
    path = write_jsonl(tmp_path / "b.jsonl", [{"token_ids": [1, 2, 2**63, 4]}])
    with pytest.raises(TraceFormatError, match=r"token id 9223372036854775808 \(token 2\) does"):
        list(read_trace(path, block_tokens=2))


def test_find_shared_trace_looks_in_every_parent_then_names_the_usual_place(tmp_path, monkeypatch):
    monkeypatch.delenv("KVTIER_SHARED_TRACE", raising=False)
    checkout = tmp_path / "work" / "wt" / "branch"
    checkout.mkdir(parents=True)
    # nothing anywhere: the conventional ../shared path, which does not exist
    assert find_shared_trace(checkout) == tmp_path / "work" / "wt" / SHARED_TRACE_NAME
    assert not find_shared_trace(checkout).exists()
    # a git worktree two levels down finds the trace beside the main checkout's folder
    trace = tmp_path / "work" / SHARED_TRACE_NAME
    trace.parent.mkdir(parents=True)
    trace.write_text("")
    assert find_shared_trace(checkout) == trace
    assert find_shared_trace(str(checkout)) == trace
    # the nearest parent wins
    nearer = tmp_path / "work" / "wt" / SHARED_TRACE_NAME
    nearer.parent.mkdir(parents=True)
    nearer.write_text("")
    assert find_shared_trace(checkout) == nearer
    # the environment variable overrides the search, existing or not
    monkeypatch.setenv("KVTIER_SHARED_TRACE", str(tmp_path / "elsewhere.jsonl"))
    assert find_shared_trace(checkout) == tmp_path / "elsewhere.jsonl"


def test_chain_block_hashes_takes_a_numpy_block_size():
    # numpy integers are taken as the readers take them; bools and non-positive sizes are not
    import numpy as np

    tokens = list(range(8))
    assert chain_block_hashes(tokens, np.int64(4)) == chain_block_hashes(tokens, 4)
    for bad in (True, np.bool_(True), 0, np.int64(0), 4.0):
        with pytest.raises(ValueError, match="block_tokens"):
            chain_block_hashes(tokens, bad)
