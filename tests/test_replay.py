"""Replay protocol: hand-checked counts on tiny traces."""

from __future__ import annotations

import math
import re

import pytest

from kvtier import available_policies
from kvtier.replay import log_grid, parse_capacity, replay
from kvtier.trace import Request, embedded_sample_path, read_trace


def reqs(*specs):
    """(keys, input_length) pairs -> Requests."""
    return [Request(list(keys), length, None, None) for keys, length in specs]


# Hand-checked with LRU, capacity 4, block_tokens 4, W=0 (LRU order least recent first):
#  R1 [1,2,3]  no hit; store 1,2,3                            order 3 2 1
#  R2 [1,2,4]  hits 2 (8 tok); load 1,2; store 4 (free slot)   order 3 2 1 4
#  R3 [5,6]    no hit; store 5,6 evicts 3,2                    order 1 4 6 5
#  R4 [1,2,3]  hits 1 (4 tok); load 1; store 2,3 evicts 4,6    order 5 1 3 2
#  R5 [5,1,3]  hits 3 (12 tok); nothing to store               order 2 3 1 5
TINY = reqs(([1, 2, 3], 10), ([1, 2, 4], 12), ([5, 6], 5), ([1, 2, 3], 12), ([5, 1, 3], 12))


def test_prefix_protocol_counts_by_hand():
    r = replay(TINY, "lru", 4, block_tokens=4)
    assert (r.requests, r.block_refs, r.hit_blocks) == (5, 14, 6)
    assert (r.input_tokens, r.hit_tokens) == (51, 24)
    assert (r.stored_blocks, r.evictions, r.store_failures, r.store_failed_blocks) == (
        8, 4, 0, 0
    )
    assert r.block_hit_ratio == pytest.approx(6 / 14)
    assert r.miss_ratio == pytest.approx(8 / 14)
    assert r.token_hit_ratio == pytest.approx(24 / 51)
    assert r.parse_ns is None and r.bookkeeping_ns > 0
    d = r.to_dict()
    assert d["hit_blocks"] == 6 and d["token_hit_ratio"] == pytest.approx(24 / 51)
    assert d["ns_per_block_ref"] == pytest.approx(r.bookkeeping_ns / 14)


# The same trace under "request" (LRU, capacity 4, block_tokens 4, W=0): no touch; each
# request's one use (its keys, head most recent) comes after its transfers complete:
#  R1 [1,2,3]  no hit; store 1,2,3; finish                     order 3 2 1
#  R2 [1,2,4]  hits 2; load 1,2; store 4; finish (4,2,1 moved)  order 3 4 2 1
#              ("prefix" had 3 2 1 4: its touch came before 4 was stored)
#  R3 [5,6]    no hit; store 5,6 evicts 3,4                    order 2 1 6 5
#  R4 [1,2,3]  hits 2 (8 tok); load 1,2; store 3 evicts 6      order 5 3 2 1
#  R5 [5,1,3]  hits 3 (12 tok)
def test_request_protocol_counts_by_hand():
    r = replay(TINY, "lru", 4, block_tokens=4, protocol="request")
    assert (r.requests, r.block_refs, r.hit_blocks) == (5, 14, 7)
    assert (r.input_tokens, r.hit_tokens) == (51, 28)
    assert (r.stored_blocks, r.evictions, r.store_failures) == (7, 3, 0)
    assert r.protocol == "request"


def test_request_protocol_window_finishes_after_transfers():
    # W=1, LRU capacity 3, INFLIGHT (below): as "prefix" with W=1 (R2 sees R1's blocks
    # pending, R4 cannot evict), every request finished by the final drain
    r = replay(INFLIGHT, "lru", 3, inflight=1, block_tokens=1, protocol="request")
    assert (r.hit_blocks, r.store_failures, r.store_failed_blocks, r.evictions) == (1, 1, 2, 0)
    r0 = replay(INFLIGHT, "lru", 3, inflight=0, block_tokens=1, protocol="request")
    assert (r0.hit_blocks, r0.store_failures, r0.evictions, r0.stored_blocks) == (3, 0, 2, 5)


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "prefix-arc", "belady"])
def test_request_protocol_streamed_matches_list_and_every_request_finishes(policy, monkeypatch):
    from kvtier import manager as manager_mod

    made = []
    real = manager_mod.OffloadingManager.__init__

    def spy(self, *args, **kwargs):
        made.append(self)
        real(self, *args, **kwargs)

    trace = list(read_trace(embedded_sample_path()))[:200]
    monkeypatch.setattr(manager_mod.OffloadingManager, "__init__", spy)
    r = replay(trace, policy, 600, protocol="request", inflight=4)
    s = made[-1].stats()
    assert (s.requests_finished, s.requests_open, s.requests_finished_early) == (200, 0, 0)
    if policy != "belady":
        rs = replay(iter(trace), policy, 600, protocol="request", inflight=4)
        assert (rs.hit_blocks, rs.evictions) == (r.hit_blocks, r.evictions)


