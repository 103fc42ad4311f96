#!/usr/bin/env bash
# Every GPU measurement of issue 20 in one go, on one GPU machine; each table goes to
# $OUT/<name>.txt (stdout and stderr), and $OUT/summary.txt lists what ran and its status.
#   OUT=runs/gpu_out bash tools/bench/gpu_all.sh          # from the repo root
#   SMOKE=1 OUT=runs/gpu_smoke bash tools/bench/gpu_all.sh    # every script's --smoke (CPU)
# A failing benchmark is recorded and the rest still run. The MTP row trains a tiny
# drafter first (configs/pretrain.py:tiny then configs/mtp.py:tiny, into $OUT/runs).
set -uo pipefail
OUT="${OUT:?set OUT to the folder the tables go to}"
PY="${PYTHON:-python}"
SMOKE="${SMOKE:-0}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BENCH=tools/bench
summary="$OUT/summary.txt"
{ date -u; "$PY" -c 'import jax; d = jax.devices()[0]; print(jax.__version__, d.platform, d.device_kind, jax.device_count())'; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; } > "$summary"

run() {  # run NAME ARGS... : one benchmark, its table to $OUT/NAME.txt
  local name=$1; shift
  local start=$SECONDS
  "$PY" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s: $*" >> "$summary"
}

if [ "$SMOKE" = 1 ]; then
  run attention $BENCH/bench_attention.py --smoke
  run grouped_matmul $BENCH/bench_grouped_matmul.py --smoke
  run block_scaled $BENCH/bench_block_scaled.py --smoke
  run train $BENCH/bench_train.py --smoke
  run decode $BENCH/bench_decode.py --smoke
  cat "$summary"
  exit 0
fi

# Item 4: fused (cuDNN) vs blockwise vs dense attention, MLA and GQA heads, 4k and 8k.
run attention_4k $BENCH/bench_attention.py --length 4096
run attention_8k $BENCH/bench_attention.py --length 8192 --heads mla
# Item 3/6: grouped GEMM vs dense vs lax.ragged_dot at Kimi-K2.5 expert shapes.
run grouped_matmul $BENCH/bench_grouped_matmul.py
# FP8/FP4 vs bf16, flat and grouped (skewed, empty experts).
run block_scaled $BENCH/bench_block_scaled.py
# Train-step MFU of the ~1B-active config against the roofline (fits one 80 GB GPU:
# bf16 parameters, gradients and Adam moments of 8B parameters are ~64 GB).
run train_moe_8b_a1b $BENCH/bench_train.py --variants moe_8b_a1b --batch 4 --seq_len 2048 \
    --moe_impls ragged,pallas --attention_impl auto --steps 10
run train_small $BENCH/bench_train.py --variants small --batch 16 --seq_len 2048 \
    --moe_impls dense,ragged,pallas --attention_impl auto --steps 20
# Decode tokens/s against the HBM bound.
run decode $BENCH/bench_decode.py --variants small,moe_8b_a1b --batches 1,8,64 \
    --prompt_len 512 --new_tokens 128 --drafts 0
# MTP speculation with a trained head: train a tiny drafter, then decode with it.
run mtp_train_trunk -m c2jax.cli pretrain --config=configs/pretrain.py:tiny \
    --workdir="$OUT/runs/tiny/pretrain"
run mtp_train_head -m c2jax.cli pretrain --config=configs/mtp.py:tiny \
    --workdir="$OUT/runs/tiny/mtp" --config.init_from="$OUT/runs/tiny/pretrain"
run decode_mtp $BENCH/bench_decode.py --checkpoint "$OUT/runs/tiny/mtp" --batches 1,8,32 \
    --drafts 1 --temperature 0.7 --new_tokens 128
cat "$summary"
