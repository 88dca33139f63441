# before (68a2250) / after (HEAD) on one machine: LM step ratios alternated, attention, cuda tests
set -u
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src
OLD=/tmp/site:$PWD/.before/src
{ date -u +"%Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee $OUT/machine.txt
lm() {
    local name=$1 pp=$2 s=$SECONDS
    PYTHONPATH=$pp timeout 80 python3 benchmarks/lm_training_step.py --device cuda --dtype bf16 \
        --rounds 15 --no-hf --out /tmp/gpu/$name >$OUT/$name.log 2>&1
    echo "== $name rc=$? $((SECONDS - s)) s"
    grep -E "^\| (ungraded|LGT|EGT)" $OUT/$name.log
}
lm lm_before_1 $OLD
lm lm_after_1 $NEW
lm lm_before_2 $OLD
lm lm_after_2 $NEW
for i in 1 2; do
    s=$SECONDS
    PYTHONPATH=$NEW timeout 60 python3 benchmarks/graded_attention.py --device cuda --dtype bfloat16 \
        --rounds 15 --no-lm >$OUT/attention_$i.log 2>&1
    echo "== attention_$i rc=$? $((SECONDS - s)) s"; grep -E "worst" $OUT/attention_$i.log
done
s=$SECONDS
PYTHONPATH=$NEW timeout 125 python3 -m pytest -q -m cuda tests/cuda -p no:cacheprovider \
    -o addopts="--import-mode=importlib" -n 6 >$OUT/tests.log 2>&1
echo "== tests rc=$? $((SECONDS - s)) s"; tail -n 3 $OUT/tests.log
