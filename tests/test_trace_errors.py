"""Issue #12 faults 5 and 6: trace errors at the right line, Mooncake lengths that disagree
with the block size, re-iterating a reader, and traces piped on standard input."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from kvtier.replay import replay
from kvtier.trace import TraceFormatError, TraceWarning, embedded_sample_path, read_trace

SRC = str(Path(__file__).resolve().parents[1] / "src")


def mooncake_lines(n: int, block_tokens: int = 512, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randrange(1, 6 * block_tokens)
        blocks = -(-length // block_tokens)
        ids = rng.sample(range(50), blocks)  # distinct: a prefix hash cannot repeat
        out.append(json.dumps({"timestamp": i, "input_length": length, "output_length": 1,
                               "hash_ids": ids}).encode() + b"\n")
    return out


@pytest.mark.parametrize("compress", [None, "gzip", "zstd"])
def test_a_non_utf8_byte_is_reported_at_its_line_and_can_be_skipped(tmp_path, compress):
    lines = mooncake_lines(6000)
    lines[4999] = b'{"hash_ids": [1], "input_length": 10, "note": "caf\xe9"}\n'  # latin-1
    raw = b"".join(lines)
    if compress == "gzip":
        raw = gzip.compress(raw)
    elif compress == "zstd":
        raw = zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / "t.jsonl"
    path.write_bytes(raw)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert info.value.line == 5000
    assert "not UTF-8 text (byte 0xe9 at column" in info.value.reason
    reader = read_trace(path, skip_bad_lines=True)
    assert sum(1 for _ in reader) == 5999
    assert reader.bad_lines == 1 and reader.lines == 6000


def test_a_binary_first_line_is_not_an_unknown_format(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"\xff\xfe\x00garbage\n1 2 3\n")
    with pytest.raises(TraceFormatError, match=r"line 1: not UTF-8 text \(byte 0xff"):
        list(read_trace(path))


def test_mooncake_lengths_that_disagree_warn_once_and_replay_goes_on(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"hash_ids": [1, 2, 3], "input_length": 1}\n'            # 1 token, 3 blocks: wrong
        '{"hash_ids": [1, 2], "input_length": 1000}\n'            # ceil(1000/512) = 2: fine
        '{"hash_ids": [1, 2, 3, 4], "input_length": 10}\n'        # wrong
    )
    with pytest.warns(TraceWarning) as record:
        reader = read_trace(path)
        reqs = list(reader)
    assert len(record) == 1
    message = str(record[0].message)
    assert "2 of 3 requests have an input_length" in message and "first at line 1" in message
    # 1 token in 3 blocks, 10 tokens in 4: no power-of-two block size gives those counts
    assert "no power-of-two block size up to 65,536 fits any of them" in message
    assert reader.fitting_block_tokens is None
    assert len(reqs) == 3 and reader.length_mismatches == 2
    with pytest.raises(TraceFormatError, match=r"line 1: 'input_length' 1 needs 1 block of 512"):
        list(read_trace(path, strict=True))


def test_a_skipped_bad_line_is_not_counted_as_a_length_mismatch(tmp_path):
    # the second line's length disagrees, but the line is bad for another reason (its
    # timestamp): skipped, it is no request, so it must not count in the length warning
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"hash_ids": [1, 2], "input_length": 1000}\n'                     # fine
        '{"hash_ids": [1], "input_length": 2048, "timestamp": "x"}\n'     # bad line
        '{"hash_ids": [1, 2, 3], "input_length": 1}\n'                     # wrong length
        '{"hash_ids": [1], "input_length": 4096, "output_length": -1}\n'  # bad line
    )
    with pytest.warns(TraceWarning) as record:
        reader = read_trace(path, skip_bad_lines=True)
        assert sum(1 for _ in reader) == 2
    assert reader.bad_lines == 2 and reader.length_mismatches == 1
    message = str(record[0].message)
    assert "1 of 2 requests has an input_length" in message and "first at line 3" in message
    assert reader.fitting_block_tokens is None  # 1 token in 3 blocks: no block size fits


def test_a_16_token_block_trace_at_512_names_block_size_16(tmp_path):
    path = tmp_path / "b16.jsonl"
    lines = mooncake_lines(300, block_tokens=16, seed=3)
    path.write_bytes(b"".join(lines))
    wrong_at_512 = sum(1 for line in lines if json.loads(line)["input_length"] > 16)
    with pytest.warns(TraceWarning, match=rf"{wrong_at_512} of 300 requests .* block size 16 "
                                          rf"fits {wrong_at_512} of them \(--block-tokens 16\)"):
        reader = read_trace(path)
        assert sum(1 for _ in reader) == 300
    assert reader.fitting_block_tokens == (16, wrong_at_512)
    assert reader.length_mismatches == wrong_at_512 > 200
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # the right block size: silent
        reader = read_trace(path, block_tokens=16)
        assert sum(1 for _ in reader) == 300 and reader.length_mismatches == 0


def test_a_request_naming_a_block_hash_twice_is_counted_and_warned_once(tmp_path):
    """Found by a newcomer pass: ``"hash_ids": [1, 1, 1]`` replayed without a word, though a
    block hash names its whole prefix and cannot repeat within one request. Such requests
    are counted, warned about once per pass (a skipped bad line not counted), and replayed
    as given; strict=True makes the first one an error."""
    import warnings

    path = tmp_path / "r.jsonl"
    path.write_text(
        '{"hash_ids": [1, 2], "input_length": 1000}\n'                    # fine
        '{"hash_ids": [5, 5], "input_length": 1000, "timestamp": "x"}\n'  # bad line
        '{"hash_ids": [1, 1, 1], "input_length": 1500}\n'                 # repeats
        '{"hash_ids": [3, 4, 3], "input_length": 1500}\n'                 # repeats
        '{"hash_ids": [], "input_length": 0}\n'                           # fine
    )
    with pytest.warns(TraceWarning) as record:
        reader = read_trace(path, skip_bad_lines=True)
        got = [list(r.keys) for r in reader]
    assert got == [[1, 2], [1, 1, 1], [3, 4, 3], []]  # replayed as given
    assert reader.repeated_hash_requests == 2 and reader.bad_lines == 1
    messages = [str(w.message) for w in record if "twice" in str(w.message)]
    assert len(messages) == 1, messages
    assert ("2 of 4 requests name a block hash twice in their hash_ids (first at line 3), "
            "replayed as given") in messages[0]
    assert reader.length_mismatches == 0
    with pytest.warns(TraceWarning, match="1 of 2 requests names a block hash twice in its hash_ids"):
        reader = read_trace(path, skip_bad_lines=True)
        for _ in zip(range(2), reader, strict=False):  # a pass stopped early (--limit)
            pass
        reader.report_lengths()
    assert reader.repeated_hash_requests == 1
    good = tmp_path / "g.jsonl"  # without the bad line 2
    good.write_text("".join(line + "\n" for i, line in
                            enumerate(path.read_text().splitlines()) if i != 1))
    with pytest.raises(TraceFormatError, match=r"line 2: 'hash_ids' names block hash 1 twice"):
        list(read_trace(good, strict=True))
    strict = read_trace(path, strict=True, skip_bad_lines=True)  # strict: bad lines, skipped
    assert [list(r.keys) for r in strict] == [[1, 2], []] and strict.bad_lines == 3
    with warnings.catch_warnings():  # distinct hashes: silent
        warnings.simplefilter("error", TraceWarning)
        reader = read_trace(path, skip_bad_lines=True)
        assert next(reader).keys == [1, 2] and reader.repeated_hash_requests == 0


def test_the_real_trace_sample_has_no_length_mismatch():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        reader = read_trace(embedded_sample_path(), strict=True)
        assert sum(1 for _ in reader) == 500 and reader.length_mismatches == 0


def test_a_finished_reader_reopens_when_iterated_again():
    reader = read_trace(embedded_sample_path())
    first = replay(reader, "lru", 1000)
    second = replay(reader, "lru", 1000)
    assert first.requests == second.requests == 500
    assert first.hit_blocks == second.hit_blocks
    assert reader.requests == 500  # the counts restarted with the second pass


def cli(args, stdin: bytes):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "kvtier.cli", *args], input=stdin, env=env,
                          capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def sample_bytes():
    gz = embedded_sample_path().read_bytes()
    plain = gzip.decompress(gz)
    return {"plain": plain, "gzip": gz, "zstd": zstandard.ZstdCompressor().compress(plain)}


@pytest.fixture(scope="module")
def expected_hits():
    trace = list(read_trace(embedded_sample_path()))
    return replay(trace, "lru", 1000).hit_blocks


@pytest.mark.parametrize(("name", "kind", "extra"), [
    ("-", "plain", []), ("-", "gzip", []), ("-", "zstd", []),
    ("/dev/stdin", "gzip", []), ("-", "zstd", ["--stream"]),
])
def test_replay_reads_a_piped_trace(sample_bytes, expected_hits, name, kind, extra):
    if name == "/dev/stdin" and not os.path.exists("/dev/stdin"):
        pytest.skip("no /dev/stdin here")
    res = cli(["replay", name, "-p", "lru", "-c", "1000", "--json", "-", *extra],
              sample_bytes[kind])
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    data = json.loads(res.stdout)
    assert data["trace"]["requests"] == 500
    assert data["results"][0]["hit_blocks"] == expected_hits


def test_sweep_reads_a_piped_trace_in_worker_processes(sample_bytes, expected_hits):
    res = cli(["sweep", "-", "-p", "lru", "-c", "1000,2000", "--workers", "2", "--json", "-"],
              sample_bytes["gzip"])
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    rows = json.loads(res.stdout)["results"]
    assert rows[0]["hit_blocks"] == expected_hits and rows[1]["capacity"] == 2000


def test_analyze_names_a_piped_trace_as_replay_does(sample_bytes):
    """Found by a newcomer session: `kvtier analyze -` named its input '-' in the caption
    and JSON ('- (jsonl): analyzed in ...') where replay and sweep say '<stdin>'."""
    res = cli(["analyze", "-", "--limit", "10"], sample_bytes["gzip"])
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert b"<stdin> (jsonl): analyzed in" in res.stdout
    res = cli(["analyze", "-", "--limit", "10", "--json", "-"], sample_bytes["gzip"])
    assert json.loads(res.stdout)["trace"]["path"] == "<stdin>"


def test_stdin_cannot_be_read_twice_by_one_reader(monkeypatch):
    data = gzip.decompress(embedded_sample_path().read_bytes())
    r, w = os.pipe()
    os.write(w, data[:20000].rsplit(b"\n", 1)[0] + b"\n")
    os.close(w)
    monkeypatch.setattr(sys, "stdin", os.fdopen(r, "r"))
    reader = read_trace("-")
    assert sum(1 for _ in reader) > 0
    with pytest.raises(TraceFormatError, match="standard input can be read only once"):
        iter(reader)


def test_report_lengths_warns_for_a_pass_stopped_early_and_only_once_per_pass():
    import itertools
    import warnings

    from kvtier.trace import TraceReader

    reader = TraceReader(embedded_sample_path(), block_tokens=16)
    reader.report_lengths()  # nothing read yet: silent
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(itertools.islice(reader, 40))) == 40
        assert caught == []  # the pass has not ended
        reader.report_lengths()
        reader.report_lengths()
        assert len(caught) == 1 and "40 of 40 requests" in str(caught[0].message)
        assert reader.length_mismatches == 40 and reader.fitting_block_tokens == (512, 40)
        list(reader)  # the same pass to its end: no second warning, counts of the whole pass
        assert len(caught) == 1 and reader.length_mismatches == 500
        list(reader)  # a new pass warns again, for the whole file
        assert len(caught) == 2 and "500 of 500 requests" in str(caught[1].message)


def test_trace_format_error_survives_pickling():
    """A sweep worker process sends its errors to the parent pickled; TraceFormatError's
    three-argument constructor made unpickling fail (newcomer finding)."""
    import pickle

    from kvtier.trace import TraceFormatError

    err = pickle.loads(pickle.dumps(TraceFormatError("t.jsonl", 3, "bad line")))
    assert (err.path, err.line, err.reason, str(err)) == (
        "t.jsonl", 3, "bad line", "t.jsonl, line 3: bad line")


@pytest.mark.parametrize("length", ['"10"', "[1]", "{}", "true", "-5", "1.5"])
def test_a_mooncake_input_length_that_is_not_a_count_is_a_bad_line(tmp_path, length):
    """Found by a newcomer session: a Mooncake line whose input_length was a str, list or
    object ended in a bare traceback ('TypeError: can only concatenate str (not "int") to
    str', from the blocks-per-length check), and --skip-bad-lines could not skip it."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"hash_ids": [1, 2], "input_length": 1000}\n'
                    f'{{"hash_ids": [1], "input_length": {length}}}\n'
                    '{"hash_ids": [1, 3], "input_length": 1000}\n')
    with pytest.raises(TraceFormatError,
                       match=r"line 2: 'input_length' must be an int >= 0 \(tokens\)"):
        list(read_trace(path))
    reader = read_trace(path, skip_bad_lines=True)
    assert [r.keys for r in reader] == [[1, 2], [1, 3]] and reader.bad_lines == 1


