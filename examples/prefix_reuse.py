"""Prefix reuse through kvtier with a real (small, randomly initialised) Llama model.

Request A computes a long prompt; its full KV blocks are written into a paged "device" KV cache
(one tensor per layer, ``[num_device_blocks, 2, block_tokens, num_kv_heads, head_dim]``),
offloaded through :class:`kvtier.dataplane.KVOffloader` into the host pool and dropped from the
device. Request B shares A's first ``N`` blocks: kvtier restores them into other device blocks,
B's cache is rebuilt from those blocks and only B's suffix is computed. B's next-token logits
are compared with a full recompute of B.

No download: the model is built from a ``LlamaConfig`` with a fixed seed. Needs ``torch`` and
``transformers`` (``pip install 'kvtier[torch,model]'``).

Run::

    python examples/prefix_reuse.py                      # 2,048-token shared prefix
    python examples/prefix_reuse.py --prefix-tokens 256 --suffix-tokens 32
"""

from __future__ import annotations

import argparse
import inspect
import random
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvtier.dataplane import KVOffloader

# transformers 5.x renamed the forward's ``past_key_values`` to ``cache``; accept both.
_CACHE_KW = (
    "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
    else "past_key_values"
)


def _output_cache(out) -> DynamicCache:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def build_model(
    *,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 1000,
    max_positions: int = 4096,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A small float32 Llama with random weights (``torch.manual_seed(seed)``), in eval mode."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model


def block_keys(tokens: list[int], block_tokens: int) -> list[int]:
    """Chained keys of the full blocks of ``tokens``: key i covers tokens[: (i+1)*block_tokens].

    Like an engine's block hashes, the key of a block depends on every token before it, so two
    requests share a key exactly when they share the whole prefix up to that block.
    """
    keys: list[int] = []
    prev = 0
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        prev = hash((prev, tuple(tokens[start : start + block_tokens])))
        keys.append(prev)
    return keys


class PagedKVCache:
    """The engine side: per-layer paged KV tensors and a free list of device blocks.

    ``tensors[l]`` is ``[num_blocks, 2, block_tokens, num_kv_heads, head_dim]`` (float32);
    index 0 of dim 1 holds keys, 1 values.
    """

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_tokens: int, seed: int = 0):
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.config = cfg
        self.block_tokens = block_tokens
        self.tensors = [
            torch.zeros(num_blocks, 2, block_tokens, cfg.num_key_value_heads, head_dim)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # device blocks are not handed out in order

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise MemoryError(f"need {n} device blocks, {len(self.free)} free")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, block_ids: list[int]) -> None:
        """Drop blocks: poison them with NaN (so stale reads would show) and free them."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        for t in self.tensors:
            t.index_fill_(0, idx, float("nan"))
        self.free.extend(block_ids)

    def write(self, cache: DynamicCache, block_ids: list[int]) -> None:
        """Copy the first ``len(block_ids)`` full blocks of a batch-1 ``cache`` into blocks."""
        n, bt = len(block_ids), self.block_tokens
        idx = torch.tensor(block_ids, dtype=torch.long)
        for layer, t in zip(cache.layers, self.tensors):
            k = layer.keys[0, :, : n * bt]  # [kv_heads, n*bt, head_dim]
            v = layer.values[0, :, : n * bt]
            kv = torch.stack([k, v])  # [2, kv_heads, n*bt, head_dim]
            kv = kv.unflatten(2, (n, bt)).permute(2, 0, 3, 1, 4)  # [n, 2, bt, kv_heads, hd]
            t.index_copy_(0, idx, kv)

    def read(self, block_ids: list[int]) -> DynamicCache:
        """A batch-1 ``DynamicCache`` holding the tokens of ``block_ids``, in order."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        data = []
        for t in self.tensors:
            kv = t.index_select(0, idx)  # [n, 2, bt, kv_heads, hd]
            kv = kv.permute(1, 3, 0, 2, 4).flatten(2, 3)  # [2, kv_heads, n*bt, hd]
            data.append((kv[0].unsqueeze(0).contiguous(), kv[1].unsqueeze(0).contiguous()))
        return DynamicCache(ddp_cache_data=data, config=self.config)


@dataclass
class ReuseResult:
    """Outcome of :func:`run_prefix_reuse` (times in seconds)."""

    restored_blocks: int
    restored_tokens: int
    logits_reuse: torch.Tensor  # [vocab] next-token logits of B computed on restored KV
    logits_full: torch.Tensor  # [vocab] next-token logits of B recomputed from scratch
    full_prefill_s: float  # B's prefill from scratch
    restore_s: float  # kvtier lookup + restore + cache rebuild
    suffix_prefill_s: float  # B's suffix prefill on the restored cache

    @property
    def max_abs_diff(self) -> float:
        return float((self.logits_reuse - self.logits_full).abs().max())

    @property
    def saved_s(self) -> float:
        return self.full_prefill_s - (self.restore_s + self.suffix_prefill_s)