def test_hit_tokens_capped_at_input_length():
    # 2 hit blocks of 512 tokens, but the prompt is only 700 tokens long
    trace = reqs(([7, 8], 700), ([7, 8], 700))
    r = replay(trace, "lru", 10)
    assert (r.hit_blocks, r.hit_tokens, r.input_tokens) == (2, 700, 1400)


def test_missing_input_length_counts_whole_blocks():
    trace = reqs(([1, 2], None), ([1, 3], None))
    r = replay(trace, "lru", 10, block_tokens=16)
    assert (r.input_tokens, r.hit_tokens) == (64, 16)


def test_store_failure_when_request_does_not_fit():
    trace = reqs(([1, 2, 3], 3), ([1], 1), ([1], 1))
    r = replay(trace, "lru", 2, block_tokens=1)
    # R1 needs 3 slots of 2: prepare_store returns None, nothing stored
    assert (r.store_failures, r.store_failed_blocks) == (1, 3)
    assert (r.hit_blocks, r.stored_blocks, r.evictions) == (1, 1, 0)


# In-flight window W=1, LRU capacity 3:
#  R1 [1,2]  store 1,2 (pending)
#  R2 [1,2]  1 is HIT_PENDING -> 0 hits; nothing new to store; R1 completes
#  R3 [1,3]  hits 1 (pinned); store 3 (pending); R2 completes (nothing)
#  R4 [4,5]  needs 2 slots: 0 free, evictable only {2} -> store failure; R3 completes
INFLIGHT = reqs(([1, 2], 2), ([1, 2], 2), ([1, 3], 2), ([4, 5], 2))


def test_inflight_window_keeps_blocks_pending_and_pinned():
    r = replay(INFLIGHT, "lru", 3, inflight=1, block_tokens=1)
    assert (r.hit_blocks, r.store_failures, r.store_failed_blocks, r.evictions) == (1, 1, 2, 0)
    assert r.stored_blocks == 3
    # W=0: R2 hits 2, R3 hits 1, R4 evicts 2 blocks
    r0 = replay(INFLIGHT, "lru", 3, inflight=0, block_tokens=1)
    assert (r0.hit_blocks, r0.store_failures, r0.evictions, r0.stored_blocks) == (3, 0, 2, 5)


def test_inflight_drains_at_end_of_trace():
    # a window larger than the trace: everything completes in the final drain, so a
    # second replay of the same trace through W=10 sees nothing readable until then
    r = replay(INFLIGHT, "lru", 8, inflight=10, block_tokens=1)
    assert (r.hit_blocks, r.store_failures, r.stored_blocks) == (0, 0, 5)


def test_get_protocol_is_plain_lru():
    # libCacheSim LRU(2) on 1 2 1 3 2 1 3 -> only the second access of 1 hits
    trace = reqs(([1, 2], None), ([1, 3], None), ([2, 1, 3], None))
    r = replay(trace, "lru", 2, protocol="get", block_tokens=1)
    assert (r.block_refs, r.hit_blocks, r.evictions, r.stored_blocks) == (7, 1, 4, 6)
    # under "prefix" the second request hits on block 1 only as a prefix, too
    rp = replay(trace, "lru", 2, protocol="prefix", block_tokens=1)
    assert rp.hit_blocks == 1


def test_get_protocol_counts_non_prefix_hits():
    trace = reqs(([1, 2, 3], None), ([9, 2, 3], None))
    assert replay(trace, "lru", 8, protocol="get").hit_blocks == 2
    assert replay(trace, "lru", 8, protocol="prefix").hit_blocks == 0


