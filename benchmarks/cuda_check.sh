#!/usr/bin/env bash
# CUDA check of the kvtier data plane, for a machine with an NVIDIA GPU and a CUDA build of
# torch: runs the data-plane tests (they add a "cuda" parametrisation when
# torch.cuda.is_available()) and the device<->pinned-host bandwidth benchmark against a plain
# pinned-memory copy_. Results land in ${OUT:-benchmarks/out}/.
#   usage: bash benchmarks/cuda_check.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python}"
OUT_DIR="${OUT:-benchmarks/out}"
mkdir -p "$OUT_DIR"

"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
PYEOF

"$PY" -m pytest -q tests/dataplane 2>&1 | tee "$OUT_DIR/cuda_tests.txt"
"$PY" -m pytest -q tests/dataplane -k cuda --collect-only -q | tail -1 | tee -a "$OUT_DIR/cuda_tests.txt"

for layout in "" "--single"; do
  for slots in "" "--scatter"; do
    name="bench_cuda${layout//-/_}${slots//-/_}"
    "$PY" benchmarks/bench_transfer.py --device cuda --repeats 5 --staging-mib 256 \
      $layout $slots --json "$OUT_DIR/$name.json" | tee "$OUT_DIR/$name.txt"
  done
done
echo "cuda_check: done, results in $OUT_DIR"