@torch.inference_mode()
def run_prefix_reuse(
    model: LlamaForCausalLM,
    tokens_a: list[int],
    tokens_b: list[int],
    block_tokens: int = 16,
    *,
    offloader: KVOffloader | None = None,
    device_kv: PagedKVCache | None = None,
    tier_blocks: int = 512,
) -> ReuseResult:
    """Run A, offload its blocks, restore B's shared prefix through kvtier, compare logits."""
    if device_kv is None:
        nblocks = (len(tokens_a) + len(tokens_b)) // block_tokens + 2
        device_kv = PagedKVCache(model, nblocks, block_tokens)
    own = offloader is None
    if offloader is None:
        offloader = KVOffloader.create(device_kv.tensors, tier_blocks)

    # -- request A: full prefill, then offload its full blocks and drop them from the device
    out_a = model(input_ids=torch.tensor([tokens_a]), use_cache=True)
    keys_a = block_keys(tokens_a, block_tokens)
    ids_a = device_kv.allocate(len(keys_a))
    device_kv.write(_output_cache(out_a), ids_a)
    del out_a
    offloader.offload(keys_a, ids_a)
    results = offloader.wait()
    if not all(r.ok for r in results):
        raise RuntimeError(f"offload of A failed: {offloader.engine.take_errors()}")
    device_kv.release(ids_a)

    # -- request B, with kvtier: restore the shared prefix, compute only the suffix
    t0 = time.perf_counter()
    keys_b = block_keys(tokens_b, block_tokens)
    reusable = (len(tokens_b) - 1) // block_tokens  # always compute at least one token
    ids_b = device_kv.allocate(min(len(keys_b), reusable))
    n, job = offloader.restore_prefix(keys_b[:reusable], ids_b)
    results = offloader.wait()
    if not all(r.ok for r in results):
        raise RuntimeError(f"restore for B failed: {offloader.engine.take_errors()}")
    cache = device_kv.read(ids_b[:n])
    t1 = time.perf_counter()
    start = n * block_tokens
    out_b = model(
        input_ids=torch.tensor([tokens_b[start:]]),
        **{_CACHE_KW: cache},
        position_ids=torch.arange(start, len(tokens_b)).unsqueeze(0),
        use_cache=True,
    )
    logits_reuse = out_b.logits[0, -1].clone()
    t2 = time.perf_counter()
    device_kv.release(ids_b)

    # -- request B from scratch
    t3 = time.perf_counter()
    logits_full = model(input_ids=torch.tensor([tokens_b]), use_cache=True).logits[0, -1].clone()
    t4 = time.perf_counter()
    if own:
        offloader.close()
    return ReuseResult(n, start, logits_reuse, logits_full, t4 - t3, t1 - t0, t2 - t1)


def make_requests(
    prefix_tokens: int, suffix_tokens: int, vocab_size: int, seed: int = 0
) -> tuple[list[int], list[int]]:
    """A = shared prefix + A's own tail; B = the same prefix + a different suffix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab_size) for _ in range(prefix_tokens)]
    tail_a = [rng.randrange(vocab_size) for _ in range(suffix_tokens)]
    tail_b = [rng.randrange(vocab_size) for _ in range(suffix_tokens)]
    if tail_a and tail_b and tail_a[0] == tail_b[0]:
        tail_b[0] = (tail_b[0] + 1) % vocab_size
    return prefix + tail_a, prefix + tail_b


def _int_at_least(minimum: int):
    """An argparse type: an int >= ``minimum`` (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {text!r}")
        return value
    return parse


def _hidden_size(text: str) -> int:
    value = _int_at_least(8)(text)
    if value % 8:  # build_model's 4 attention heads, each of an even size (RoPE)
        raise argparse.ArgumentTypeError(
            f"must be a multiple of 8 (4 heads of an even size), got {value}")
    return value


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The prompt and model sizes, shared with benchmarks/bench_prefix_reuse.py."""
    ap.add_argument("--prefix-tokens", type=_int_at_least(0), default=2048,
                    help="tokens A and B share (default 2048)")
    ap.add_argument("--suffix-tokens", type=_int_at_least(0), default=64,
                    help="tokens of each request after the shared prefix (default 64)")
    ap.add_argument("--block-tokens", type=_int_at_least(1), default=16,
                    help="tokens per KV block (default 16)")
    ap.add_argument("--layers", type=_int_at_least(1), default=2, help="decoder layers")
    ap.add_argument("--hidden", type=_hidden_size, default=128,
                    help="hidden size, a multiple of 8 (default 128)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.prefix_tokens + args.suffix_tokens < 1:
        ap.error("--prefix-tokens 0 with --suffix-tokens 0: request B would have no token")

    model = build_model(num_layers=args.layers, hidden_size=args.hidden, seed=args.seed)
    a, b = make_requests(args.prefix_tokens, args.suffix_tokens, model.config.vocab_size, args.seed)
    r = run_prefix_reuse(model, a, b, args.block_tokens)
    print(f"request B: {len(b)} tokens, {r.restored_blocks} blocks ({r.restored_tokens} tokens) "
          "restored from the kvtier host pool")
    print(f"next-token logits max |diff| vs full recompute: {r.max_abs_diff:.3e}")
    print(f"full prefill {r.full_prefill_s * 1e3:.1f} ms; restore {r.restore_s * 1e3:.1f} ms + "
          f"suffix prefill {r.suffix_prefill_s * 1e3:.1f} ms; saved {r.saved_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
