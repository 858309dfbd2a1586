"""RedisTier against real redis-server processes (standalone and a 3-node cluster) started by
the fixtures in tests/redis_servers.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_py

from kvtier.tiers import TierStats
from kvtier.tiers.redis import (
    HEADER,
    HEADER_BYTES,
    CircuitBreaker,
    RedisTier,
    layout_fingerprint,
    redact_url,
)
from redis_servers import (  # noqa: F401  (fixtures)
    RedisServer,
    redis_cluster,
    redis_server,
    shared_redis_server,
)

BLOCK = 4096
FP = layout_fingerprint("tiny-llama", dtype="bfloat16", num_layers=2, num_kv_heads=2,
                        head_dim=64, block_tokens=16)
SRC = str(Path(__file__).resolve().parents[2] / "src")


def blocks_for(keys, size=BLOCK, seed=0):
    """Distinct pseudo-random bytes per key (os.urandom-like, reproducible)."""
    import random

    out = []
    for k in keys:
        rnd = random.Random(f"{seed}-{k}")
        out.append(rnd.randbytes(size))
    return out


def make_tier(url, **kw):
    kw.setdefault("block_bytes", BLOCK)
    kw.setdefault("fingerprint", FP)
    kw.setdefault("namespace", f"t{uuid.uuid4().hex[:8]}")
    return RedisTier(url, **kw)


def raw_client(server):
    return redis_py.Redis.from_url(server.url)


# -- round trip -------------------------------------------------------------------------------
@pytest.mark.parametrize("lookup_mode", ["script", "pipeline"])
def test_round_trip_lookup_and_read(shared_redis_server, lookup_mode):
    keys = [101, 102, "h3", b"\x00h4", 2**70]
    data = blocks_for(keys)
    with make_tier(shared_redis_server.url, lookup_mode=lookup_mode) as tier:
        assert tier.lookup_prefix(keys) == 0
        assert tier.write(keys, data) == 5
        assert tier.flush(10)
        assert tier.lookup_prefix(keys) == 5
        assert tier.lookup_prefix(keys[:2] + [999] + keys[2:]) == 2  # stops at the gap
        assert tier.lookup_prefix([999] + keys) == 0
        assert tier.read(keys) == data
        assert tier.read([999, keys[1]]) == [None, data[1]]
        s = tier.stats()
        assert isinstance(s, TierStats)
        # examined keys: 1 + 5 + 3 + 1 (hits plus the first miss of each call)
        assert (s.lookups, s.lookup_hits) == (10, 7)
        assert (s.reads, s.read_hits, s.read_errors) == (7, 6, 0)
        assert (s.writes, s.writes_completed, s.writes_failed, s.writes_skipped) == (5, 5, 0, 0)
        assert s.bytes_written == 5 * (HEADER_BYTES + BLOCK)
        assert s.bytes_read == 6 * (HEADER_BYTES + BLOCK)
        assert s.read_latency.total == 2 and s.write_latency.total >= 1
        assert s.backend_errors == 0 and s.breaker_state == "closed"


def test_a_key_repeated_in_one_write_keeps_its_first_block(shared_redis_server):
    # as the disk tier: the first occurrence is written, the repeats counted as skipped
    a, b, c = blocks_for(["a", "b", "c"])
    with make_tier(shared_redis_server.url) as tier:
        assert tier.write([7, 8, 7, 7], [a, b, c, c]) == 2
        assert tier.flush(10)
        assert tier.read([7, 8]) == [a, b]
        s = tier.stats()
        assert (s.writes, s.writes_completed, s.writes_skipped) == (2, 2, 2)


def test_caller_may_reuse_buffer_after_write(shared_redis_server):
    buf = bytearray(b"a" * BLOCK)
    with make_tier(shared_redis_server.url) as tier:
        tier.write([1], [memoryview(buf)])
        buf[:] = b"b" * BLOCK  # overwritten before the writer sent it
        tier.flush(10)
        assert tier.read([1]) == [b"a" * BLOCK]


def test_keys_and_header_layout(shared_redis_server):
    with make_tier(shared_redis_server.url, namespace="lay") as tier:
        rk = tier.redis_key(7)
        assert rk == b"lay:%016x:i" % tier.fingerprint_id + (7).to_bytes(8, "big")
        tier.write([7], blocks_for([7]))
        tier.flush(10)
        value = raw_client(shared_redis_server).get(rk)
        magic, version, codec, _, fp, length, plen, _ = HEADER.unpack_from(value)
        assert (magic, version, codec, fp, length, plen) == (
            b"KVTB", 1, 0, tier.fingerprint_id, BLOCK, BLOCK)


def test_two_models_never_share(shared_redis_server):
    ns = f"m{uuid.uuid4().hex[:6]}"
    fp_b = FP.replace("tiny-llama", "other-model")
    with make_tier(shared_redis_server.url, namespace=ns) as a, \
            make_tier(shared_redis_server.url, namespace=ns, fingerprint=fp_b) as b, \
            make_tier(shared_redis_server.url, namespace=ns, block_bytes=2 * BLOCK) as c:
        a.write([1, 2], blocks_for([1, 2]))
        a.flush(10)
        assert a.lookup_prefix([1, 2]) == 2
        assert b.lookup_prefix([1, 2]) == 0 and b.read([1, 2]) == [None, None]
        assert c.lookup_prefix([1, 2]) == 0
        assert len({a.fingerprint_id, b.fingerprint_id, c.fingerprint_id}) == 3
        assert b.stats().read_errors == 0  # different keys: plain misses


def test_layout_fingerprint_refuses_an_empty_name_and_sizes_below_one():
    """Found by newcomer12: layout_fingerprint("", dtype="bfloat16", num_layers=-1, ...)
    gave "...|model=|num_layers=-1": a forgotten model name (an unset setting) made every
    such engine share one fingerprint, so one another's blocks read as verified."""
    np = pytest.importorskip("numpy")
    base = {"dtype": "bfloat16", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
            "block_tokens": 16}
    for bad, match in (({"model": ""}, "model must be a non-empty str, got ''"),
                       ({"model": None}, "model must be a non-empty str"),
                       ({"dtype": " "}, "dtype must be a non-empty str"),
                       ({"num_layers": -1}, r"num_layers must be a positive int \(layers\)"),
                       ({"num_kv_heads": 0}, "num_kv_heads must be a positive int"),
                       ({"head_dim": 64.0}, "head_dim must be a positive int"),
                       ({"block_tokens": True}, "block_tokens must be a positive int")):
        args = {"model": "m", **base, **bad}
        with pytest.raises(ValueError, match=match):
            layout_fingerprint(args.pop("model"), **args)
    # numpy sizes are ints: the same fingerprint as plain ints
    assert layout_fingerprint("m", **{**base, "num_layers": np.int64(2)}) == \
        layout_fingerprint("m", **base)


def test_layout_fingerprint_is_injective_for_values_with_separators():
    """Found by a newcomer session: fields were joined as "k=v|k=v", so a value holding "|"
    or "=" could spell out other fields: two different layouts had one fingerprint, and
    their tiers would read each other's blocks as verified. Separators in values are now
    escaped; a fingerprint without them is unchanged (blocks already in Redis still match)."""
    base = {"dtype": "bfloat16", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
            "block_tokens": 16}
    a = layout_fingerprint("m", **base, revision="r1|tp_rank=1")
    b = layout_fingerprint("m", **base, revision="r1", tp_rank=1)
    assert a != b
    assert layout_fingerprint("m|x", **base) != layout_fingerprint("m", **base, x="")
    assert "r1\\|tp_rank\\=1" in a  # escaped
    assert FP == ("block_tokens=16|dtype=bfloat16|head_dim=64|model=tiny-llama|"
                  "num_kv_heads=2|num_layers=2")


# -- nothing unverified reaches the caller ----------------------------------------------------
def _tamper_cases(tier, foreign, r):
    """(name, corrupt(value) -> new value) pairs; each makes read answer None + an error."""
    def flip_payload(v):
        v = bytearray(v)
        v[HEADER_BYTES + 100] ^= 0x01
        return bytes(v)

    def flip_checksum(v):
        v = bytearray(v)
        v[HEADER_BYTES - 1] ^= 0x80
        return bytes(v)

    def version(v):
        v = bytearray(v)
        v[4] = 2
        return bytes(v)

    def magic(v):
        return b"XXXX" + v[4:]

    return [
        ("flipped payload bit", flip_payload),
        ("flipped checksum bit", flip_checksum),
        ("truncated payload", lambda v: v[:-100]),
        ("truncated header", lambda v: v[:20]),
        ("empty value", lambda v: b""),
        ("extra bytes", lambda v: v + b"xx"),
        ("unknown format version", version),
        ("not a kvtier value", magic),
        ("foreign fingerprint", lambda v: foreign),
    ]


