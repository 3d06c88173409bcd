#!/usr/bin/env bash
# The GPU-only kernel tests (pytest -m gpu: gdn_verify, its checkpoint form, head_walk; bf16 at real shapes, multi-program walks)
# on the lent H200, in parallel (pytest-xdist from carried wheels: the device has no network).
# Here:    cp <wheels of pytest-xdist and execnet> .whl/      (carry .whl)
# Device:  TESTS_S=600 PART=gdn bash eval/run_gpu_tests.sh    (log in $OUT/gpu_tests/pytest.log)
#          PART=gdn: test_gdn_verify.py + test_gdn_checkpoint.py; PART=hw: test_head_walk.py; PART=topk:
#          test_head_walk_topk.py; unset: all four (118
#          tests did not finish in 545 s on 15 workers in session 6: one call per part); TEST_K: a pytest -k filter.
set +e
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
mkdir -p /tmp/pk "$OUT/gpu_tests" && ln -sfn "$PWD/triton_kernels" /tmp/pk/hybridspec_kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/execnet-*.whl .whl/pytest_xdist-*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/pk:/tmp/site
case "${PART:-all}" in
    gdn) FILES="tests/ops/test_gdn_verify.py tests/ops/test_gdn_checkpoint.py" ;;
    hw) FILES="tests/ops/test_head_walk.py" ;;
    topk) FILES="tests/ops/test_head_walk_topk.py" ;;
    all) FILES="tests/ops/test_gdn_verify.py tests/ops/test_gdn_checkpoint.py tests/ops/test_head_walk.py tests/ops/test_head_walk_topk.py" ;;
    *) echo "PART must be gdn, hw, topk or all, got $PART"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout "${TESTS_S:-150}" python3 -m pytest -v -W ignore -p no:cacheprovider --noconftest -m gpu -n "${WORKERS:-14}" \
    ${TEST_K:+-k "$TEST_K"} --durations=5 $FILES \
    > "$OUT/gpu_tests/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/gpu_tests/pytest.log"
# -v: a run cut by its timeout still names every test that finished
grep -c " PASSED " "$OUT/gpu_tests/pytest.log" | sed "s/^/passed so far: /"
grep -E " (FAILED|ERROR) " "$OUT/gpu_tests/pytest.log" | head -20
tail -5 "$OUT/gpu_tests/pytest.log"
