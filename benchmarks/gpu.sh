#!/usr/bin/env bash
# Every GPU check and figure of docs/gpu.md in one run: the cuda-marked tests, then the bf16
# benchmarks (graded attention against torch's module, the LM training step eager and compiled
# against Hugging Face's GPT-2, the long-sequence table against SDPA's fused kernel).
#
#     bash benchmarks/gpu.sh [OUT [DETAILS]]   # OUT defaults to runs/gpu, DETAILS to OUT
#
# OUT receives machine.txt and one log per step (each benchmark's tables are in its log);
# DETAILS the benchmarks' own folders (results.json, report.md, figures).
# Each step has its own time limit (seconds, overridable: T_TESTS, T_ATTN, T_LM, T_LM_COMPILED,
# T_LONG) so that one slow step cannot take the others with it; every log is written to OUT as it
# is produced. STEPS (default: all five) picks steps by name, e.g. STEPS="tests long_sequence".
# PYTHON (default python3) must have torch with CUDA and the package importable.
set -uo pipefail
OUT=${1:-runs/gpu}
DETAILS=${2:-$OUT}
PY=${PYTHON:-python3}
STEPS=${STEPS:-"tests attention lm_step lm_step_compiled long_sequence"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, report rc
    local name=$1 limit=$2
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - start)) s (limit $limit s)"
    tail -n 4 "$OUT/$name.log"
}

{
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
} | tee "$OUT/machine.txt"

step tests "${T_TESTS:-170}" "$PY" -m pytest -q -m cuda tests/cuda -p no:cacheprovider \
    -o addopts="--import-mode=importlib" -n 4
step attention "${T_ATTN:-60}" "$PY" benchmarks/graded_attention.py --device cuda \
    --dtype bfloat16 --rounds 15 --no-lm
step lm_step "${T_LM:-60}" "$PY" benchmarks/lm_training_step.py --device cuda --dtype bf16 \
    --rounds 15 --out "$DETAILS/lm_step"
step lm_step_compiled "${T_LM_COMPILED:-170}" "$PY" benchmarks/lm_training_step.py \
    --device cuda --dtype bf16 --compile --no-hf --rounds 15 --out "$DETAILS/lm_step_compiled"
step long_sequence "${T_LONG:-100}" "$PY" benchmarks/long_sequence.py --device cuda \
    --dtype bfloat16 --heads 8 --lengths 4096 8192 16384 32768 65536 --dense-max-len 65536 \
    --max-seconds 5 --error-seeds 1 --out "$DETAILS/long_sequence" \
    --backends full chunked sliding_window dilated block_sparse bigbird linear performer \
    linformer lsh