def test_foreign_corrupt_truncated_values_are_miss_and_counted(shared_redis_server):
    ns = f"c{uuid.uuid4().hex[:6]}"
    r = raw_client(shared_redis_server)
    with make_tier(shared_redis_server.url, namespace=ns) as tier, \
            make_tier(shared_redis_server.url, namespace=ns, fingerprint=FP + "|tp=2") as other:
        other.write([1], blocks_for([1]))
        other.flush(10)
        foreign = r.get(other.redis_key(1))
        cases = _tamper_cases(tier, foreign, r)
        keys = list(range(100, 100 + len(cases)))
        data = blocks_for(keys)
        tier.write(keys, data)
        tier.flush(10)
        good = tier.read(keys)
        assert good == data
        for key, (_name, corrupt) in zip(keys, cases):
            rk = tier.redis_key(key)
            r.set(rk, corrupt(r.get(rk)))
        before = tier.stats()
        got = tier.read(keys)
        assert got == [None] * len(cases), [c[0] for c, g in zip(cases, got) if g is not None]
        after = tier.stats()
        assert after.read_errors - before.read_errors == len(cases)
        assert after.read_hits == before.read_hits


def test_value_moved_under_another_key_is_rejected(shared_redis_server):
    """The checksum covers the Redis key: a valid value copied to another block's key fails."""
    r = raw_client(shared_redis_server)
    with make_tier(shared_redis_server.url) as tier:
        tier.write([1, 2], blocks_for([1, 2]))
        tier.flush(10)
        r.set(tier.redis_key(2), r.get(tier.redis_key(1)))
        assert tier.read([1, 2]) == [blocks_for([1])[0], None]
        assert tier.stats().read_errors == 1


def test_zstd_compression_only_when_it_pays(shared_redis_server):
    r = raw_client(shared_redis_server)
    zeros = bytes(BLOCK)
    noise = blocks_for(["n"])[0]
    with make_tier(shared_redis_server.url, compression="zstd") as tier:
        tier.write(["z", "n"], [zeros, noise])
        tier.flush(10)
        assert tier.read(["z", "n"]) == [zeros, noise]
        vz, vn = r.get(tier.redis_key("z")), r.get(tier.redis_key("n"))
        assert HEADER.unpack_from(vz)[2] == 1 and len(vz) < BLOCK // 10  # stored compressed
        assert HEADER.unpack_from(vn)[2] == 0 and len(vn) == HEADER_BYTES + BLOCK  # raw
        # a plain tier reads compressed values too (the codec is in the header)
        with make_tier(shared_redis_server.url, namespace=tier.namespace) as plain:
            assert plain.read(["z"]) == [zeros]
        # a corrupt zstd frame: miss + error, no exception
        bad = bytearray(vz)
        bad[HEADER_BYTES + 5] ^= 0xFF
        r.set(tier.redis_key("z"), bytes(bad))
        assert tier.read(["z"]) == [None]
        assert tier.stats().read_errors == 1


def test_ttl_option(shared_redis_server):
    r = raw_client(shared_redis_server)
    with make_tier(shared_redis_server.url, ttl_s=100) as tier:
        tier.write([1], blocks_for([1]))
        tier.flush(10)
        assert 0 < r.ttl(tier.redis_key(1)) <= 100
        assert tier.read([1]) == blocks_for([1])


# -- misuse raises, state unchanged -----------------------------------------------------------
def test_bad_input_raises_and_leaves_state(shared_redis_server):
    with make_tier(shared_redis_server.url) as tier:
        with pytest.raises(ValueError, match="block 1 .*5 bytes"):
            tier.write([1, 2], [bytes(BLOCK), b"short"])
        with pytest.raises(ValueError, match="2 keys but 1 block$"):
            tier.write([1, 2], [bytes(BLOCK)])
        with pytest.raises(TypeError, match="no stable byte encoding"):
            tier.write([(1, 2)], [bytes(BLOCK)])
        with pytest.raises(TypeError):
            tier.lookup_prefix([1.5])
        tier.flush(10)
        s = tier.stats()
        assert (s.writes, s.writes_skipped, s.lookups) == (0, 0, 0)
        assert tier.lookup_prefix([1]) == 0  # nothing of the failed writes was stored
    with pytest.raises(RuntimeError, match="closed"):
        tier.lookup_prefix([1])
    with pytest.raises(RuntimeError, match="closed"):  # a tier stack checks before storing
        tier.check_keys([1])
    tier.close()  # idempotent


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_bytes": 0}, "block_bytes"),
        ({"fingerprint": ""}, "fingerprint"),
        ({"namespace": "a{b}"}, "namespace"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"compression": "lz4"}, "compression"),
        ({"ttl_s": -1}, "ttl_s"),
        ({"lookup_mode": "scan"}, "lookup_mode"),
        ({"cluster": True, "lookup_mode": "script"}, "lookup_mode"),
        ({"max_queue_bytes": 0}, "max_queue_bytes"),
        # a queue smaller than one value (block + 40-byte header) was taken, and then every
        # write was dropped in silence (counted in writes_skipped only)
        ({"max_queue_bytes": BLOCK + HEADER_BYTES - 1},
         r"max_queue_bytes must hold at least one value \(40 \+ block_bytes = 4136 bytes\)"),
        ({"breaker_failures": 0}, "breaker_failures"),
        # found by a newcomer session: accepted, then every lookup failed silently (inf) or
        # the breaker never closed again (inf cooldown); a str cooldown raised a bare
        # "'>' not supported" TypeError
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"read_timeout_s": float("nan")}, "read_timeout_s"),
        ({"write_timeout_s": True}, "write_timeout_s"),
        ({"breaker_cooldown_s": float("inf")}, "breaker_cooldown_s"),
        ({"breaker_cooldown_s": "1"}, "breaker_cooldown_s"),
        # found by a newcomer session: an empty or non-str name was taken (DiskTier refuses
        # it; the name is the tier's label in metrics and events)
        ({"name": ""}, "name must be a non-empty str"),
        ({"name": 5}, "name must be a non-empty str"),
        ({"name": " "}, "name must be a non-empty str, got ' '"),  # (taken until session 16)
    ],
)
def test_bad_options_name_the_option(kwargs, match):
    kw = {"block_bytes": BLOCK, "fingerprint": FP, **kwargs}
    with pytest.raises(ValueError, match=match):
        RedisTier("redis://127.0.0.1:1/0", **kw)
    with pytest.raises(ValueError, match="redis://, rediss://"):
        RedisTier("http://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP)
    with pytest.raises(TypeError, match="fingerprint"):
        RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=b"x")


def test_numpy_sizes_are_taken_as_the_disk_tier_takes_them():
    """Found by a newcomer session: RedisTier(block_bytes=np.int64(...)) was refused ("must be
    an int > 0, got np.int64(...)") where DiskTier and OffloadingManager take numpy ints;
    they are kept as plain ints."""
    np = pytest.importorskip("numpy")
    tier = RedisTier("redis://127.0.0.1:1/0", block_bytes=np.int64(BLOCK), fingerprint=FP,
                     max_queue_bytes=np.int64(1 << 20), write_batch_bytes=np.int32(1 << 16))
    assert (tier.block_bytes, tier.max_queue_bytes, tier.write_batch_bytes) == (
        BLOCK, 1 << 20, 1 << 16)
    assert type(tier.block_bytes) is int and type(tier.max_queue_bytes) is int
    tier.close()
    with pytest.raises(ValueError, match="block_bytes must be an int > 0"):
        RedisTier("redis://127.0.0.1:1/0", block_bytes=np.bool_(True), fingerprint=FP)


def test_from_url_takes_tier_options_from_the_query(shared_redis_server, monkeypatch):
    url = (f"{shared_redis_server.url}?fingerprint=q-model&block_bytes={BLOCK}"
           f"&namespace=qns&timeout_s=0.2&compression=zstd&lookup_mode=pipeline")
    with RedisTier.from_url(url) as tier:
        assert (tier.fingerprint, tier.block_bytes, tier.namespace, tier.timeout_s,
                tier.compression, tier.lookup_mode) == (
            "q-model", BLOCK, "qns", 0.2, "zstd", "pipeline")
        tier.write([1], blocks_for([1]))
        tier.flush(10)
        assert tier.read([1]) == blocks_for([1])
    with RedisTier.from_url(url, namespace="kw") as tier:  # keyword options win
        assert tier.namespace == "kw"
    monkeypatch.setenv("KVTIER_REDIS_URL", shared_redis_server.url)
    with RedisTier.from_url(block_bytes=BLOCK, fingerprint=FP) as tier:
        assert tier.lookup_prefix([1]) == 0 and tier.stats().backend_errors == 0
    monkeypatch.delenv("KVTIER_REDIS_URL")
    with pytest.raises(ValueError, match="KVTIER_REDIS_URL"):
        RedisTier.from_url(block_bytes=BLOCK, fingerprint=FP)
    with pytest.raises(ValueError, match="block_bytes"):
        RedisTier.from_url(shared_redis_server.url + "?block_bytes=big", fingerprint=FP)


