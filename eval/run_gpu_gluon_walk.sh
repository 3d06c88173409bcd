#!/usr/bin/env bash
# The Gluon head walk on the lent H200 in one call: its GPU tests (pytest -m gpu -k "$TEST_K", xdist from the carried
# .whl), then bench_head_walk.py's ladder(s) in LADDER_SPECS, each beside the Triton walk and vLLM's graph loop in the
# same process; every sweep variant on --samples (3) fresh allocations, the median (HW11). v29 (HW11: rs_sf_lean
# beside the shipped rs_sf in pairs, LADDER_SPECS="v29 151936 1 150 60 60"; v30, "v30 151936 1 130 70 45": four
# ABBA pairs + the sweep with rs_sf_lean as auto beside rs_sf; rs_sf_lean is auto since then). v31 (HW12's call A: the 32k
# b1 resident walk's lean forms beside the Triton walk, LADDER_SPECS="v31 32000 1 230 90 150", code at ee2fd3a); v32
# (HW12's call B at 8a7cc6a: auto = ss_lean at 32k beside the Triton walk and ss_lean_pair, TEST_K="resident_lean or
# (multi_program_bf16 and 32000 and markov)", LADDER_SPECS="v32 32000 1 200 90 120"); v33 (ss_lean_pair's adoption
# call, run once at af63436 and adopted: the same TEST_K, LADDER_SPECS="v33 32000 1 200 90 120"); v34 (HW13:
# rs_sf_lean_pair beside auto = rs_sf_lean at 152k b1, TEST_K="gluon_b1_stream or gluon_auto",
# LADDER_SPECS="v34 151936 1 120 70 55", run once at f8823db: rejected, code there).
# Default (after session 8): ladder v26 (head_walk's default, the Gluon streamed walk at 152k b1 in form
# rs_sf, beside the Triton walk) + the 152k b1 block-15 sweep row (ours: the shipped default). Earlier calls: v27 / v28
# (HW10: persisting-L2 windows, LADDER_SPECS="v27 151936 1 150 40 100" / "v28 151936 1 110 0 80", code at 23bfae0),
# v25 (HW9's call B, LADDER_SPECS="v25 151936 1 100 30 60", code at b4da3f0), v24 (HW9's call A, LADDER_SPECS="v24
# 151936 1 120 30 75", code at bff8a73), v23 (session 8, LADDER_SPECS="v23 151936 1 80 30 45", code at 89ba734),
# v22 (HW7b), v21 (HW7, LADDER_SPECS="v21 151936 1 170 60 110"); session 7's first call v18 / v20 / v19 (code at
# eee43d2).
# Here:    python eval/bench_head_walk.py --prepare      (carry .whl and .vendor/extracted_head_walk)
# Device:  HYBRIDSPEC_COMMIT=<sha> bash eval/run_gpu_gluon_walk.sh     (logs under $OUT/gluon)
set +e
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
OUT=${OUT:-/tmp/hybridspec_out}
T0=$(date +%s)
mkdir -p /tmp/pk "$OUT/gluon" && ln -sfn "$PWD/triton_kernels" /tmp/pk/hybridspec_kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/execnet-*.whl .whl/pytest_xdist-*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/pk:/tmp/site timeout "${TEST_S:-150}" python3 -m pytest -v -W ignore -p no:cacheprovider --noconftest \
    -m gpu -n "${WORKERS:-8}" -k "${TEST_K:-gluon_b1_stream or one_row_streamed or gluon_auto or (stream_tma_agrees and greedy)}" tests/ops/test_head_walk.py > "$OUT/gluon/walk_tests.log" 2>&1
echo "== tests rc=$? at $(( $(date +%s) - T0 )) s; passed $(grep -c ' PASSED ' "$OUT/gluon/walk_tests.log")"
grep -E " (FAILED|ERROR) " "$OUT/gluon/walk_tests.log" | cut -c1-200 | head -20
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gluon/walk_tests.log" | cut -c1-300 | head -20
export PYTHONPATH=/tmp/pk
# ladder  vocab   batches  per-ladder timeout  sweep budget  ladder budget (LADDER_SPECS: ';'-separated specs)
IFS=';' read -ra SPECS <<< "${LADDER_SPECS:-v26 151936 1 ${V26_S:-100} 30 60}"
for SPEC in "${SPECS[@]}"; do
    set -- $SPEC
    timeout "$4" python3 eval/bench_head_walk.py --ladder "$1" --vocabs "$2" --batches ${3//,/ } --modes greedy \
        --steps 15 --budget-s "$5" --heads-budget-s 0 --compile-workers 0 --ladder-budget-s "$6" \
        --out "$OUT/gluon/$1" > "$OUT/gluon/bench_$1.log" 2>&1
    echo "== ladder $1 rc=$? at $(( $(date +%s) - T0 )) s"
    grep -iE "gluon.*(fall|fell)|fallback|Triton walk|Triton kernel" "$OUT/gluon/bench_$1.log" | sort | uniq -c | head -5
    grep -E "tune_|floor|graph_loop|speedup" "$OUT/gluon/bench_$1.log" | cut -c1-260 | head -40
done
