"""End to end with a real (small, random-weight) Llama: B's shared prefix is restored through
kvtier and only its suffix is computed; its next-token logits equal a full recompute.

Tolerance: float32, ``torch.allclose(reuse, full, rtol=1e-5, atol=1e-6)`` (the logits are
O(0.1-1); observed difference on CPU: 0.0). A negative control shows the check is sharp: one
restored key element off by 0.01 already breaks it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import prefix_reuse as pr  # noqa: E402

from kvtier.dataplane import KVOffloader  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
BT = 16


@pytest.fixture(scope="module")
def model():
    return pr.build_model(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                          vocab_size=1000, max_positions=1024, seed=0)


def test_model_is_deterministic_from_seed(model):
    other = pr.build_model(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                           vocab_size=1000, max_positions=1024, seed=0)
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), n


def test_restored_prefix_gives_full_recompute_logits(model):
    a, b = pr.make_requests(200, 24, model.config.vocab_size, seed=1)
    device_kv = pr.PagedKVCache(model, 40, BT, seed=1)
    off = KVOffloader.create(device_kv.tensors, 64)
    r = pr.run_prefix_reuse(model, a, b, BT, offloader=off, device_kv=device_kv)
    # A (224 tokens) offloads 14 full blocks; B shares 200 tokens = 12 full blocks + 8
    assert r.restored_blocks == 12 and r.restored_tokens == 192
    assert float(r.logits_full.abs().max()) > 0.05  # logits are not trivially zero
    assert torch.allclose(r.logits_reuse, r.logits_full, rtol=RTOL, atol=ATOL), r.max_abs_diff
    s = off.manager.stats()
    assert (s.used, s.pending, s.pinned, s.loads) == (14, 0, 0, 12)
    assert off.in_flight == 0
    off.close()


def test_restored_bytes_equal_the_model_cache(model):
    """The device blocks B gets back hold exactly A's K/V for the shared tokens."""
    a, _ = pr.make_requests(64, 0, model.config.vocab_size, seed=2)
    with torch.inference_mode():
        cache_a = pr._output_cache(model(input_ids=torch.tensor([a]), use_cache=True))
    device_kv = pr.PagedKVCache(model, 12, BT, seed=2)
    off = KVOffloader.create(device_kv.tensors, 8)
    ids_a = device_kv.allocate(4)
    device_kv.write(cache_a, ids_a)
    off.offload(pr.block_keys(a, BT), ids_a)
    assert [r.ok for r in off.wait(10)] == [True]
    device_kv.release(ids_a)  # NaN-poisoned
    ids_b = device_kv.allocate(4)
    n, _ = off.restore_prefix(pr.block_keys(a, BT), ids_b)
    assert n == 4 and [r.ok for r in off.wait(10)] == [True]
    rebuilt = device_kv.read(ids_b)
    for la, lb in zip(cache_a.layers, rebuilt.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
    off.close()


def test_negative_control_wrong_kv_is_caught(model, monkeypatch):
    a, b = pr.make_requests(96, 16, model.config.vocab_size, seed=3)
    real_read = pr.PagedKVCache.read

    def perturbed_read(self, block_ids):
        cache = real_read(self, block_ids)
        cache.layers[0].keys[0, 0, 5, 0] += 0.01
        return cache

    monkeypatch.setattr(pr.PagedKVCache, "read", perturbed_read)
    r = pr.run_prefix_reuse(model, a, b, BT, tier_blocks=16)
    assert r.restored_blocks == 6
    assert not torch.allclose(r.logits_reuse, r.logits_full, rtol=RTOL, atol=ATOL)


def test_divergence_inside_a_block_restores_only_whole_shared_blocks(model):
    a, _ = pr.make_requests(80, 0, model.config.vocab_size, seed=4)
    b = a[:40] + [(t + 1) % 1000 for t in a[40:60]]  # diverges in the middle of block 2
    r = pr.run_prefix_reuse(model, a, b, BT, tier_blocks=16)
    assert r.restored_blocks == 2 and r.restored_tokens == 32
    assert torch.allclose(r.logits_reuse, r.logits_full, rtol=RTOL, atol=ATOL), r.max_abs_diff


@pytest.mark.parametrize("argv, message", [
    (["--prefix-tokens", "-16"], "--prefix-tokens: must be an int >= 0, got '-16'"),
    (["--block-tokens", "0"], "--block-tokens: must be an int >= 1, got '0'"),
    (["--layers", "0"], "--layers: must be an int >= 1, got '0'"),
    (["--hidden", "100"], ("--hidden: must be a multiple of 8 (4 heads of an even size), "
                           "got 100")),
    (["--prefix-tokens", "0", "--suffix-tokens", "0"], "request B would have no token"),
])
def test_example_refuses_bad_sizes_by_name(argv, message, monkeypatch, capsys):
    """Found by a newcomer session running the example: --prefix-tokens -16 ran as 0,
    --block-tokens 0 died in a ZeroDivisionError, --layers 0 in KVOffloader's "kv_caches must
    be a tensor or a non-empty sequence", --hidden 100 in transformers' RoPE validator and an
    empty prompt in torch's embedding ('indices' of type Float)."""
    monkeypatch.setattr(sys, "argv", ["prefix_reuse.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        pr.main()
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