def test_from_url_takes_every_size_option_and_refuses_an_unknown_cluster_value():
    """Found by a newcomer session: ``?write_batch_bytes=...`` (a constructor option) was
    not taken out of the query by from_url but handed to redis-py ("bad Redis URL or client
    option ... unexpected keyword argument 'write_batch_bytes'"), and ``?cluster=2`` or
    ``?cluster=ja`` built a standalone tier in silence."""
    url = "redis://127.0.0.1:1/0"
    with RedisTier.from_url(url + "?write_batch_bytes=4096", block_bytes=BLOCK,
                            fingerprint=FP) as tier:
        assert tier.write_batch_bytes == 4096
    for text, want in (("1", True), ("TRUE", True), ("on", True), ("0", False),
                       ("false", False), ("No", False), ("off", False)):
        with RedisTier.from_url(f"{url}?cluster={text}", block_bytes=BLOCK,
                                fingerprint=FP) as tier:  # a cluster client connects lazily
            assert tier.cluster is want
    for text in ("2", "ja", ""):
        with pytest.raises(ValueError, match=f"cluster={text!r} is not a valid cluster"):
            RedisTier.from_url(f"{url}?cluster={text}", block_bytes=BLOCK, fingerprint=FP)
    with pytest.raises(ValueError, match="write_batch_bytes must be an int > 0"):
        RedisTier.from_url(url + "?write_batch_bytes=0", block_bytes=BLOCK, fingerprint=FP)


def test_from_url_names_a_repeated_query_option_and_the_rule_of_a_bad_one():
    """Found by a newcomer session: ``?block_bytes=64&block_bytes=128`` built a tier of 128
    bytes in silence (the last one won), and a bad value said only "is not a valid
    block_bytes" without the rule."""
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(ValueError, match=r"Redis URL option block_bytes is given twice in the "
                                         r"query \('64', '128'\): give it once"):
        RedisTier.from_url(url + "?block_bytes=64&block_bytes=128", fingerprint=FP)
    for query, rule in (("block_bytes=big", "an int"), ("timeout_s=fast", "a number"),
                        ("cluster=maybe", "1/true/yes/on or 0/false/no/off")):
        with pytest.raises(ValueError, match=rf"is not a valid \w+: {rule}$"):
            RedisTier.from_url(f"{url}?{query}", block_bytes=BLOCK, fingerprint=FP)


def test_a_query_password_is_shown_as_three_stars():
    """Found by a newcomer pass: ?password=... was shown as %2A%2A%2A (the query was
    re-encoded); the rest of the query is kept as written."""
    url = f"redis://127.0.0.1:6379/0?ssl_cert_reqs=none&password={SECRET}&x=a%20b&PassWord=q"
    assert redact_url(url) == ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none&password=***"
                               "&x=a%20b&PassWord=***")
    assert redact_url(f"redis://u:{SECRET}@h:1/0?password={SECRET}") == \
        "redis://u:***@h:1/0?password=***"


@pytest.mark.parametrize("url", ["localhost:6379", "127.0.0.1", "x", ""])
def test_a_url_without_redis_scheme_is_named_as_given(url):
    """Found by newcomer10: redact_url (and from_url's rebuilt URL) wrote a URL without a
    ``scheme://`` back mangled, so the error named a URL nobody gave: ``localhost:6379`` as
    ``localhost://6379``, ``127.0.0.1`` as ``://27.0.0.1`` (its first character dropped)."""
    assert redact_url(url) == url
    for make in (RedisTier, RedisTier.from_url):
        with pytest.raises(ValueError, match="must use redis://") as info:
            make(url, block_bytes=BLOCK, fingerprint=FP)
        assert f"Redis URL {url!r} must use" in str(info.value)


@pytest.mark.parametrize("blocks, match", [
    (None, r"RedisTier.write: blocks must be an iterable of blocks, got None"),
    (bytearray(BLOCK), r"RedisTier.write: blocks must be a list of blocks, not a single "
                       r"bytearray object of \d+ bytes \(wrap it in a list\)"),
])
def test_write_names_blocks_that_are_not_a_list_of_blocks(blocks, match):
    """Found by newcomer10: write([1], None) raised "'NoneType' object is not iterable", and
    write([1], one_block) "write got 1 keys but N blocks" (the block's bytes as blocks)."""
    with RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP) as tier:
        with pytest.raises(TypeError, match=match):
            tier.write([1], blocks)
        assert tier.stats().writes == 0


@pytest.mark.parametrize("cluster", ["no", 1, None])
def test_cluster_must_be_a_bool(cluster):
    """Found by a newcomer session: ``cluster="no"`` was read as True (a cluster tier with
    pipelined lookups)."""
    with pytest.raises(ValueError, match="cluster must be a bool"):
        RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP, cluster=cluster)


def test_numpy_ints_are_taken_for_ttl_and_breaker_failures():
    """Found by a newcomer session: ttl_s=np.int64(5) and breaker_failures=np.int64(5) were
    refused ("must be ... an int") where block_bytes and the queue sizes take numpy ints."""
    np = pytest.importorskip("numpy")
    with RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP,
                   ttl_s=np.int64(5), breaker_failures=np.int32(4)) as tier:
        assert tier.ttl_s == 5 and type(tier.ttl_s) is int
        assert tier.breaker.failure_threshold == 4
        assert type(tier.breaker.failure_threshold) is int
    for kw in ({"ttl_s": np.bool_(True)}, {"breaker_failures": np.bool_(True)},
               {"ttl_s": 1.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP, **kw)


def test_a_ttl_redis_refuses_is_refused_at_construction(shared_redis_server):
    """Found by newcomer10: ttl_s=10**20 (or 2**62: 'keep them for ever') was taken, and
    every write then failed on the server ("ERR invalid expire time"), counted as backend
    errors only. Redis takes EX up to about 9.2e15 s; the tier takes up to 9e15."""
    with pytest.raises(ValueError, match=r"ttl_s must be None or an int > 0 seconds, at most "
                                         r"9,000,000,000,000,000 \(Redis refuses"):
        RedisTier(shared_redis_server.url, block_bytes=BLOCK, fingerprint=FP, ttl_s=2**62)
    with make_tier(shared_redis_server.url, ttl_s=9 * 10**15) as tier:
        tier.write([1], blocks_for([1]))
        assert tier.flush(10) and tier.lookup_prefix([1]) == 1
        assert tier.stats().writes_failed == 0


# -1 and -0.5: found by a newcomer session, flush(-1) was taken as "do not wait"
@pytest.mark.parametrize("timeout", [float("nan"), "5", True, -1, -0.5])
def test_close_and_flush_refuse_a_bad_timeout_before_closing(timeout):
    """Found by a newcomer session: ``close(float("nan"))`` marked the tier closed, then
    Thread.join raised a bare 'Invalid value NaN (not a number)', so the clients were never
    closed, and a second close() returned at once (already closed)."""
    tier = RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP)
    with pytest.raises(ValueError, match="flush: timeout must be None or a number of sec"):
        tier.flush(timeout)
    with pytest.raises(ValueError, match="close: timeout must be None or a number of sec"):
        tier.close(timeout)
    assert tier.lookup_prefix([1]) == 0  # still open
    tier.close()
    with pytest.raises(RuntimeError, match="closed"):
        tier.lookup_prefix([1])


def test_an_infinite_timeout_waits_as_none_does(shared_redis_server):
    """Found by a newcomer session: flush(float("inf")) with writes queued and
    close(float("inf")) raised OverflowError ('timeout value is too large', from the
    Condition / Thread.join underneath), close after marking the tier closed."""
    tier = make_tier(shared_redis_server.url)
    tier.write([1, 2], blocks_for([1, 2]))
    assert tier.flush(float("inf")) is True
    tier.close(float("inf"))
    with pytest.raises(RuntimeError, match="closed"):
        tier.lookup_prefix([1])