def test_streamed_input_matches_list_and_reports_parse_time():
    path = embedded_sample_path()
    as_list = replay(list(read_trace(path)), "arc", 1000, inflight=4)
    streamed = replay(read_trace(path), "arc", 1000, inflight=4)
    assert streamed.parse_ns is not None and streamed.parse_ns > 0
    for field in ("requests", "block_refs", "hit_blocks", "hit_tokens", "evictions",
                  "store_failures", "stored_blocks"):
        assert getattr(streamed, field) == getattr(as_list, field)
    assert (as_list.requests, as_list.block_refs) == (500, 14162)


@pytest.mark.parametrize("policy", available_policies())
def test_every_policy_replays_the_sample_consistently(policy):
    trace = list(read_trace(embedded_sample_path()))
    for inflight in (0, 8):
        r = replay(trace, policy, 1200, inflight=inflight)
        assert r.block_refs == 14162
        # compulsory misses: 11,879 distinct blocks can hit at most 14,162 - 11,879 times
        assert 0 < r.hit_blocks <= 14162 - 11879
        assert r.stored_blocks - r.evictions <= 1200
        assert r.hit_tokens <= r.input_tokens


def test_bigger_cache_never_hurts_lru():
    trace = list(read_trace(embedded_sample_path()))
    hits = [replay(trace, "lru", c).hit_blocks for c in (500, 2000, 8000, 20000)]
    assert hits == sorted(hits)
    # large enough: every re-reference of a block hits under "get"
    assert replay(trace, "lru", 20000, protocol="get").hit_blocks == 14162 - 11879


def test_progress_callback_counts_every_request():
    seen = []
    replay(list(read_trace(embedded_sample_path())), "lru", 100, progress=seen.append)
    assert sum(seen) == 500 and seen[0] == 500  # fewer than 1,024: one call at the end


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown protocol"):
        replay(TINY, "lru", 4, protocol="set")
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        replay(TINY, "nope", 4)
    with pytest.raises(ValueError, match="capacity must be an int from 1"):
        replay(TINY, "lru", 0)
    with pytest.raises(ValueError, match="inflight"):
        replay(TINY, "lru", 4, inflight=-1)
    with pytest.raises(ValueError, match="protocol 'prefix'"):
        replay(TINY, "lru", 4, inflight=2, protocol="get")


@pytest.mark.parametrize("spec", ["- 5", "-  5", "- 5%"])
def test_parse_capacity_of_a_sign_apart_from_its_digits_names_the_forms(spec):
    """Review of session 14: '- 5' was 'capacity must be >= 1 block' and '- 5%' 'must be
    > 0%', as if they were the numbers -5 and -5 %; a space after the sign makes them no
    number (int('- 5') raises): the forms of a capacity are named."""
    with pytest.raises(ValueError, match=r"is neither a block count nor a percentage"):
        parse_capacity(spec, 100)


def test_parse_capacity():
    assert parse_capacity("4000") == 4000
    assert parse_capacity("16_000") == 16000
    assert parse_capacity(12) == 12
    assert parse_capacity("10%", 182790) == 18279
    assert parse_capacity("2.5%", 1000) == 25
    assert parse_capacity("0.01%", 100) == 1  # at least one block
    assert parse_capacity("1e-9%", 100) == 1  # a percentage in exponent notation too
    assert parse_capacity("2.5E1%", 1000) == 250
    for bad in ("0", "-5", "abc", "10 %%", "0%", "1e3"):
        with pytest.raises(ValueError):
            parse_capacity(bad, 100)
    with pytest.raises(ValueError, match="distinct block count is unknown"):
        parse_capacity("10%")
    # a negative count or percentage is named by its rule (was "neither a block count ...")
    with pytest.raises(ValueError, match=r"capacity must be >= 1 block, got ' -5 '"):
        parse_capacity(" -5 ", 100)
    with pytest.raises(ValueError, match=r"capacity '-2.5%' must be > 0%"):
        parse_capacity("-2.5%", 100)


