"""Prefill time saved by restoring a shared prefix through kvtier (real random-weight Llama).

Request A (prefix + its own tail) is computed and offloaded; request B (same prefix + another
suffix) is served twice: full prefill from scratch, and kvtier restore of the shared blocks +
suffix-only prefill. Medians over ``--repeats`` fresh runs (after one warm-up), in ms.

    python benchmarks/bench_prefix_reuse.py                   # 2,048-token shared prefix
    python benchmarks/bench_prefix_reuse.py --layers 4 --hidden 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import prefix_reuse as pr  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pr.add_model_args(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    model = pr.build_model(num_layers=args.layers, hidden_size=args.hidden,
                           max_positions=args.prefix_tokens + 2 * args.suffix_tokens + 16)
    a, b = pr.make_requests(args.prefix_tokens, args.suffix_tokens, model.config.vocab_size)
    pr.run_prefix_reuse(model, a, b, args.block_tokens)  # warm-up
    runs = [pr.run_prefix_reuse(model, a, b, args.block_tokens) for _ in range(args.repeats)]
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    res = {
        "prefix_tokens": args.prefix_tokens,
        "suffix_tokens": args.suffix_tokens,
        "restored_tokens": runs[0].restored_tokens,
        "model": f"Llama {args.layers} layers, hidden {args.hidden}, float32, random weights",
        "threads": torch.get_num_threads(),
        "full_prefill_ms": med([r.full_prefill_s for r in runs]),
        "restore_ms": med([r.restore_s for r in runs]),
        "suffix_prefill_ms": med([r.suffix_prefill_s for r in runs]),
        "saved_ms": med([r.saved_s for r in runs]),
        "max_abs_logit_diff": max(r.max_abs_diff for r in runs),
    }
    print(f"{res['model']}; B = {args.prefix_tokens} shared + {args.suffix_tokens} new tokens, "
          f"{res['restored_tokens']} restored; medians of {args.repeats}")
    print(f"  full prefill {res['full_prefill_ms']:.1f} ms | restore {res['restore_ms']:.1f} ms"
          f" + suffix prefill {res['suffix_prefill_ms']:.1f} ms | saved {res['saved_ms']:.1f} ms"
          f" ({res['saved_ms'] / res['full_prefill_ms']:.0%})")
    print(f"  max |logit diff| vs full recompute: {res['max_abs_logit_diff']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