def test_queue_bound_drops_and_counts(shared_redis_server):
    size = HEADER_BYTES + BLOCK
    with make_tier(shared_redis_server.url, max_queue_bytes=3 * size) as tier:
        keys = list(range(50))
        accepted = tier.write(keys, blocks_for(keys))
        assert 3 <= accepted < 50  # the writer may have taken some off the queue already
        s = tier.stats()
        assert s.writes == accepted and s.writes_skipped == 50 - accepted
        assert s.queued_bytes <= 3 * size
        tier.flush(10)
        assert tier.stats().writes_completed == accepted
        assert tier.lookup_prefix(keys) == accepted  # the first ones were taken, in order


# -- a server that is down or slow ------------------------------------------------------------
def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def test_redis_killed_mid_run_then_restarted(redis_server):
    keys = list(range(20))
    data = blocks_for(keys)
    tier = make_tier(redis_server.url, breaker_cooldown_s=0.3)
    try:
        tier.write(keys, data)
        assert tier.flush(10)
        assert tier.lookup_prefix(keys) == 20
        redis_server.kill()  # kill -9 mid-run
        worst = 0.0
        for _ in range(50):
            n, dt = _timed(tier.lookup_prefix, keys)
            assert n == 0
            worst = max(worst, dt)
            got, dt = _timed(tier.read, keys[:4])
            assert got == [None] * 4
            worst = max(worst, dt)
        # every call answered within the timeout (0.05 s); the bound here leaves room for a
        # busy CI host, the benchmark records the real figures
        assert worst < 0.5, worst
        s = tier.stats()
        assert s.backend_errors >= 1 and s.breaker_opens >= 1
        assert s.calls_refused >= 90  # the open breaker answered the rest at once
        assert s.lookups - s.lookup_hits >= 50  # every lookup counted as a miss
        assert s.breaker_state in ("open", "half_open")
        # writes while down: accepted-then-failed or skipped, all counted, none raises
        before = tier.stats()
        tier.write([100, 101], blocks_for([100, 101]))
        assert tier.flush(5)
        after = tier.stats()
        assert (after.writes_failed + after.writes_skipped) - (
            before.writes_failed + before.writes_skipped) == 2
        # the server comes back on the same port (empty: it had no persistence)
        RedisServer(redis_server.workdir, redis_server.port).start()
        redis_server.proc = None
        deadline = time.monotonic() + 5
        while tier.breaker.state != "half_open" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tier.lookup_prefix(keys) == 0  # the probe succeeds: a real miss
        assert tier.breaker.state == "closed"
        assert tier.write(keys[:3], data[:3]) == 3
        assert tier.flush(10)
        assert tier.lookup_prefix(keys) == 3
        assert tier.read(keys[:3]) == data[:3]
    finally:
        tier.close()
        # the restarted server: stop it through its port
        subprocess.run(["redis-cli", "-p", str(redis_server.port), "shutdown", "nosave"],
                       capture_output=True, timeout=10)


def test_redis_hung_lookups_answer_within_timeout(redis_server):
    """SIGSTOP: connections are accepted but nothing answers: socket timeouts, breaker."""
    keys = list(range(8))
    data = blocks_for(keys)
    tier = make_tier(redis_server.url, timeout_s=0.05, breaker_cooldown_s=0.2)
    try:
        tier.write(keys, data)
        assert tier.flush(10)
        redis_server.pause()
        times = []
        for _ in range(30):
            n, dt = _timed(tier.lookup_prefix, keys)
            assert n == 0
            times.append(dt)
            time.sleep(0.02)
        # calls that reached the server waited one timeout; the others were refused at once
        assert max(times) < 0.5, max(times)
        assert sum(t >= 0.04 for t in times) >= 3  # real timeouts happened
        assert tier.stats().backend_errors >= 3
        redis_server.resume()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if tier.lookup_prefix(keys) == 8:
                break
            time.sleep(0.05)
        assert tier.lookup_prefix(keys) == 8
        assert tier.read(keys) == data
    finally:
        redis_server.resume()
        tier.close()


def test_server_down_from_the_start_never_raises(tmp_path):
    from redis_servers import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    with make_tier(url, breaker_cooldown_s=10) as tier:
        for _ in range(10):
            assert tier.lookup_prefix([1, 2]) == 0
            assert tier.read([1]) == [None]
        tier.write([1], blocks_for([1]))
        assert tier.flush(5)
        s = tier.stats()
        assert s.backend_errors == 3 and s.breaker_opens == 1  # 3 failures opened it
        assert s.writes_failed + s.writes_skipped == 1


def test_ping_raises_for_a_dead_server_and_passes_for_a_live_one(shared_redis_server):
    from redis_servers import free_port

    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    with make_tier(url) as tier:
        with pytest.raises(ConnectionError, match="not reachable") as info:
            tier.ping()
        assert SECRET not in str(info.value) and "***" in str(info.value)
        assert tier.stats().backend_errors == 0  # a check, not an engine call
    with make_tier(shared_redis_server.url) as tier:
        tier.ping()


def test_a_database_index_the_server_lacks_is_refused_at_construction(shared_redis_server):
    """Found by a newcomer pass: redis://host:port/99999 (redis-server has 16 databases)
    built a tier whose every call failed on SELECT and answered miss in silence."""
    base = shared_redis_server.url.rsplit("/", 1)[0]
    with pytest.raises(ValueError, match=r"/99999: the server has no database 99999 "
                                         r"\(DB index is out of range"):
        make_tier(base + "/99999")
    with pytest.raises(ValueError, match=r"database index \(the path, /db\) must be an int "
                                         r">= 0, got -1"):
        make_tier(base + "/-1")
    with make_tier(base + "/15") as tier:  # the last of the default 16
        tier.write([1], [b"x" * BLOCK])
        assert tier.flush(5)
        assert tier.lookup_prefix([1]) == 1
    from redis_servers import free_port

    # an unreachable server is not an error at construction: calls answer miss until it is up
    with make_tier(f"redis://127.0.0.1:{free_port()}/99999") as tier:
        assert tier.lookup_prefix([1]) == 0


def test_purge_deletes_only_its_namespace_and_fingerprint(shared_redis_server):
    r = raw_client(shared_redis_server)
    ns = f"p*?{uuid.uuid4().hex[:6]}"  # glob characters in the namespace are matched as such
    keys = list(range(2500))
    with make_tier(shared_redis_server.url, namespace=ns) as tier, \
            make_tier(shared_redis_server.url, namespace=ns, fingerprint=FP + "-other") as other, \
            make_tier(shared_redis_server.url, namespace=ns + "x") as longer:
        for t in (tier, other, longer):
            t.write(keys[:10], blocks_for(keys[:10]))
        tier.write(keys[10:], blocks_for(keys[10:]))
        for t in (tier, other, longer):
            assert t.flush(20)
        decoy = b"pXYZ" + tier.redis_key(0)[3:]  # matched by the namespace as a glob
        r.set(decoy, b"1")
        before = r.dbsize()
        assert tier.purge(batch=300) == 2500
        assert r.dbsize() == before - 2500
        assert tier.lookup_prefix(keys) == 0
        assert other.lookup_prefix(keys[:10]) == 10 and longer.lookup_prefix(keys[:10]) == 10
        assert tier.purge() == 0 and r.exists(decoy)
        r.delete(decoy)
        with pytest.raises(ValueError, match="batch"):
            tier.purge(batch=0)


