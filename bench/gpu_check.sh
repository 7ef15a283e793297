#!/usr/bin/env bash
# The CUDA path, measured: gpu-marked tests, then the ~350M gpt in bf16 with and without
# torch.compile on one GPU, with tokens/s, MFU and peak memory beside the memory planner's
# prediction. Sized for one device call of under 8 minutes on an H100/H200:
#   bash bench/gpu_check.sh [OUT_DIR]        (python: $PYTHON, default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/gpu_check}
py=${PYTHON:-python3}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' | tee -a "$out/device.txt"

"$py" -m pytest -q -m gpu tests/train/test_gpu.py 2>&1 | tee "$out/pytest.txt"

steps=${STEPS:-200}
for mode in eager compile; do
    flags=()
    [ "$mode" = compile ] && flags+=(--compile)
    "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m ddpkit.train \
        --config configs/gpt_350m.toml --steps "$steps" --resume never \
        --run-dir "$out/$mode" --progress plain "${flags[@]}" 2>&1 | tee "$out/$mode.log"
done

"$py" -m ddpkit.tools.planner --config configs/gpt_350m.toml --gpus 1 --strategy FULL_SHARD --json \
    > "$out/planner.json"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
plan = json.loads((out / "planner.json").read_text())
print(f"{'mode':<8} {'tokens/s':>10} {'MFU':>6} {'max alloc GiB':>14} {'max reserved GiB':>17}")
for mode in ("eager", "compile"):
    s = json.loads((out / mode / "summary.json").read_text())
    print(f"{mode:<8} {s['tokens_per_s']:>10.0f} {s['mfu']:>6.1%} "
          f"{s['max_mem_allocated_bytes'] / 2**30:>14.2f} {s['max_mem_reserved_bytes'] / 2**30:>17.2f}")
print("planner (FULL_SHARD, 1 GPU):", json.dumps(plan)[:600])
PY