def test_parse_capacity_takes_ascii_counts_only_and_names_the_accepted_forms():
    """Found by a newcomer session: "1_000" and "\u0663" (Arabic-Indic 3) were block counts,
    "1__0" and "1_" too, while "+5" and "1e3" were refused. A count is ASCII digits,
    optionally grouped by single underscores between digits (as a Python literal); the error
    names the value and the accepted forms."""
    assert parse_capacity("1_000") == parse_capacity(" 1000 ") == 1000
    assert parse_capacity("1_000_000") == 1_000_000
    for bad in ("\u0663", "\u0661\u0662", "\uff15", "1__000", "1_", "_1", "+5", "1e3",
                "\u0663%", "1.5", "1,000"):
        with pytest.raises(ValueError, match=rf"capacity {re.escape(repr(bad))} is neither a "
                                             r"block count nor a percentage: a capacity is a "
                                             r"block count \(ASCII digits, optionally grouped "
                                             r"by _: 4000, 16_000\) or a percentage"):
            parse_capacity(bad, 100)
    with pytest.raises(ValueError, match=r"capacity must be a block count \(ASCII digits.* "
                                         r"got 2.5"):
        parse_capacity(2.5)


def test_parse_capacity_treats_an_underflowing_percentage_as_the_positive_number_it_is():
    """Found by an earlier session: "1e-400%" (a positive percentage whose float underflows
    to 0.0) was refused as "must be > 0%" while "1e-9%" ran at 1 block: both are positive
    percentages under half a block, so both give the smallest tier; 0 stays refused."""
    assert parse_capacity("1e-400%", 100) == parse_capacity("1e-9%", 100) == 1
    for zero in ("0%", "0.0%", "0e-400%", "0.000e5%"):
        with pytest.raises(ValueError, match=rf"capacity '{zero}' must be > 0%"):
            parse_capacity(zero, 100)


def test_parse_capacity_names_a_capacity_above_what_a_tier_can_hold():
    """Found by a newcomer session: ``kvtier replay -c 999...9%`` (400 digits) ended in a
    traceback (OverflowError: cannot convert float infinity to integer), and ``-c 10**20`` or
    ``--tiers host:10**20`` first warned that every block fits, then failed with
    'num_blocks must be at most 2147483647', naming the manager's argument, not the capacity
    (``kvtier sweep --max 10**20`` named a grid point the user never typed)."""
    from kvtier.manager import MAX_BLOCKS

    assert parse_capacity(str(MAX_BLOCKS), 100) == MAX_BLOCKS
    assert parse_capacity(MAX_BLOCKS) == MAX_BLOCKS
    for bad in (str(MAX_BLOCKS + 1), "100000000000000000000", MAX_BLOCKS + 1,
                "9" * 400 + "%", "100000000%", "3000000000.5%"):
        with pytest.raises(ValueError, match=r"capacity .* above .*2,147,483,647"):
            parse_capacity(bad, 11_879)


def test_parse_capacity_takes_numpy_ints_as_the_manager_does():
    np = pytest.importorskip("numpy")
    assert parse_capacity(np.int64(4000)) == 4000
    assert type(parse_capacity(np.int64(4000))) is int
    with pytest.raises(ValueError, match="capacity"):
        parse_capacity(np.bool_(True))


def test_log_grid():
    grid = log_grid(100, 100_000, 4)
    assert grid == [100, 1000, 10000, 100000]
    assert len(log_grid(10, 200_000, 12)) == 12
    assert log_grid(1, 3, 12) == [1, 2, 3]
    with pytest.raises(ValueError):
        log_grid(0, 10, 3)


def test_log_grid_with_more_points_than_sizes_answers_at_once():
    """Found by a newcomer session: kvtier sweep --points 100000000000000000000 computed one
    value per point (it never ended). Once consecutive points are less than a block apart
    every size of the range is hit: the answer is the range, found without the loop."""
    assert log_grid(1, 1156, 10**20) == list(range(1, 1157))

    def by_loop(lo, hi, points):
        ratio = math.log(hi / lo)
        return sorted({round(lo * math.exp(ratio * i / (points - 1))) for i in range(points)})

    for lo, hi, points in [(1, 100, 100), (1, 100, 461), (1, 100, 462), (1, 100, 5000),
                           (37, 50, 14), (37, 50, 40), (5, 6, 3), (900, 1000, 97)]:
        assert log_grid(lo, hi, points) == by_loop(lo, hi, points), (lo, hi, points)