def test_no_client_setinfo_and_no_deprecation_warning(shared_redis_server):
    """The tier skips CLIENT SETINFO on connect (one round trip less) with the option of the
    installed redis-py: driver_info=None from 7.2 (lib_name/lib_version warn there), else
    lib_name=None, lib_version=None."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # redis-py 7.x: DeprecationWarning for lib_name
        with make_tier(shared_redis_server.url) as tier:
            tier.write([1], blocks_for([1]))
            assert tier.flush(10)
            assert tier.lookup_prefix([1]) == 1 and tier.read([1]) == blocks_for([1])
            for kind in ("lookup", "read", "write"):
                conn = tier._client(kind).connection_pool.make_connection()
                if hasattr(redis_py, "DriverInfo"):
                    assert conn.driver_info is None
                else:
                    assert conn.lib_name is None and conn.lib_version is None
                conn.disconnect()


def test_circuit_breaker_states():
    b = CircuitBreaker(failure_threshold=2, cooldown_s=0.05)
    assert b.allow()
    assert not b.failure() and b.state == "closed"
    assert b.failure() and b.state == "open"
    assert not b.allow()
    time.sleep(0.06)
    assert b.state == "half_open"
    assert b.allow()  # the probe
    assert not b.allow()  # only one probe at a time
    assert b.failure() and b.state == "open" and b.opens == 2
    time.sleep(0.06)
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow()


def test_a_probe_interrupted_by_ctrl_c_does_not_stick_the_breaker(tmp_path, monkeypatch):
    """Found by a newcomer session: a KeyboardInterrupt inside the half-open probe's server
    call left the breaker half-open with the probe 'in flight' forever: every later call
    was refused at once (all misses, dropped writes) with no error anywhere."""
    tier = RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP,
                     breaker_failures=1, breaker_cooldown_s=0.05)
    try:
        assert tier.lookup_prefix([1]) == 0  # refused connection: the breaker opens
        assert tier.breaker.state == "open"
        time.sleep(0.06)

        def interrupted(rkeys):
            raise KeyboardInterrupt

        monkeypatch.setattr(tier, "_lookup", interrupted)
        with pytest.raises(KeyboardInterrupt):
            tier.lookup_prefix([1])  # the probe
        monkeypatch.undo()
        refused = tier.stats().calls_refused
        assert tier.breaker.state == "half_open"
        assert tier.lookup_prefix([1]) == 0  # a new probe reaches the (dead) server
        assert tier.stats().calls_refused == refused
        assert tier.breaker.state == "open"
    finally:
        tier.close()


# -- sharing between processes ----------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys, random
    from kvtier.tiers.redis import RedisTier
    url, ns, fp, mode = sys.argv[1:5]
    def block(k):
        return random.Random(f"0-{k}").randbytes(4096)
    with RedisTier(url, block_bytes=4096, fingerprint=fp, namespace=ns) as t:
        if mode == "write":
            keys = list(range(1000, 1010))
            assert t.write(keys, [block(k) for k in keys]) == 10
            assert t.flush(10)
            print("wrote", t.stats().writes_completed)
        else:
            keys = list(range(2000, 2016))
            n = t.lookup_prefix(keys)
            got = t.read(keys[:n])
            ok = all(g == block(k) for g, k in zip(got, keys))
            print("read", n, ok)
""")


def test_two_processes_share_prefixes(shared_redis_server):
    ns = f"p{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=SRC)

    def child(mode):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, shared_redis_server.url, ns, FP, mode],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    # another process writes a prefix; this one finds and reads it
    assert child("write") == ["wrote", "10"]
    with make_tier(shared_redis_server.url, namespace=ns) as tier:
        keys = list(range(1000, 1010))
        assert tier.lookup_prefix(keys + [1010]) == 10
        assert tier.read(keys) == blocks_for(keys)
        # this process writes 12 of 16 blocks; the other finds the 12 and reads them intact
        mine = list(range(2000, 2012))
        tier.write(mine, blocks_for(mine))
        assert tier.flush(10)
    assert child("read") == ["read", "12", "True"]


# -- Redis Cluster ----------------------------------------------------------------------------
def test_cluster_round_trip_across_slots(redis_cluster):
    keys = list(range(300))
    data = blocks_for(keys)
    with make_tier(redis_cluster.url, cluster=True) as tier:
        assert tier.lookup_mode == "pipeline"
        assert tier.lookup_prefix(keys) == 0
        assert tier.write(keys, data) == 300
        assert tier.flush(20)
        assert tier.stats().writes_completed == 300
        assert tier.lookup_prefix(keys) == 300
        assert tier.lookup_prefix(keys[:150] + [-1] + keys[150:]) == 150
        assert tier.read(keys) == data
        # the blocks really spread over the three nodes (no hash tag)
        sizes = [int(s.cli("DBSIZE").strip()) for s in redis_cluster.servers]
        assert all(n > 30 for n in sizes) and sum(sizes) >= 300, sizes
        # corruption in a cluster is caught the same way
        rc = redis_py.cluster.RedisCluster.from_url(redis_cluster.url)
        rk = tier.redis_key(5)
        rc.set(rk, rc.get(rk)[:-1])
        got = tier.read(keys[:10])
        assert got[5] is None and got[:5] == data[:5] and got[6:] == data[6:10]
        assert tier.stats().read_errors == 1
        rc.close()


def test_cluster_purge_reaches_every_node(redis_cluster):
    keys = list(range(200))
    with make_tier(redis_cluster.url, cluster=True) as tier:
        tier.ping()
        tier.write(keys, blocks_for(keys))
        assert tier.flush(20)
        before = sum(int(s.cli("DBSIZE").strip()) for s in redis_cluster.servers)
        assert tier.purge(batch=50) == 200
        after = sum(int(s.cli("DBSIZE").strip()) for s in redis_cluster.servers)
        assert before - after == 200 and tier.lookup_prefix(keys) == 0


def test_cluster_down_from_the_start_never_raises():
    from redis_servers import free_port

    with make_tier(f"redis://127.0.0.1:{free_port()}/0", cluster=True) as tier:
        (n, dt1), (got, dt2) = _timed(tier.lookup_prefix, [1, 2]), _timed(tier.read, [1])
        assert (n, got) == (0, [None])
        assert max(dt1, dt2) < 0.5
        assert tier.stats().backend_errors == 2


# -- credentials ------------------------------------------------------------------------------
SECRET = "s3cr3t-Pa55word"


def test_password_is_never_shown_or_logged(tmp_path_factory, caplog, monkeypatch):
    from redis_servers import require_redis

    require_redis()
    server = RedisServer(tmp_path_factory.mktemp("auth"), password=SECRET).start()
    caplog.set_level(logging.DEBUG)
    try:
        good = f"redis://default:{SECRET}@127.0.0.1:{server.port}/0"
        assert SECRET not in redact_url(good) and "***" in redact_url(good)
        with make_tier(good) as tier:
            assert SECRET not in repr(tier) and SECRET not in str(tier)
            tier.write([1], blocks_for([1]))
            assert tier.flush(10)
            assert tier.read([1]) == blocks_for([1])
            assert SECRET not in repr(tier.stats())
        # a wrong password: misses and errors, and nothing logged shows it
        wrong = f"redis://default:{SECRET}x@127.0.0.1:{server.port}/0"
        with make_tier(wrong) as tier:
            assert tier.lookup_prefix([1]) == 0
            assert tier.stats().backend_errors == 1
            assert SECRET not in repr(tier)
        # no password: the server refuses (NOAUTH); the env var supplies it
        bare = f"redis://127.0.0.1:{server.port}/0"
        with make_tier(bare) as tier:
            assert tier.lookup_prefix([1]) == 0 and tier.stats().backend_errors == 1
        monkeypatch.setenv("KVTIER_REDIS_PASSWORD", SECRET)
        with RedisTier.from_url(bare, block_bytes=BLOCK, fingerprint=FP,
                                namespace="x") as tier:
            assert SECRET not in repr(tier)
            assert tier.lookup_prefix([1]) == 0 and tier.stats().backend_errors == 0
        # errors raised for bad URLs/options do not show it either
        for bad in (f"redis://u:{SECRET}@127.0.0.1:99999999/0",
                    f"redis://u:{SECRET}@127.0.0.1:{server.port}/0?health_check_interval=abc"):
            with pytest.raises(ValueError) as exc:
                RedisTier.from_url(bad, block_bytes=BLOCK, fingerprint=FP)
            assert SECRET not in str(exc.value)
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert "NOAUTH" in text or "invalid" in text.lower() or "auth" in text.lower()
        assert SECRET not in text
    finally:
        server.stop()


def test_from_url_opens_a_unix_socket_url(tmp_path_factory, monkeypatch):
    """Found by a newcomer session: RedisTier.from_url("unix:///path/redis.sock") (the form
    the docs name, and what KvtierRedisTier and ``kvtier replay --tiers`` pass on) always
    failed with redis-py's "Redis URL must specify one of the following schemes": from_url
    rebuilt the URL with urlunsplit, which writes an empty host as "unix:/path". And
    $KVTIER_REDIS_PASSWORD, documented to fill a missing password, was applied to redis://
    and rediss:// URLs only."""
    from redis_servers import require_redis

    require_redis()
    workdir = tmp_path_factory.mktemp("unix")
    sock = workdir / "r.sock"
    server = RedisServer(workdir, password=SECRET, extra=("--unixsocket", str(sock),
                                                          "--unixsocketperm", "700")).start()
    try:
        with RedisTier.from_url(f"unix://:{SECRET}@{sock}?namespace=u", block_bytes=BLOCK,
                                fingerprint=FP) as tier:
            assert repr(tier).startswith(f"RedisTier(url='unix://:***@{sock}")
            tier.write([1, 2], blocks_for([1, 2]))
            assert tier.flush(10)
            assert tier.lookup_prefix([1, 2, 3]) == 2
            assert tier.read([1, 2]) == blocks_for([1, 2])
            assert tier.stats().backend_errors == 0
        # no host part at all (the password in the query): the "//" must survive
        with RedisTier.from_url(f"unix://{sock}?password={SECRET}&namespace=u",
                                block_bytes=BLOCK, fingerprint=FP) as tier:
            assert f"url='unix://{sock}?password=***" in repr(tier)
            assert tier.lookup_prefix([1, 2]) == 2 and tier.stats().backend_errors == 0
        monkeypatch.setenv("KVTIER_REDIS_PASSWORD", SECRET)
        with RedisTier.from_url(f"unix://{sock}?namespace=u", block_bytes=BLOCK,
                                fingerprint=FP) as tier:
            assert SECRET not in repr(tier) and f"unix://:***@{sock}" in repr(tier)
            assert tier.lookup_prefix([1, 2]) == 2
            assert tier.stats().backend_errors == 0
    finally:
        server.stop()


