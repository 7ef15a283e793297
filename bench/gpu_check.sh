#!/usr/bin/env bash
# The CUDA path, measured: gpu-marked tests, then the ~350M gpt in bf16 with and without
# torch.compile on one GPU, with tokens/s, MFU and peak memory beside the memory planner's
# prediction, then its checkpoint saves (~4.2 GB: fp32 parameters and AdamW's moments), sync
# against async: the seconds each save blocked the loop. Sized for one device call of under
# 8 minutes on an H100/H200:
#   bash bench/gpu_check.sh [OUT_DIR]        (python: $PYTHON, default python3)
#   TESTS=0 / THROUGHPUT=0 / SAVES=0: leave out the tests / the eager/compile runs / the saves
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/gpu_check}
py=${PYTHON:-python3}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' | tee -a "$out/device.txt"

if [ "${TESTS:-1}" != 0 ]; then
    "$py" -m pytest -q -m gpu tests/engines/gpu/test_gpu.py 2>&1 | tee "$out/pytest.txt" \
        || echo "gpu_check: test failures above; the measurements go on"
fi

steps=${STEPS:-200}
for mode in eager compile; do
    [ "${THROUGHPUT:-1}" = 0 ] && break
    flags=()
    [ "$mode" = compile ] && flags+=(--compile)
    "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m ddpkit.train \
        --config configs/gpt_350m.toml --steps "$steps" --resume never \
        --run-dir "$out/$mode" --progress plain "${flags[@]}" 2>&1 | tee "$out/$mode.log"
done

if [ "${THROUGHPUT:-1}" != 0 ]; then
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
fi

[ "${SAVES:-1}" = 0 ] && exit 0
# Saves at steps 20, 40, 60 and 80, each way; the checkpoints go to a scratch dir (GBs each).
scratch=$(mktemp -d)
for mode in sync async; do
    flags=(--no-ckpt-async)
    [ "$mode" = async ] && flags=(--ckpt-async)
    # the trainer notes each save's blocked seconds into the run's goodput records
    DDPKIT_RUN_DIR="$scratch/$mode" "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m ddpkit.train \
        --config "${SAVE_CONFIG:-configs/gpt_350m.toml}" --steps 80 --ckpt-interval 20 --ckpt-keep 1 \
        --resume never --run-dir "$scratch/$mode" --progress plain "${flags[@]}" 2>&1 \
        | tee "$out/save-$mode.log"
    mkdir -p "$out/save-$mode"
    cp -r "$scratch/$mode/summary.json" "$scratch/$mode/goodput" "$out/save-$mode/"
    rm -rf "$scratch/$mode"
done
rm -rf "$scratch"
"$py" - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
blocked = {}
for mode in ("sync", "async"):
    recs = [json.loads(p.read_text()) for p in sorted((out / f"save-{mode}" / "goodput").iterdir())]
    blocked[mode] = [r["blocking_s"] for r in recs if r["kind"] == "save"]
    s = json.loads((out / f"save-{mode}" / "summary.json").read_text())
    print(f"{mode:<6} saves blocked the loop (s): {blocked[mode]}  steps/s {s['steps'] / s['total_time_s']:.2f}")
# The first async save allocates (and pins) its host buffers; the last is the run's end,
# which waits for the write: the ones between are what a long run's saves cost.
mid = [a / s for a, s in zip(blocked["async"][1:-1], blocked["sync"][1:-1])]
if mid:
    print(f"async / sync blocked, saves between the first and the last: median {statistics.median(mid):.3f} (goal <= 0.05)")
PY