def test_a_text_key_with_more_digits_than_python_converts_is_a_bad_line(tmp_path):
    """Found by a newcomer session: a text trace whose key had 5,000 digits stopped the
    replay with Python's 'Exceeds the limit (4300 digits) for integer string conversion',
    naming neither the file nor the line, and --skip-bad-lines could not skip it."""
    import sys

    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # 3.10.7+ and 3.11+
    if not limit:
        pytest.skip("this interpreter converts ints of any length")
    path = tmp_path / "t.txt"
    path.write_text(f"1 2\n1 {'9' * (limit + 1)}\n1 3\n")
    with pytest.raises(TraceFormatError, match=rf"t.txt, line 2: key of {limit + 1:,} digits"):
        list(read_trace(path))
    reader = read_trace(path, skip_bad_lines=True)
    assert [r.keys for r in reader] == [[1, 2], [1, 3]] and reader.bad_lines == 1


@pytest.mark.parametrize("flag", ["skip_bad_lines", "strict"])
@pytest.mark.parametrize("value", ["no", "false", 1, None])
def test_a_flag_that_is_not_a_bool_is_refused(tmp_path, flag, value):
    """Found by newcomer10: read_trace(path, skip_bad_lines="no") (a flag read from a config
    file) was taken as true and skipped every bad line in silence; strict="no" made
    warnings errors. Flags are bools (numpy's too), as the Redis tier's cluster= is."""
    from kvtier.trace import TraceOptions

    with pytest.raises(ValueError, match=rf"^{flag} must be a bool, got {value!r}$"):
        read_trace(tmp_path / "t.txt", **{flag: value})
    with pytest.raises(ValueError, match=rf"^{flag} must be a bool, got {value!r}$"):
        TraceOptions(**{flag: value})
    np = pytest.importorskip("numpy")
    options = TraceOptions(**{flag: np.bool_(True)})
    assert getattr(options, flag) is True
    assert getattr(read_trace(tmp_path / "t.txt", **{flag: np.bool_(False)}), flag) is False