def test_url_query_cannot_override_the_tier_timeouts():
    with pytest.raises(ValueError, match="socket_timeout"):
        RedisTier("redis://127.0.0.1:1/0?socket_timeout=30", block_bytes=BLOCK, fingerprint=FP)


@pytest.mark.parametrize("option", ["socket_timeout", "socket_connect_timeout"])
def test_client_options_cannot_set_the_tier_timeouts(option):
    """The tier sets these per kind of call (lookup, read, write): given in client_options
    they were replaced by the tier's in silence (socket_timeout=7 left lookups at 0.05 s)."""
    with pytest.raises(ValueError, match=rf"client_options sets \['{option}'\], which the "
                                         "tier sets itself; use its timeout_s"):
        RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP,
                  client_options={option: 7})


def test_url_query_mistakes_raise_at_construction():
    # tier options in the query need from_url (the constructor would hand them to redis-py)
    with pytest.raises(ValueError, match=r"from_url"):
        RedisTier("redis://127.0.0.1:1/0?cluster=1", block_bytes=BLOCK, fingerprint=FP)
    # an unknown redis-py option fails now, not as a miss on every later call
    with pytest.raises(ValueError, match="bad Redis URL or client option"):
        RedisTier("redis://127.0.0.1:1/0?no_such_option=1", block_bytes=BLOCK, fingerprint=FP)


# -- TLS --------------------------------------------------------------------------------------
def test_tls_round_trip(tmp_path):
    """rediss:// against a real redis-server with a self-signed certificate (CA = itself)."""
    from redis_servers import REDIS_SERVER, free_port, require_redis

    require_redis()
    import shutil as _sh

    if _sh.which("openssl") is None:
        if os.environ.get("CI"):
            pytest.fail("openssl not installed (.ci/run installs it)")
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )
    port = free_port()
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
         "--requirepass", SECRET],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        url = f"rediss://default:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        probe = redis_py.Redis.from_url(url, socket_timeout=1)
        for _ in range(100):
            try:
                probe.ping()
                break
            except redis_py.ConnectionError:
                time.sleep(0.05)
        probe.close()
        with make_tier(url, timeout_s=0.5) as tier:
            assert SECRET not in repr(tier) and "rediss://" in repr(tier)
            tier.write([1, 2], blocks_for([1, 2]))
            assert tier.flush(10)
            assert tier.lookup_prefix([1, 2, 3]) == 2
            assert tier.read([1, 2]) == blocks_for([1, 2])
        # plain redis:// to the TLS port fails as a miss, never an exception
        with make_tier(f"redis://default:{SECRET}@127.0.0.1:{port}/0", timeout_s=0.2) as plain:
            assert plain.lookup_prefix([1]) == 0 and plain.stats().backend_errors == 1
        # a client that does not trust the certificate: a miss, counted
        with make_tier(f"rediss://default:{SECRET}@127.0.0.1:{port}/0",
                       timeout_s=0.5) as untrusted:
            assert untrusted.lookup_prefix([1]) == 0
            assert untrusted.stats().backend_errors == 1
    finally:
        proc.terminate()
        proc.wait(10)


# -- a cluster node dies ----------------------------------------------------------------------
def test_cluster_node_killed_answers_miss_within_timeout(tmp_path):
    from redis_servers import RedisClusterNodes, require_redis

    require_redis()
    cluster = RedisClusterNodes(tmp_path / "cl").start()
    try:
        keys = list(range(60))
        data = blocks_for(keys)
        with make_tier(cluster.url, cluster=True, breaker_cooldown_s=0.2) as tier:
            tier.write(keys, data)
            assert tier.flush(20)
            assert tier.lookup_prefix(keys) == 60
            cluster.servers[2].kill()
            worst = 0.0
            for _ in range(20):
                (n, dt) = _timed(tier.lookup_prefix, keys)
                worst = max(worst, dt)
                assert n < 60  # a third of the keys are on the dead node
                got, dt = _timed(tier.read, keys)
                worst = max(worst, dt)
                assert all(g is None or g == d for g, d in zip(got, data))
                time.sleep(0.02)
            s = tier.stats()
            assert s.backend_errors >= 1 and s.read_errors == 0
            assert worst < 1.0, worst
    finally:
        cluster.stop()


# -- threads ----------------------------------------------------------------------------------
def test_concurrent_callers(shared_redis_server):
    import threading

    errors = []
    with make_tier(shared_redis_server.url) as tier:
        def worker(base):
            try:
                keys = list(range(base, base + 40))
                data = blocks_for(keys)
                for i in range(0, 40, 8):
                    assert tier.write(keys[i:i + 8], data[i:i + 8]) == 8
                assert tier.flush(20)
                assert tier.lookup_prefix(keys) == 40
                assert tier.read(keys) == data
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i * 1000,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        s = tier.stats()
        assert (s.writes, s.writes_completed, s.read_hits, s.lookup_hits) == (160, 160, 160, 160)


