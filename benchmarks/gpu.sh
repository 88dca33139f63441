#!/usr/bin/env bash
# Every GPU check and figure of docs/gpu.md in one run: the cuda-marked tests, then the bf16
# benchmarks (graded attention against torch's module with learnable and with fixed grades, and
# learnable grades folded beside the same not folded; the LM training step eager and compiled
# against Hugging Face's GPT-2, eager with steps back to back; where the eager step's time goes
# and where its GPU waits; the long-sequence table against SDPA's fused kernel).
#
#     bash benchmarks/gpu.sh [OUT [DETAILS]]   # OUT defaults to runs/gpu, DETAILS to OUT
#
# OUT receives machine.txt and one log per step (each benchmark's tables are in its log);
# DETAILS the benchmarks' own folders (results.json, report.md, figures).
# Each step has its own time limit (seconds, overridable: T_TESTS, T_ATTN, T_ATTN_UNFOLDED,
# T_LM, T_LM_B2B, T_LM_COMPILED, T_DIAG, T_IDLE, T_LONG) so that one slow step cannot take the
# others with it; TEST_WORKERS (default 4) sets the tests' pytest-xdist workers; every log is
# written to OUT as it is produced. STEPS (default: all but lm_step_folds, the LM step of LGT
# beside the same with the folds of the code before 28a0b8f, and lm_step_layers, the graded
# LM steps beside the same folding layer by layer) picks steps by name
# and runs them in the order given, e.g. STEPS="long_sequence tests"; a step named again runs
# again, its log and details suffixed _2, _3, ... (STEPS="lm_step lm_step lm_step": three runs
# on one machine).
# PYTHON (default python3) must have torch with CUDA and the package importable.
set -uo pipefail
OUT=${1:-runs/gpu}
DETAILS=${2:-$OUT}
PY=${PYTHON:-python3}
STEPS=${STEPS:-"tests attention attention_unfolded attention_fixed lm_step lm_step_back_to_back
lm_step_compiled diag idle long_sequence"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, report rc
    local name=$1 limit=$2
    shift 2
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

declare -A RUNS=()
for base in $STEPS; do
    RUNS[$base]=$(( ${RUNS[$base]:-0} + 1 ))
    name=$base
    (( RUNS[$base] > 1 )) && name="${base}_${RUNS[$base]}"
    case $base in
    tests) step "$name" "${T_TESTS:-170}" "$PY" -m pytest -q -m cuda tests/cuda \
        -p no:cacheprovider -o addopts="--import-mode=importlib" -n "${TEST_WORKERS:-4}" ;;
    attention) step "$name" "${T_ATTN:-60}" "$PY" benchmarks/graded_attention.py \
        --device cuda --dtype bfloat16 --rounds 15 --no-lm ;;
    attention_fixed) step "$name" "${T_ATTN:-60}" "$PY" benchmarks/graded_attention.py \
        --device cuda --dtype bfloat16 --rounds 15 --no-lm --fixed-grades ;;
    attention_unfolded) step "$name" "${T_ATTN_UNFOLDED:-90}" "$PY" \
        benchmarks/graded_attention.py --device cuda --dtype bfloat16 --rounds 15 --no-lm \
        --compare-unfolded ;;
    lm_step) step "$name" "${T_LM:-90}" "$PY" benchmarks/lm_training_step.py --device cuda \
        --dtype bf16 --rounds 15 --out "$DETAILS/$name" ;;
    lm_step_folds) step "$name" "${T_LM:-90}" "$PY" benchmarks/lm_training_step.py \
        --device cuda --dtype bf16 --rounds 15 --no-hf --models LGT "LGT fixed" \
        --compare-folds --out "$DETAILS/$name" ;;
    lm_step_layers) step "$name" "${T_LM:-90}" "$PY" benchmarks/lm_training_step.py \
        --device cuda --dtype bf16 --rounds 15 --no-hf --models LGT EGT "LGT fixed" \
        --compare-layers --out "$DETAILS/$name" ;;
    lm_step_back_to_back) step "$name" "${T_LM_B2B:-120}" "$PY" \
        benchmarks/lm_training_step.py --device cuda --dtype bf16 --back-to-back 5 \
        --rounds 8 --out "$DETAILS/$name" ;;
    lm_step_compiled) step "$name" "${T_LM_COMPILED:-170}" "$PY" \
        benchmarks/lm_training_step.py --device cuda --dtype bf16 --compile --no-hf \
        --models ungraded LGT EGT --rounds 15 --out "$DETAILS/$name" ;;
    diag) step "$name" "${T_DIAG:-120}" "$PY" benchmarks/gpu_diagnostics.py ;;
    idle) step "$name" "${T_IDLE:-150}" "$PY" benchmarks/gpu_idle.py ;;
    long_sequence) step "$name" "${T_LONG:-100}" "$PY" benchmarks/long_sequence.py \
        --device cuda --dtype bfloat16 --heads 8 --lengths 4096 8192 16384 32768 65536 \
        --dense-max-len 65536 --max-seconds 5 --error-seeds 1 --out "$DETAILS/$name" \
        --backends full chunked sliding_window dilated block_sparse bigbird linear performer \
        linformer lsh ;;
    *) echo "unknown step $base (expected: tests attention attention_unfolded attention_fixed" \
        "lm_step lm_step_folds lm_step_layers lm_step_back_to_back lm_step_compiled diag idle long_sequence)"; exit 2 ;;
    esac
done
