#!/usr/bin/env bash
# Every GPU check and measurement in one go, on one GPU machine, most important first:
# the kernel numerics (gpu_check_kernels.py), then the kernel, LM-head loss, attention,
# train and decode benchmarks, c2jax's kernels beside tokamax's (the OpenXLA library).
# Packages the machine's image lacks travel as wheels in .whl/ (tools/device/wheels.sh;
# the device tool's carry: [".whl"]) and are installed from there first. Everything goes to one log, $OUT/all.txt (a header per step), and
# $OUT/summary.txt lists each step's exit status and seconds.
#   OUT=runs/gpu_out bash tools/device/gpu_all.sh                  # from the repo root
#   STEPS=check,grouped BUDGET=300 OUT=runs/gpu_out bash tools/device/gpu_all.sh
#   SMOKE=1 OUT=runs/gpu_smoke bash tools/device/gpu_all.sh         # every --smoke (CPU)
# STEPS picks steps by name (default: all, in the order below). BUDGET (seconds, default
# none) is the time for the whole run: each step is stopped at its own limit or at what
# is left of the budget, and a step that would start with under 30 s left is skipped, so
# the summary is always written. A failing step is recorded and the rest still run. The
# MTP steps train a tiny drafter first (configs/pretrain.py:tiny then configs/mtp.py:tiny,
# into $OUT/runs). Every step is `$PYTHON -m <module>` run from the repo root, which puts
# the checkout on the module path (no PYTHONPATH).
set -uo pipefail
OUT="${OUT:?set OUT to the folder the tables go to}"
PY="${PYTHON:-$(command -v python || command -v python3)}"
SMOKE="${SMOKE:-0}"
STEPS="${STEPS:-all}"
BUDGET="${BUDGET:-0}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The packages the GPU image lacks (tools/device/wheels.sh fills .whl/ here; carry it).
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
  site="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl > "$OUT/wheels.txt" 2>&1 || cat "$OUT/wheels.txt"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
RUNS="${RUNS:-$OUT/runs}"  # the MTP steps' checkpoints
summary="$OUT/summary.txt"
log="$OUT/all.txt"
: > "$log"
{ date -u; "$PY" -c 'import jax; d = jax.devices()[0]; print("jax", jax.__version__, d.platform, d.device_kind, jax.device_count())'; "$PY" -c 'import tokamax; print("tokamax", tokamax.__version__)' 2>&1 | tail -1; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null; } > "$summary" 2>&1

wanted() { [ "$STEPS" = all ] || [[ ",$STEPS," == *",$1,"* ]]; }

run() {  # run NAME LIMIT_S ARGS... : one step, appended to $log under a header
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 30 ]; then
      echo "$name skipped: ${left}s of the budget left" >> "$summary"
      return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local start=$SECONDS
  echo "===== $name: $* (limit ${limit}s, $(date -u +%H:%M:%S))" >> "$log"
  timeout -k 10 "$limit" "$PY" "$@" >> "$log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s: $*" >> "$summary"
}

if [ "$SMOKE" = 1 ]; then
  run check 300 -m tools.device.gpu_check_kernels --smoke
  run attention 300 -m tools.bench.attention --smoke
  run grouped 300 -m tools.bench.grouped_matmul --smoke
  run lm_head 300 -m tools.bench.lm_head --smoke
  run block_scaled 300 -m tools.bench.block_scaled --smoke
  run train 300 -m tools.bench.train --smoke
  run decode 300 -m tools.bench.decode --smoke
  cat "$summary"
  exit 0
fi

# Numerics first: every GPU kernel path, compiled, forward and gradients vs float64.
run check 240 -m tools.device.gpu_check_kernels
# Grouped GEMM vs dense vs lax.ragged_dot at Kimi-K2.5 expert shapes: c2jax's and
# tokamax's kernels side by side.
run grouped 180 -m tools.bench.grouped_matmul
# The LM-head loss, unfused vs c2jax's and tokamax's chunked ones: Kimi-K2.5's vocabulary,
# then DeepSeek-V3's (129,280: no multiple of tokamax's 2,048-column block).
run lm_head 150 -m tools.bench.lm_head
run lm_head_dsv3 120 -m tools.bench.lm_head --vocab 129280 --tokens 4096
# FP8/FP4 vs bf16, flat and grouped (skewed, empty experts).
run block_scaled 180 -m tools.bench.block_scaled --recipes mxfp8
# Fused (cuDNN) vs blockwise vs dense attention, MLA and GQA heads, 4k and 8k.
run attention_4k 180 -m tools.bench.attention --length 4096
run attention_8k 180 -m tools.bench.attention --length 8192 --heads mla
# Train-step MFU against the roofline: `small`, then the ~1B-active config (bf16
# parameters, gradients and Adam moments of 8B parameters are ~64 GB). Its 'ragged' row
# ran out of memory on a 141 GB H200 (XLA's GPU compiler expands lax.ragged_dot into a
# dense product per expert: 132 GiB after rematerialisation), so only 'pallas' runs.
run train_small 240 -m tools.bench.train --variants small --batch 16 --seq_len 2048 \
    --moe_impls dense,ragged,pallas --attention_impl auto --steps 20
run decode 240 -m tools.bench.decode --variants small,moe_8b_a1b --batches 1,8,64 \
    --prompt_len 512 --new_tokens 128 --drafts 0
run train_moe_8b_a1b 420 -m tools.bench.train --variants moe_8b_a1b --batch 4 --seq_len 2048 \
    --moe_impls pallas --attention_impl auto --steps 10
# MTP speculation with a trained head: train a tiny drafter, then decode with it.
run mtp_train_trunk 300 -m c2jax.cli pretrain --config=configs/pretrain.py:tiny \
    --workdir="$RUNS/tiny/pretrain"
run mtp_train_head 300 -m c2jax.cli pretrain --config=configs/mtp.py:tiny \
    --workdir="$RUNS/tiny/mtp" --config.init_from="$RUNS/tiny/pretrain"
run decode_mtp 240 -m tools.bench.decode --checkpoint "$RUNS/tiny/mtp" --batches 1,8,32 \
    --drafts 1 --temperature 0.7 --new_tokens 128
cat "$summary"