def test_concurrent_reads_of_compressed_blocks_never_share_a_decompressor(
        shared_redis_server, monkeypatch):
    """Every public method may be called from any thread (module docstring), but one
    zstandard.ZstdDecompressor served every read and is not safe for concurrent use. Found
    by a newcomer session: 4 threads reading 256 KiB zstd blocks got 7 of 9,600 good blocks
    back as None, counted in read_errors and logged as corrupt. The probe below overlaps two
    reads inside decompress on purpose."""
    import threading

    import zstandard

    real = zstandard.ZstdDecompressor
    overlaps = []
    guard = threading.Lock()

    class Probe:
        def __init__(self, *args, **kwargs):
            self._inner = real(*args, **kwargs)
            self._active = 0

        def decompress(self, *args, **kwargs):
            with guard:
                self._active += 1
                if self._active > 1:
                    overlaps.append(threading.current_thread().name)
            try:
                time.sleep(0.05)
                return self._inner.decompress(*args, **kwargs)
            finally:
                with guard:
                    self._active -= 1

    monkeypatch.setattr(zstandard, "ZstdDecompressor", Probe)
    zeros = bytes(BLOCK)
    with make_tier(shared_redis_server.url, compression="zstd") as tier:
        tier.write(["z"], [zeros])
        assert tier.flush(10)
        got = []
        threads = [threading.Thread(target=lambda: got.append(tier.read(["z"])))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == [[zeros]] * 3
        assert overlaps == []
        assert tier.stats().read_errors == 0


def test_a_write_racing_close_is_refused_not_left_in_the_queue(shared_redis_server):
    """Found by a newcomer session (the module says every method may be called from any
    thread): a write() that had passed its closed check when close() ran enqueued its blocks
    after the writer thread had drained the queue and stopped: write returned them as
    accepted, they were never sent nor counted as failed, stats().queued_blocks stayed > 0
    and flush() without a timeout never returned. The write now sees the close and raises."""
    tier = make_tier(shared_redis_server.url)
    outcome = [_race_close(tier, lambda: tier.write(["late"], blocks_for(["late"])))]
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome
    assert "closed" in str(outcome[0])
    assert tier.stats().queued_blocks == 0 and tier.flush(timeout=2)


def _named_connections(servers, name, expect=0, wait_s=2.0):
    """The connections named ``name`` (redis-py's ``client_name``) on ``servers``, polled up
    to ``wait_s`` seconds until there are ``expect`` of them (a closed socket leaves the
    server's CLIENT LIST a moment later)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [line for s in servers for line in s.cli("CLIENT", "LIST").splitlines()
                 if f" name={name} " in line]
        if len(found) == expect or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _race_close(tier, call):
    """Run ``call()`` (a tier call naming the key ``"late"``) on a thread that stops after the
    call's closed check, close the tier meanwhile, let the call go on; its outcome (result or
    exception)."""
    import threading

    paused, go_on = threading.Event(), threading.Event()
    real_key = tier.redis_key

    def slow_key(key):  # the calling thread stops between its closed check and the server
        if key == "late":
            paused.set()
            go_on.wait(10)
        return real_key(key)

    tier.redis_key = slow_key
    outcome = []

    def late_call():
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001 (the outcome is checked by the test)
            outcome.append(exc)

    caller = threading.Thread(target=late_call)
    caller.start()
    assert paused.wait(10)
    tier.close()
    go_on.set()
    caller.join(10)
    assert not caller.is_alive() and len(outcome) == 1, outcome
    return outcome[0]


@pytest.mark.parametrize("method", ["lookup_prefix", "read"])
def test_a_lookup_or_read_racing_close_opens_no_connection(shared_redis_server, method):
    """Noticed in session 16: a lookup_prefix or read on another thread that had passed its
    closed check when close() ran went on to the server, and redis-py reconnected lazily: a
    connection open after close() had returned, which nothing would close. Such a call now
    raises RuntimeError (closed), as a call made after close() does; it opens no connection
    and is no server failure (no backend_errors, the breaker stays closed)."""
    name = f"race{uuid.uuid4().hex[:8]}"
    tier = make_tier(shared_redis_server.url, client_options={"client_name": name})
    tier.write([1], blocks_for([1]))
    assert tier.flush(10)
    assert tier.lookup_prefix([1]) == 1 and tier.read([1]) == blocks_for([1])
    assert len(_named_connections([shared_redis_server], name, expect=3)) == 3
    outcome = _race_close(tier, lambda: getattr(tier, method)(["late", 1]))
    assert _named_connections([shared_redis_server], name) == []
    assert isinstance(outcome, RuntimeError) and "is closed" in str(outcome), outcome
    s = tier.stats()
    assert (s.backend_errors, s.calls_refused, s.breaker_state) == (0, 0, "closed")
    assert (s.lookups, s.reads) == (1, 1)  # the raced call counted nothing


def test_a_lookup_waiting_on_the_server_when_close_runs_raises_closed(redis_server):
    """close() closes the connections a running call waits on (redis-py's pool disconnect
    shuts their sockets): the call then raises RuntimeError (closed), as one that close()
    overtook before the server does, instead of counting a server failure (a backend error,
    one step towards opening the breaker) for a server that did nothing wrong."""
    import threading

    tier = make_tier(redis_server.url, timeout_s=5.0, breaker_failures=1)
    assert tier.lookup_prefix([1]) == 0  # a connection in the lookup pool
    redis_server.pause()  # the next lookup waits for its reply
    outcome = []

    def waiting_lookup():
        try:
            outcome.append(tier.lookup_prefix([1]))
        except Exception as exc:  # noqa: BLE001 (the outcome is checked below)
            outcome.append(exc)

    try:
        caller = threading.Thread(target=waiting_lookup)
        caller.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        tier.close()
        caller.join(10)
        waited = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome
    assert "is closed" in str(outcome[0]) and waited < 2.0  # not its 5 s timeout
    s = tier.stats()
    assert (s.backend_errors, s.breaker_opens, s.lookups) == (0, 0, 1)

def test_closing_a_cluster_tier_closes_its_node_connections(redis_cluster):
    """Found in session 17: close() of a cluster tier left every node connection open.
    redis-py's RedisCluster.close() closes each node's Redis client, but those clients were
    built on a connection pool of their own (not closed with the client), so their sockets
    stayed open until the process ended: one per node and kind of call, per tier."""
    name = f"cclose{uuid.uuid4().hex[:8]}"
    tier = make_tier(redis_cluster.url, cluster=True, client_options={"client_name": name})
    keys = list(range(60))
    assert tier.write(keys, blocks_for(keys)) == 60 and tier.flush(20)
    assert tier.lookup_prefix(keys) == 60 and tier.read(keys) == blocks_for(keys)
    opened = _named_connections(redis_cluster.servers, name, expect=9)
    assert len(opened) == 9, opened  # 3 nodes x lookup, read and write clients
    tier.close()
    assert _named_connections(redis_cluster.servers, name) == []


@pytest.mark.parametrize("built", [False, True], ids=["first-call", "later-call"])
def test_a_cluster_lookup_racing_close_opens_no_connection(redis_cluster, built):
    """The same on a cluster, where the client is built on first use: a first lookup that
    close() overtook built the cluster clients after close() had closed none, and a later
    one reconnected to the nodes; both left connections open on the nodes."""
    name = f"crace{uuid.uuid4().hex[:8]}"
    tier = make_tier(redis_cluster.url, cluster=True, client_options={"client_name": name})
    if built:
        assert tier.lookup_prefix([1]) == 0
        assert _named_connections(redis_cluster.servers, name, expect=1) != []
    outcome = _race_close(tier, lambda: tier.lookup_prefix(["late", 1]))
    assert _named_connections(redis_cluster.servers, name) == []
    assert isinstance(outcome, RuntimeError) and "is closed" in str(outcome), outcome
    assert tier.stats().backend_errors == 0


@pytest.mark.parametrize(("config", "said"), [
    ((("maxmemory-policy", "noeviction"), ("maxmemory", "1")), "out of memory"),
    ((("min-replicas-to-write", "1"),), "NOREPLICAS"),
], ids=["oom", "noreplicas"])
def test_a_server_that_refuses_writes_keeps_serving_reads(redis_server, caplog, config, said):
    """An error reply to a write comes from a server that is up: the writes fail and are
    counted, the breaker stays closed (lookups and reads of the blocks it holds go on), one
    warning quoting the reply. Noticed in session 9 (docs/redis.md) for OOM (maxmemory under
    noeviction): every refused write counted as a breaker failure, after 3 the breaker
    opened and lookups and reads answered miss. Session 16: any other error reply still did
    (NOREPLICAS here, as with min-replicas-to-write; MISCONF when the server cannot save,
    READONLY for a replica, NOPERM for an ACL user without writes)."""
    keys = list(range(8))
    data = blocks_for(keys)
    tier = make_tier(redis_server.url, breaker_failures=3, breaker_cooldown_s=10)
    try:
        tier.write(keys, data)
        assert tier.flush(10)
        for name, value in config:
            redis_server.cli("CONFIG", "SET", name, value)
        caplog.set_level(logging.DEBUG, logger="kvtier.tiers.redis")
        for i in range(6):  # twice the breaker's threshold, one batch each
            more = [100 + 2 * i, 101 + 2 * i]
            tier.write(more, blocks_for(more))
            assert tier.flush(10)
        s = tier.stats()
        assert s.writes_failed == 12 and s.backend_errors == 6
        assert s.breaker_opens == 0 and s.breaker_state == "closed"
        assert tier.lookup_prefix(keys) == 8
        assert tier.read(keys) == data
        refused = [r for r in caplog.records if said in r.getMessage()]
        assert [r.levelno for r in refused] == [logging.WARNING] + [logging.DEBUG] * 5
    finally:
        tier.close()


@pytest.mark.parametrize("refusal", ["oom", "noperm"])
def test_a_ttl_batch_partly_refused_counts_each_block(redis_server, caplog, refusal):
    """Noticed in session 16: with ttl_s a batch goes as one SET per block, and the server
    may refuse some of them only (OOM once maxmemory is reached under noeviction; NOPERM
    for the keys an ACL user may not write). The whole batch was counted failed although
    the blocks before the refusal were stored and read back verified. Now each block counts
    as the server answered it: written (writes_completed, bytes_written) or refused
    (writes_failed), as MSET without a TTL counts its all-or-nothing answer; the batch is
    one backend error, and the breaker stays closed."""
    block = 64 << 10
    keys = list(range(1, 9))
    data = [bytes([k]) * block for k in keys]
    url = redis_server.url
    if refusal == "noperm":  # the user may write only the even keys' (str) Redis keys
        keys = [k if k % 2 else f"s{k}" for k in keys]
        ns = f"acl{uuid.uuid4().hex[:6]}"
        redis_server.cli("ACL", "SETUSER", "w17", "on", ">pw17", "+@all", "%R~*",
                         f"%W~{ns}:*:s*")
        url = url.replace("redis://", "redis://w17:pw17@")
    tier = make_tier(url, block_bytes=block, ttl_s=100, breaker_failures=1,
                     **({"namespace": ns} if refusal == "noperm" else {}))
    try:
        if refusal == "oom":  # room for about 4 more values of 64 KiB (80 KiB each in jemalloc)
            tier.write([0], [bytes(block)])
            assert tier.flush(10)
            used = int(redis_server.cli("INFO", "memory").split("used_memory:")[1].split()[0])
            redis_server.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
            redis_server.cli("CONFIG", "SET", "maxmemory", str(used + 4 * (80 << 10)))
        caplog.set_level(logging.WARNING, logger="kvtier.tiers.redis")
        before = tier.stats()
        redis_server.pause()  # the writer waits on a first block; the 8 then go as one batch
        tier.write(["first"], [bytes(block)])
        time.sleep(0.2)
        assert tier.write(keys, data) == 8
        redis_server.resume()
        assert tier.flush(10)
        s = tier.stats()
        raw = raw_client(redis_server)
        stored = [k for k in keys if raw.exists(tier.redis_key(k))]
        if refusal == "noperm":
            assert stored == [k for k in keys if isinstance(k, str)]
        else:
            assert 0 < len(stored) < 8 and stored == keys[:len(stored)], stored
        assert raw.exists(tier.redis_key("first")) == 1
        completed = s.writes_completed - before.writes_completed
        failed = s.writes_failed - before.writes_failed
        assert (completed, failed) == (1 + len(stored), 8 - len(stored))
        assert s.bytes_written - before.bytes_written == completed * (HEADER_BYTES + block)
        assert tier.read(stored) == [data[keys.index(k)] for k in stored]
        assert 0 < raw.ttl(tier.redis_key(stored[0])) <= 100
        assert s.backend_errors - before.backend_errors == 1
        assert (s.breaker_opens, s.breaker_state) == (0, "closed")
        said = "out of memory" if refusal == "oom" else "NoPermissionError"
        assert [r.levelno for r in caplog.records if said in r.getMessage()] == [logging.WARNING]
    finally:
        redis_server.resume()
        tier.close()

def test_a_cluster_batch_one_node_refuses_counts_each_block(redis_cluster):
    """In a cluster every batch is one SET per block (with or without ttl_s): a node that is
    full under noeviction refuses its blocks while the other nodes store theirs. The whole
    batch was counted failed; now the blocks the other nodes stored count as written."""
    import threading

    full = redis_cluster.servers[0]
    keys = list(range(40))
    tier = make_tier(redis_cluster.url, cluster=True)
    rc = redis_py.cluster.RedisCluster.from_url(redis_cluster.url)

    def on_full(key):
        return rc.get_node_from_key(tier.redis_key(key)).port == full.port

    first = next(f"first{i}" for i in range(100) if not on_full(f"first{i}"))
    gate = threading.Event()
    real_seal = tier._seal

    def gated_seal(rkey, block):  # the writer waits on a first block: the 40 go as one batch
        if rkey == tier.redis_key(first):
            gate.wait(10)
        return real_seal(rkey, block)

    tier._seal = gated_seal
    try:
        full.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
        full.cli("CONFIG", "SET", "maxmemory", "1")
        tier.write([first], blocks_for([first]))
        time.sleep(0.1)
        assert tier.write(keys, blocks_for(keys)) == 40
        gate.set()
        assert tier.flush(20)
    finally:
        gate.set()
        full.cli("CONFIG", "SET", "maxmemory", "512mb")
        full.cli("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    try:
        refused = [k for k in keys if on_full(k)]
        stored = [k for k in keys if rc.exists(tier.redis_key(k))]
        assert 0 < len(refused) < 40 and stored == [k for k in keys if k not in refused]
        s = tier.stats()
        assert (s.writes_completed, s.writes_failed) == (1 + len(stored), len(refused))
        assert s.bytes_written == (1 + len(stored)) * (HEADER_BYTES + BLOCK)
        assert (s.backend_errors, s.breaker_state) == (1, "closed")
        assert tier.read(stored) == blocks_for(stored)
    finally:
        rc.close()
        tier.close()

def test_a_block_that_is_not_bytes_like_is_named_and_blocks_may_be_any_iterable():
    """Found by a newcomer session: write([1], ["x" * BLOCK]) raised a bare "memoryview: a
    bytes-like object is required, not 'str'", and a generator of blocks "object of type
    'generator' has no len()" (DiskTier.write takes any iterable)."""
    with RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP) as tier:
        # "is an int", not "is a int": grammar found by a newcomer session (seen failing)
        for bad, article in (("x" * BLOCK, "a"), (None, "a"), (5, "an")):
            with pytest.raises(TypeError, match=rf"block for key 2 is {article} "
                                                rf"{type(bad).__name__}, not a bytes-like object"):
                tier.write([1, 2], [bytes(BLOCK), bad])
        assert tier.stats().writes == 0
        assert tier.write([1, 2], (b for b in blocks_for([1, 2]))) == 2