def test_a_bare_key_list_is_named_as_analyze_names_it():
    # replay() and analyze() share kvtier.trace.not_a_request for this message
    with pytest.raises(TypeError, match=r"request 1 \(\[3, 4\]\) has no .keys: replay\(\) "
                                        "takes Request objects"):
        replay([Request([1, 2], 1024, None, None), [3, 4]], "lru", 8)


def test_belady_names_a_bare_key_list_and_an_unhashable_key_as_the_online_policies_do():
    """Found by a newcomer session (17): replay(..., "belady") builds its next-use oracle
    from every request's keys before the replay, and there a bare key list raised
    "AttributeError: 'list' object has no attribute 'keys'" (the docstring says TypeError,
    as lru gives) and an unhashable key a bare "unhashable type: 'list'"."""
    with pytest.raises(TypeError, match=r"request 1 \(\[3, 4\]\) has no .keys: replay\(\) "
                                        "takes Request objects"):
        replay([Request([1, 2], 1024, None, None), [3, 4]], "belady", 8)
    with pytest.raises(TypeError, match=r"replay: request 1: block key \[3\] is not hashable"):
        replay([Request([1, 2], 1024, None, None), Request([2, [3]], None, None, None)],
               "belady", 8)


def test_hits_out_without_append_is_named():
    """Found by a newcomer pass: hits_out={} raised a bare AttributeError mid-replay."""
    with pytest.raises(TypeError, match=r"hits_out must be a list or array .*got dict"):
        replay(TINY, "lru", 4, hits_out={})


def test_requests_that_are_not_iterable_are_named():
    """Found by a newcomer pass: replay(None, ...) said "'NoneType' object is not iterable"."""
    with pytest.raises(TypeError, match=r"requests must be an iterable of "
                                        r"kvtier.trace.Request.*got NoneType"):
        replay(None, "lru", 4)


def test_a_str_input_length_is_named_and_not_counted():
    """Found by a newcomer pass: a str input_length gave a bare TypeError from `+=`. The bad
    request is refused before it reaches the manager or hits_out."""
    hits: list = []
    bad = reqs(([1, 2], 8), ([1, 2], "8"))
    with pytest.raises(TypeError, match=r"request 1: input_length must be an int \(tokens\) "
                                        r"or None, got str '8'"):
        replay(bad, "lru", 4, block_tokens=4, hits_out=hits)
    assert hits == [0]
    with pytest.raises(TypeError, match=r"request 1: input_length must be an int"):
        replay(iter(bad), "lru", 4, block_tokens=4)


def test_a_negative_input_length_is_refused_before_the_manager_sees_it():
    """Found by newcomer12: Request([1, 2], -5, ...) built by hand was replayed, giving
    negative input_tokens / hit_tokens and a token hit ratio of a negative over a negative
    (0.5 for a request that hit nothing of its -5 tokens)."""
    hits: list = []
    bad = reqs(([1, 2], 8), ([1, 2], -5))
    with pytest.raises(ValueError, match=r"request 1: input_length must be >= 0 \(tokens\), "
                                         r"got -5"):
        replay(bad, "lru", 4, block_tokens=4, hits_out=hits)
    assert hits == [0]
    with pytest.raises(ValueError, match=r"request 1: input_length must be >= 0"):
        replay(iter(bad), "lru", 4, block_tokens=4, protocol="get")
    assert replay(reqs(([1, 2], 0), ([1, 2], 0)), "lru", 4).input_tokens == 0  # 0 is fine


def test_a_key_error_is_not_blamed_on_a_numpy_input_length():
    """A TypeError from the manager (an unhashable key) in a request whose input_length is
    a numpy integer (a number, added fine) is the manager's; it was reported as 'input_length
    must be an int (tokens) or None, got int64'."""
    np = pytest.importorskip("numpy")
    bad = [Request([1, 2], np.int64(8), None, None), Request([[1], 2], np.int64(8), None, None)]
    with pytest.raises(TypeError, match=r"block key \[1\] is not hashable"):
        replay(bad, "lru", 4, block_tokens=4)
