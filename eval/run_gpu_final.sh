#!/usr/bin/env bash
# The gdn_verify engineer's last device call: (a) the GDN GPU tests, (b) bench_gdn_verify.py with the final sweep
# (v2 winners + v3 candidates; its fastest config per batch goes to tuned_verify_configs.json, which the profile's
# kernel snapshot then uses as its default), (c) bench_verify_profile.py on a reduced budget (rho = 0 given: the
# calibration was unreachable in the previous run). Every step is guarded; results land in $OUT/gdn, $OUT/profile.
#
# Here (CPU): python eval/_vllm_sources.py .vendor/extracted; python eval/bench_verify_profile.py --prepare;
#             rebuild .vendor/ours_snapshot/hybridspec_kernels from `git archive HEAD triton_kernels`
# Device:     HYBRIDSPEC_COMMIT=<sha> TOTAL_S=330 bash eval/run_gpu_final.sh
#             (carry .vendor/extracted .vendor/extracted_profile .vendor/oai_triton_kernels .vendor/ours_snapshot)
set +e
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
OUT=${OUT:-/tmp/hybridspec_out}
TOTAL_S=${TOTAL_S:-330}
COMMIT=${HYBRIDSPEC_COMMIT:-unknown}
mkdir -p "$OUT/gdn" "$OUT/profile" /tmp/pk
ln -sfn "$PWD/triton_kernels" /tmp/pk/hybridspec_kernels
T0=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }

echo "== (a) GDN GPU tests"
PYTHONPATH=/tmp/pk timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/ops/test_gdn_verify.py 2>&1 | tail -15
echo "== (a) rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"

echo "== (b) bench_gdn_verify final sweep"
PYTHONPATH=/tmp/pk timeout 130 python3 eval/bench_gdn_verify.py --out "$OUT/gdn" --sweep --sweep-set final \
    --lens 4,16 --batches 1,8,32 --no-plot --write-tuned "$OUT/gdn/tuned_verify_configs.json" \
    --command "python eval/bench_gdn_verify.py --sweep --sweep-set final --lens 4,16 --batches 1,8,32 (eval/run_gpu_final.sh, commit $COMMIT)" \
    2>&1 | grep -v "^sweep " | tail -40
echo "== (b) rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
if [ -f "$OUT/gdn/tuned_verify_configs.json" ]; then
    cp "$OUT/gdn/tuned_verify_configs.json" .vendor/ours_snapshot/hybridspec_kernels/gdn_verify/
    cat "$OUT/gdn/tuned_verify_configs.json"
fi

REM=$(left)
echo "== (c) bench_verify_profile, ${REM} s left"
if [ "$REM" -gt 60 ]; then
    PYTHONPATH="$PWD/.vendor/ours_snapshot" timeout $(( REM - 5 )) python3 eval/bench_verify_profile.py \
        --out "$OUT/profile" --budget-s $(( REM - 35 )) --rho 0 --batches 1,8,32 2>&1 | tail -60
    echo "== (c) rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
fi
ls -la "$OUT"/*