def test_a_dict_as_the_key_list_is_refused():
    """Found by a newcomer session: RedisTier.write({6: 1}, [block]) took the dict's keys as
    the key list and queued block 6. Refused (TypeError naming the method), nothing queued;
    lookup_prefix and read refuse it too."""
    with RedisTier("redis://127.0.0.1:1/0", block_bytes=BLOCK, fingerprint=FP) as tier:
        with pytest.raises(TypeError, match=r"RedisTier.write: keys must be a list of block "
                                            r"keys, not a dict"):
            tier.write({6: 1}, [bytes(BLOCK)])
        for method in ("lookup_prefix", "read"):
            with pytest.raises(TypeError, match=rf"RedisTier.{method}: keys must be a list of "
                                                r"block keys, not a dict"):
                getattr(tier, method)({6: 1})
        assert tier.stats().writes == 0


def test_docs_example_runs_as_written(shared_redis_server):
    """docs/redis.md's first example, on a live server: the lookup sees the blocks written."""
    import re

    from conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "redis.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    block = block.replace("redis://kv-cache:6379/0", shared_redis_server.url)
    keys = [b"doc-%d" % i for i in range(4)]
    ns = {"block_hashes": keys, "block_bytes_list": blocks_for(keys, size=2 << 20),
          "request_hashes": keys[:3] + [b"doc-absent"]}
    exec(compile(block, "docs/redis.md", "exec"), ns)  # noqa: S102 - the doc's own code
    assert ns["n"] == 3 and ns["blocks"] == ns["block_bytes_list"][:3]


def test_a_client_that_fails_to_close_is_logged_and_the_others_closed(shared_redis_server,
                                                                       caplog):
    """Session 15 (ruff S110): close() dropped a client's close error without a word. It
    still closes the other clients and returns, and says which client failed at DEBUG (the
    password scrubbed)."""
    tier = make_tier(shared_redis_server.url)
    closed = []
    clients = tier._client_map
    for kind, client in clients.items():
        real = client.close

        def close(kind=kind, real=real):
            closed.append(kind)
            real()
            if kind == "read":
                raise ConnectionError("socket gone")

        client.close = close
    caplog.set_level(logging.DEBUG, logger="kvtier.tiers.redis")
    tier.close()
    assert sorted(closed) == sorted(clients)
    logged = [r for r in caplog.records if "socket gone" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.DEBUG
    assert "read client" in logged[0].getMessage()


def test_close_that_times_out_drops_the_queued_writes_and_leaves_no_connection(redis_server):
    """close(timeout) says the writes still queued when the timeout passes are dropped and
    counted as failed. Before, the writer went on sending them after close had returned
    (19 of 20 blocks written seconds later, a hung server resumed), on a connection it
    opened after close had closed the clients: a socket nobody closed."""
    import threading

    name = f"r{uuid.uuid4().hex[:8]}"
    tier = make_tier(redis_server.url, name=name, block_bytes=1024, write_timeout_s=1.0,
                     write_batch_bytes=2048, breaker_failures=100)  # 2 blocks per batch
    tier.write([0], [bytes(1024)])
    assert tier.flush(5)
    redis_server.pause()  # hung: the writer's batch waits for its reply
    keys = list(range(1, 21))
    assert tier.write(keys, [bytes(1024)] * 20) == 20
    time.sleep(0.1)
    tier.close(timeout=0.3)
    redis_server.resume()
    writer = [t for t in threading.enumerate() if t.name == f"kvtier-redis-writer-{name}"]
    for t in writer:
        t.join(5)
    assert not any(t.is_alive() for t in writer)
    s = tier.stats()
    assert (s.writes, s.writes_completed, s.writes_failed) == (21, 1, 20)
    assert s.queued_blocks == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # only redis-cli's own connection is left
        clients = [c for c in redis_server.cli("CLIENT", "LIST").splitlines() if c]
        if len(clients) == 1:
            break
        time.sleep(0.05)
    assert len(clients) == 1, clients
