#!/usr/bin/env bash
# The gdn_verify engineer's device calls. Every step is guarded (set +e, timeout); results land under $OUT.
#   MODE=diag   (call 1) bench_gdn_verify.py --diagnose: parallel precompile, bf16 error of every candidate, the
#               leave-one-stage-out ladder and the launch candidates -> $OUT/diag/gdn_verify_diag.json; then ncu
#               (--clock-control none) on the per-head (b1) and whole-V (b32) kernels if the runtime allows it.
#   MODE=final2 (v5 call) as final with --sweep-set v5 and only the weight_tiles GPU tests.
#   MODE=final3 (session 3, the fold) as final with --sweep-set fold (each config timed without and with a fold,
#               tuned file gets "verify" and "verify_fold") and only the fold + reconstruction GPU tests.
#   MODE=final4 (session 3, G4) as final with --sweep-set short timed at L = 4 and 16 (verify configs and the
#               reconstruction's block_v x num_warps at every batch; tuned file keyed by (L, batch)), the grid
#               without the fold (--no-fold), one GPU test; the grid starts no cell after STOP_AT_S seconds
#   MODE=final5 (session 4, G: the L4 b1 goal) as final4 with --sweep-set short4 (+ the short reconstruction's
#               launches at L = 4, reconstruct_short_by_len in the tuned file; the 4-row FMA verify form it timed
#               then is removed) and the L4 b1 stage ladder of the b1 winner (--ladder); GPU tests: short forms +
#               hoisted weight tiles
#   MODE=final6 (session 4, G's second call) as final5 with --sweep-set short5 (early workspace stores of the b1
#               winner (flat_small, timed then, is removed); short reconstruction with and without early workspace
#               reads), no ladder
#   MODE=final7 (session 4, G2) as final6 with --sweep-set split6 (split Gram products; the general reconstruction's
#               launches again, now with 16-byte state access); GPU tests: split Gram, unaligned tables, short forms,
#               hoisted weight tiles, and the checkpoint reconstruction (tests/ops/test_gdn_checkpoint.py)
#   MODE=final8 (session 5, GB) as final7 with --sweep-set stacked7 (the stacked two-pass forms, PDL, the prep's
#               register cap; reconstruction: final7's picks only); GPU tests: stacked, prep cap, two-pass forms
#   MODE=bf16state (session 5, GB2) vLLM's default state dtype: the bf16-state GPU tests (every form the tuned file
#               picks, in parallel through pytest-xdist from .whl) beside a parallel precompile, then
#               bench_gdn_verify.py --ssm-dtype bfloat16 --sweep-set bf16state at L 4 / 16 and the full grid with vLLM
#               and FLA -> $OUT/gdn/gdn_verify_bf16_state.{json,md,png}; the sweep's picks go to
#               $OUT/gdn/tuned_bf16_state.json (never the shipped tuned file, which holds the fp32-state picks)
#   MODE=long24 (session 24) pdl_first for the b1 picks at L 17 / 32 (--sweep-set long24 at fp32, then long24bf16 at bf16
#               states from the first run's tuned file): eval/results/gdn_verify_long*.*, tuned_bfloat16.json (both).
#   MODE=lean25 (session 25) the conv's leaner instruction stream against the previous commit's kernels (carry
#               .vendor/base25: `git archive <base> triton_kernels | tar -x -C .vendor/base25`): GPU tests, grids at L 4 / 16
#               alternating new / base (2 each; AB_SSM=bfloat16: with bf16 states), then (HEADLINE=0: not) the fp32
#               and bf16-state headline grids on the new code
#   MODE=lean25var (session 25, call 3) lean25's conv changes one at a time at bf16 states (AB_SSM), L 4 / 8 / 16 b1
#               (AB_LENS, AB_BATCHES): new, base, new without the fp32 weight copy, with tl.sigmoid, with pair sums; twice
#   MODE=long25 (session 25) eval/results/gdn_verify_long*.* re-made on the shipped picks (grids only, L 17 / 32)
#   MODE=chunk26 (session 26) verify lengths 17..32 as two 16-token chunks (`chunked`): the chunked GPU tests, then
#               --sweep-set chunk26 at fp32 and chunk26bf16 at bf16 states (the second from the first's tuned file) at
#               L 17 / 32 with their grids -> $OUT: gdn_verify_long*.{json,md,png}, tuned_bfloat16.json (both tables);
#               logs stay on the device (8 files a call), their tables go to stdout
#   MODE=chunk26c (session 26, call 3) the second chunk without a carried state block (v2) against the first build
#               (carry .vendor/base26): chunked GPU tests, grids at L 17 new / base twice, then MODE=chunk26's sweeps
#   MODE=chunk26b (session 26, call 2) the chunked GPU tests and every shipped pick's (the tuned file now picks chunked
#               forms at L 17 / 32), then one grid at L 16 / 17 / 32 on the shipped picks, fp32 states
#               -> $OUT/gdn_verify_long_vs_16.{json,md,png}: a 17..32-token verify against a 16-token one, same run;
#               then --state-diag chunk26 (the chunked picks' prep and state pass apart at L 17, b1 / b32; stdout)
#   MODE=bf16s24 (session 24) bf16 states at L 4 / 16: the bf16 picks (session 5) against the fp32 picks' later forms
#               (--sweep-set bf16s24: PDL, L2 prefetch, 8-warp prep, pdl_first), their bf16 GPU tests (-k s24); the grid
#               on the sweep's picks writes eval/results/gdn_verify_bf16_state.*, the tuned file tuned_bf16_state.json.
#   MODE=bf16recon (session 5, GB3) as bf16state, about the reconstruction at bf16 states: the GPU tests of the
#               general reconstruction's swept launches and the short forms at bf16 states beside the precompile, then
#               --sweep-set bf16recon (the bf16 verify picks only; general block_v x num_warps at L 4 / 16 and the short
#               form's at L 4, since GB3's call also its rank-1 loop at L 16 (sweep rows only); incumbents first,
#               --recon-margin 0.02) and the full grid with vLLM and FLA
#               -> $OUT/gdn/gdn_verify_bf16_state.{json,md,png} + tuned_bf16_state.json
#   MODE=sdiag  (session 5, GB call 1) the stacked GPU tests beside bench_gdn_verify.py --state-diag: at L16 b32 / b64
#               the two-pass prep and state pass timed apart and together, the stacked candidates, a 64 MiB copy and
#               the cuBLAS batched state product as floors -> $OUT/diag/gdn_verify_state_diag.json
#   MODE=pdiag  (session 6, GB6 call 1, at fc316c5) the GPU tests of the forms under test beside bench_gdn_verify.py
#               --state-diag gb6 (L16 b32 / b64: final8's picks and the candidates, prep / state pass alone and both,
#               the floors, the reconstruction with its conv barrier at all / random accept), then ncu (stall reasons,
#               occupancy) on the --ncu-target gb6 launches -> $OUT/diag/ (call 1 timed persistent state passes,
#               since removed; the set now holds the TMA-load forms)
#   MODE=final9 (session 6, GB6) as final8 with --sweep-set tma9 (final8's picks as incumbents; the stacked picks with
#               TMA loads, picked only when 2 % faster: --verify-margin 0.02; the run at 901b3f2 also timed the tf32x3
#               prep products, since removed) and the GPU tests of those forms through pytest-xdist
#   MODE=final10 (session 8, GD9) as final9 with --sweep-set l2pf10 (final9's picks as incumbents; the stacked picks
#               with the L2 bulk prefetch of the states, picked only when faster by 3 % of the step's total:
#               --total-margin 0.03; reconstruction incumbents kept unless 2 % faster) and the l2_prefetch tests
#               (GPU real shape + the CPU ones) through pytest-xdist
#   MODE=long11 (session 8, GD10) verify lengths 17..32 (BT 32): --sweep-set long11 at --sweep-lens 17,32 (the L = 16
#               picks as incumbents, --total-margin 0.02), the grid at --lens 17,32 with vLLM and FLA ->
#               $OUT/gdn/gdn_verify_long.{json,md,png} + tuned_verify_configs.json (L 17 / 32 added, L 4 / 16 kept
#               from the shipped file); GPU tests: the long11 forms at real shape (lens incl. 17) through xdist
#   MODE=b1diag (session 9, GD11 call A) bench_gdn_verify.py --b1-diag (the 30-layer graph: empty kernels per layer,
#               the b1 picks' launch floor and whole time at L 16 / 4, their reconstructions, the L16 b1 stage ladder)
#               -> $OUT/diag/; then Nsight Compute --set full with SASS source counters on the b1 picks and their
#               reconstructions (--ncu-target gd11) -> $OUT/diag/ncu_details.txt, ncu_source.csv.gz
#   MODE=long12bf16 (session 9, GD12) bf16 states at verify lengths 17..32: --sweep-set long12bf16 at L 17 / 32 (the
#               L 16 bf16 picks as incumbents, --total-margin 0.02) and the grid at L 17 / 32 x b 1 / 8 / 32 with vLLM
#               and FLA -> $OUT/gdn/gdn_verify_long_bf16_state.{json,md} + tuned_verify_configs.json (the bf16 tables
#               gain L 17 / 32). GD12's call ran it at af63436 as the second half of MODE=gd12, whose first half
#               (--sweep-set occ12: register-capped reconstruction launches, all slower) is removed
#   MODE=reconfloor (session 9, GD12 call 2) bench_gdn_verify.py --recon-floors: the reconstruction (one launch, 30
#               layers) at L16 b1, L4 b1, L16 b32 beside torch's in-place scale / copy of its state slots and a Triton
#               in-place scale with its program shape, with and without its two dependent loads -> $OUT/diag/
#   (MODE=final12, session 9 GD11 call B at 38737b5: final10 with --sweep-set pf12, the b1 input prefetch; removed
#               with the option after that run)
#   MODE=final  (call 2) the GDN GPU tests, then bench_gdn_verify.py over the issue's grid with the sweep and
#               --write-tuned -> $OUT/gdn/gdn_verify.{json,md,png} + tuned_verify_configs.json.
# Here (CPU) for MODE=final: python eval/_vllm_sources.py .vendor/extracted  (carry .vendor/extracted)
# Device:  HYBRIDSPEC_COMMIT=<sha> MODE=diag bash eval/run_gpu_gdn.sh
set +e
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
OUT=${OUT:-/tmp/hybridspec_out}
MODE=${MODE:-diag}
COMMIT=${HYBRIDSPEC_COMMIT:-unknown}
mkdir -p /tmp/pk
ln -sfn "$PWD/triton_kernels" /tmp/pk/hybridspec_kernels
export PYTHONPATH=/tmp/pk
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader

if [ "$MODE" = diag ]; then
    mkdir -p "$OUT/diag"
    timeout ${DIAG_S:-150} python3 eval/bench_gdn_verify.py --diagnose --rep-ms 20 --out "$OUT/diag" --budget-s ${DIAG_BUDGET_S:-115} \
        > "$OUT/diag/diag.log" 2>&1
    echo "== diag rc=$? at $(( $(date +%s) - T0 )) s"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -n "$NCU" ]; then
        timeout ${NCU_S:-35} "$NCU" --clock-control none -k regex:_gdn_verify -c 10 --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
            python3 eval/bench_gdn_verify.py --ncu-target > "$OUT/diag/ncu.txt" 2>&1
        echo "== ncu rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "Duration|Registers Per|Achieved Occ|Memory Throughput|Stall|Theoretical Occ|One or More|==PROF==|==ERROR==" "$OUT/diag/ncu.txt" | head -40
    fi
    grep -E "^error|precompile|compile failed" "$OUT/diag/diag.log" | cut -c1-160
    sed -n '/^kind /,$p' "$OUT/diag/diag.log"
    tail -3 "$OUT/diag/diag.log"
fi

if [ "$MODE" = b1diag ]; then
    mkdir -p "$OUT/diag"
    [ -n "$NCU_ONLY" ] || timeout ${DIAG_S:-100} python3 eval/bench_gdn_verify.py --b1-diag --rep-ms 20 --out "$OUT/diag" \
        --budget-s ${DIAG_BUDGET_S:-85} > "$OUT/diag/b1diag.log" 2>&1
    echo "== b1 diag rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "^precompile|compile failed|^b1diag" "$OUT/diag/b1diag.log" | cut -c1-220
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [ -n "$NCU" ]; then
        "$NCU" --version | tail -1
        timeout ${NCU_S:-100} "$NCU" --clock-control none --set full --import-source yes --warp-sampling-interval 0 \
            -k regex:"gdn_verify_kernel|gdn_reconstruct" -c 4 -f -o /tmp/b1prof \
            python3 eval/bench_gdn_verify.py --ncu-target gd11 > "$OUT/diag/ncu.log" 2>&1
        echo "== ncu rc=$? at $(( $(date +%s) - T0 )) s"
        tail -5 "$OUT/diag/ncu.log"
        timeout 30 "$NCU" -i /tmp/b1prof.ncu-rep --page details > "$OUT/diag/ncu_details.txt" 2>&1
        timeout 60 "$NCU" -i /tmp/b1prof.ncu-rep --page source --csv --print-source sass 2> "$OUT/diag/ncu_source.err" \
            | gzip > "$OUT/diag/ncu_source.csv.gz"
        echo "== ncu export at $(( $(date +%s) - T0 )) s"; head -c 600 "$OUT/diag/ncu_source.err"
        grep -E "gdn_|Duration|Registers Per|Achieved Occ|Theoretical Occ|Issue Slots Busy|Issued Ipc|DRAM Throughput|Memory Throughput|Warp Cycles Per Issued|No Eligible|==ERROR==" \
            "$OUT/diag/ncu_details.txt" | cut -c1-150 | head -80
    else
        echo "== no ncu"
    fi
fi

if [ "$MODE" = sdiag ]; then
    mkdir -p "$OUT/diag"
    ( timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -k stacked \
        tests/ops/test_gdn_verify.py > "$OUT/diag/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/diag/pytest.log" ) &
    timeout ${DIAG_S:-170} python3 eval/bench_gdn_verify.py --state-diag --rep-ms 20 --out "$OUT/diag" \
        --budget-s ${DIAG_BUDGET_S:-150} > "$OUT/diag/diag.log" 2>&1
    echo "== state diag rc=$? at $(( $(date +%s) - T0 )) s"
    wait
    tail -3 "$OUT/diag/pytest.log"
    grep -E "^error|^precompile|compile failed" "$OUT/diag/diag.log" | cut -c1-200
    sed -n '/^part /,$p' "$OUT/diag/diag.log"
    tail -2 "$OUT/diag/diag.log"
fi

if [ "$MODE" = pdiag ]; then
    mkdir -p "$OUT/diag"
    ( timeout ${TEST_S:-100} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -k tma \
        tests/ops/test_gdn_verify.py > "$OUT/diag/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/diag/pytest.log" ) &
    timeout ${DIAG_S:-130} python3 eval/bench_gdn_verify.py --state-diag gb6 --rep-ms 20 --out "$OUT/diag" \
        --budget-s ${DIAG_BUDGET_S:-110} > "$OUT/diag/diag.log" 2>&1
    echo "== state diag rc=$? at $(( $(date +%s) - T0 )) s"
    wait
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [ -n "$NCU" ]; then
        timeout ${NCU_S:-45} "$NCU" --clock-control none -k regex:stacked_state -c 6 --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
            python3 eval/bench_gdn_verify.py --ncu-target gb6 > "$OUT/diag/ncu.txt" 2>&1
        echo "== ncu rc=$? at $(( $(date +%s) - T0 )) s"
        grep -E "stacked_state|Duration|Registers Per|Shared Memory Config|Achieved Occ|Theoretical Occ|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Stall|==ERROR==" \
            "$OUT/diag/ncu.txt" | cut -c1-150 | head -60
    else
        echo "== no ncu"
    fi
    tail -3 "$OUT/diag/pytest.log"
    grep -E "^error|^precompile|compile failed" "$OUT/diag/diag.log" | cut -c1-200
    sed -n '/^part /,$p' "$OUT/diag/diag.log"
    tail -2 "$OUT/diag/diag.log"
fi

if [ "$MODE" = bf16state ] || [ "$MODE" = bf16recon ] || [ "$MODE" = bf16s24 ]; then
    if [ "$MODE" = bf16state ]; then
        SWEEP_SET=bf16state TEST_K="bf16-state" TEST_S=${TEST_S:-90} TEST_WORKERS=${TEST_WORKERS:-5} \
            BENCH_S=${BENCH_S:-165} STOP_AT_S=${STOP_AT_S:-140} EXTRA=""
    elif [ "$MODE" = bf16s24 ]; then
        SWEEP_SET=bf16s24 TEST_K="s24" TEST_S=${TEST_S:-60} TEST_WORKERS=${TEST_WORKERS:-4} \
            BENCH_S=${BENCH_S:-300} STOP_AT_S=${STOP_AT_S:-270} EXTRA="--total-margin 0.02 --recon-margin 0.02"
    else
        SWEEP_SET=bf16recon TEST_K="bf16-state-recon or (short_forms and bf16-state)" TEST_S=${TEST_S:-60} \
            TEST_WORKERS=${TEST_WORKERS:-6} BENCH_S=${BENCH_S:-98} STOP_AT_S=${STOP_AT_S:-86} EXTRA="--recon-margin 0.02"
    fi
    mkdir -p "$OUT/gdn"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl && export PYTHONPATH=/tmp/pk:/tmp/site
    rm -f /tmp/gpu_tests_done
    ( timeout $TEST_S python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -n $TEST_WORKERS -k "$TEST_K" \
        tests/ops/test_gdn_verify.py > "$OUT/gdn/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/gdn/pytest.log"
      touch /tmp/gpu_tests_done ) &
    timeout $BENCH_S python3 eval/bench_gdn_verify.py --ssm-dtype bfloat16 --out "$OUT/gdn" --sweep \
        --sweep-set $SWEEP_SET --sweep-lens 4,16 --no-fold --precompile --wait-file /tmp/gpu_tests_done $EXTRA \
        --stop-at-s $STOP_AT_S --write-tuned "$OUT/gdn/tuned_bf16_state.json" \
        --command "python eval/bench_gdn_verify.py --ssm-dtype bfloat16 --sweep --sweep-set $SWEEP_SET --sweep-lens 4,16 --no-fold --precompile${EXTRA:+ $EXTRA} (eval/run_gpu_gdn.sh MODE=$MODE, commit $COMMIT)" \
        > "$OUT/gdn/bench.log" 2>&1
    echo "== bench rc=$? at $(( $(date +%s) - T0 )) s"
    wait
    tail -4 "$OUT/gdn/pytest.log"
    grep -E "^precompile|compile failed|^correctness|^config errors|^recon errors|fla failed|time budget|waited|Error" \
        "$OUT/gdn/bench.log" | cut -c1-1500
    grep "^sweep " "$OUT/gdn/bench.log" | cut -c1-150
    sed -n '/^  L   B /,$p' "$OUT/gdn/bench.log"
    echo "== end at $(( $(date +%s) - T0 )) s"
fi

if [ "$MODE" = reconfloor ]; then
    mkdir -p "$OUT/diag"
    timeout ${DIAG_S:-90} python3 eval/bench_gdn_verify.py --recon-floors --rep-ms 20 --out "$OUT/diag" \
        --budget-s ${DIAG_BUDGET_S:-75} > "$OUT/diag/reconfloor.log" 2>&1
    echo "== recon floors rc=$? at $(( $(date +%s) - T0 )) s"
    grep -vE "^reconfloor" "$OUT/diag/reconfloor.log" | tail -20
fi

if [ "$MODE" = long24 ]; then
    # session 24: pdl_first for the b1 picks at L 17 / 32, fp32 states then bf16 states (the second run starts from the
    # first's tuned file, so the last one written carries both)
    mkdir -p "$OUT/gdn"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl && export PYTHONPATH=/tmp/pk:/tmp/site
    timeout ${TEST_S:-60} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -n 2 -k "pdl_first and long" \
        tests/ops/test_gdn_verify.py > "$OUT/gdn/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/gdn/pytest.log"
    tail -2 "$OUT/gdn/pytest.log"
    for DT in float32 bfloat16; do
        if [ $DT = float32 ]; then SET=long24 STEM=gdn_verify_long B=1,8,32,64; else SET=long24bf16 STEM=gdn_verify_long_bf16_state B=1,8,32; fi
        EXTRA="--lens 17,32 --batches $B --sweep-lens 17,32 --no-fold --total-margin 0.02 --recon-margin 0.02 --results-stem $STEM"
        timeout ${BENCH_S:-170} python3 eval/bench_gdn_verify.py --ssm-dtype $DT --out "$OUT/gdn" --sweep --sweep-set $SET \
            --precompile --write-tuned "$OUT/gdn/tuned_$DT.json" $EXTRA \
            --command "python eval/bench_gdn_verify.py --ssm-dtype $DT --sweep --sweep-set $SET --precompile $EXTRA (eval/run_gpu_gdn.sh MODE=$MODE, commit $COMMIT)" \
            > "$OUT/gdn/bench_$DT.log" 2>&1
        echo "== bench $DT rc=$? at $(( $(date +%s) - T0 )) s"
        cp "$OUT/gdn/tuned_$DT.json" triton_kernels/gdn_verify/tuned_verify_configs.json
        grep -E "^precompile|compile failed|^correctness|time budget|out of memory|Error" "$OUT/gdn/bench_$DT.log" | cut -c1-300
        grep "^sweep verify" "$OUT/gdn/bench_$DT.log" | cut -c1-140
        sed -n '/^  L   B /,$p' "$OUT/gdn/bench_$DT.log" | head -12
    done
fi

if [ "$MODE" = lean25 ]; then
    # session 25: the conv's leaner instruction stream (fast sigmoid, fp32 weight copy, one load a tap), which is code,
    # not a launch option: against the previous commit's kernels (.vendor/base25/triton_kernels, carried) in
    # alternating runs of the grid at L 4 / 16 (new, base, new, base), then the headline grids (fp32, bf16 states) on
    # the new code -> $OUT/gdn/gdn_verify.* and gdn_verify_bf16_state.*
    mkdir -p "$OUT/gdn" /tmp/ab /tmp/pkbase
    ln -sfn "$PWD/.vendor/base25/triton_kernels" /tmp/pkbase/hybridspec_kernels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl
    export PYTHONPATH=/tmp/pk:/tmp/site
    rm -f /tmp/gpu_tests_done
    ( timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -n ${TEST_WORKERS:-6} \
        -k "${TEST_K:-every_shipped_pick or fast_sigmoid}" tests/ops/test_gdn_verify.py tests/ops/test_fast_math.py \
        > /tmp/ab/pytest.log 2>&1; echo "pytest rc=$?" >> /tmp/ab/pytest.log; touch /tmp/gpu_tests_done ) &
    for R in new1 base1 new2 base2; do
        case $R in new*) PP=/tmp/pk;; *) PP=/tmp/pkbase;; esac
        WAIT=""; [ $R = new1 ] && WAIT="--wait-file /tmp/gpu_tests_done"
        PYTHONPATH=$PP:/tmp/site timeout ${AB_S:-150} python3 eval/bench_gdn_verify.py --ssm-dtype ${AB_SSM:-float32} \
            --lens 4,16 --no-fold --no-plot \
            --precompile $WAIT --out /tmp/ab/$R --results-stem gdn_verify_ab --command "ab $R" > /tmp/ab/$R.log 2>&1
        echo "== $R rc=$? at $(( $(date +%s) - T0 )) s"
        grep -E "compile failed|^correctness|time budget|Error" /tmp/ab/$R.log | cut -c1-300
        sed -n '/^  L   B /,$p' /tmp/ab/$R.log | head -9
    done
    tail -3 /tmp/ab/pytest.log
    grep -E "passed|failed|error" /tmp/ab/pytest.log | tail -3
    grep -E "^E |Error" /tmp/ab/pytest.log | head -12 | cut -c1-400
    [ "${HEADLINE:-1}" = 1 ] && python3 eval/bench_gdn_verify.py --precompile --no-fold --out "$OUT/gdn" \
        --command "python eval/bench_gdn_verify.py --precompile --no-fold (the shipped picks of the tuned file, commit $COMMIT)" \
        > /tmp/ab/headline.log 2>&1
    echo "== headline rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "compile failed|^correctness|time budget|Error" /tmp/ab/headline.log | cut -c1-300
    sed -n '/^  L   B /,$p' /tmp/ab/headline.log | head -20
    [ "${HEADLINE:-1}" = 1 ] && python3 eval/bench_gdn_verify.py --ssm-dtype bfloat16 --precompile --no-fold --out /tmp/ab/bf16 \
        --command "python eval/bench_gdn_verify.py --ssm-dtype bfloat16 --precompile --no-fold (the shipped picks of the tuned file, commit $COMMIT)" \
        > /tmp/ab/bf16.log 2>&1
    echo "== bf16 headline rc=$? at $(( $(date +%s) - T0 )) s"
    sed -n '/^  L   B /,$p' /tmp/ab/bf16.log | head -20
    cp /tmp/ab/bf16/gdn_verify_bf16_state.* "$OUT/gdn/" 2>/dev/null
    python3 - <<'PY'
import json
for r in ("new1", "base1", "new2", "base2"):
    try:
        d = json.load(open(f"/tmp/ab/{r}/gdn_verify_ab.json"))
    except Exception as e:
        print(r, "no results", e); continue
    print(r, " ".join(f"L{x['L']}b{x['B']}:{x['ours_us_all']:.2f}/{x['ours_verify_us']:.2f}/{x['vllm_us_all']:.1f}"
                      for x in d["rows"]))
PY
    echo "== end at $(( $(date +%s) - T0 )) s"
fi

if [ "$MODE" = lean25var ]; then
    # session 25, call 3: which of lean25's three conv changes moves the 8-warp b1 pick (L 4 / 8) at bf16 states:
    # variants made here from the tree (w16: the transposed weight copy left in the weights' dtype; tlsig: the SiLU by
    # tl.sigmoid; pairsum: _conv4_math's taps summed in pairs again), the previous commit's kernels (base) and the tree (new), alternating, twice
    mkdir -p /tmp/var
    for V in w16 tlsig pairsum; do
        rm -rf /tmp/var/$V && mkdir -p /tmp/var/$V && cp -r triton_kernels /tmp/var/$V/hybridspec_kernels
    done
    python3 - <<'PY'
p = "/tmp/var/pairsum/hybridspec_kernels/gdn_verify/verify.py"
s = open(p).read()
old = """    acc = i0.to(tl.float32) * w0.to(tl.float32)
    acc += i1.to(tl.float32) * w1.to(tl.float32)
    acc += i2.to(tl.float32) * w2.to(tl.float32)
    acc += i3.to(tl.float32) * w3.to(tl.float32)
"""
new = """    acc = i0.to(tl.float32) * w0.to(tl.float32) + i1.to(tl.float32) * w1.to(tl.float32)
    acc += i2.to(tl.float32) * w2.to(tl.float32) + i3.to(tl.float32) * w3.to(tl.float32)
"""
print("pairsum variant:", old in s)
open(p, "w").write(s.replace(old, new))
PY
    sed -i 's/copy = conv_weight.t().to(torch.float32).contiguous()/copy = conv_weight.t().contiguous()/' \
        /tmp/var/w16/hybridspec_kernels/gdn_verify/verify.py
    sed -i 's/acc = acc \* sigmoid(acc)/acc = acc * tl.sigmoid(acc)/' /tmp/var/tlsig/hybridspec_kernels/gdn_verify/verify.py \
        /tmp/var/tlsig/hybridspec_kernels/gdn_verify/stacked.py
    grep -c "conv_weight.t().contiguous()" /tmp/var/w16/hybridspec_kernels/gdn_verify/verify.py
    grep -c "tl.sigmoid(acc)" /tmp/var/tlsig/hybridspec_kernels/gdn_verify/verify.py
    mkdir -p /tmp/var/base && ln -sfn "$PWD/.vendor/base25/triton_kernels" /tmp/var/base/hybridspec_kernels
    mkdir -p /tmp/var/new && ln -sfn "$PWD/triton_kernels" /tmp/var/new/hybridspec_kernels
    for REP in 1 2; do
        for V in new base w16 tlsig pairsum; do
            PYTHONPATH=/tmp/var/$V timeout ${AB_S:-120} python3 eval/bench_gdn_verify.py --ssm-dtype ${AB_SSM:-bfloat16} \
                --lens ${AB_LENS:-4,8,16} --batches ${AB_BATCHES:-1} --no-fold --no-plot --out /tmp/var/out_$V$REP \
                --results-stem gdn_verify_var --command "var $V$REP" > /tmp/var/$V$REP.log 2>&1
            echo "== $V$REP rc=$? at $(( $(date +%s) - T0 )) s"
            grep -E "compile failed|^correctness|Error" /tmp/var/$V$REP.log | cut -c1-200
        done
    done
    python3 - <<'PY'
import json
for rep in (1, 2):
    for v in ("new", "base", "w16", "tlsig", "pairsum"):
        try:
            d = json.load(open(f"/tmp/var/out_{v}{rep}/gdn_verify_var.json"))
        except Exception as e:
            print(v, rep, "no results", e); continue
        print(f"{v:6}{rep}", " ".join(f"L{x['L']}b{x['B']}:{x['ours_us_all']:.2f}/{x['ours_verify_us']:.2f}" for x in d["rows"]))
PY
    echo "== end at $(( $(date +%s) - T0 )) s"
fi

if [ "$MODE" = long25 ]; then
    # session 25: eval/results/gdn_verify_long*.* re-made on the leaner conv, the shipped picks (no sweep)
    mkdir -p "$OUT/gdn"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        && export PYTHONPATH=/tmp/pk:/tmp/site
    for DT in float32 bfloat16; do
        if [ $DT = float32 ]; then STEM=gdn_verify_long B=1,8,32,64; else STEM=gdn_verify_long_bf16_state B=1,8,32; fi
        EXTRA="--ssm-dtype $DT --lens 17,32 --batches $B --no-fold --precompile --results-stem $STEM"
        timeout ${BENCH_S:-170} python3 eval/bench_gdn_verify.py $EXTRA --out "$OUT/gdn" \
            --command "python eval/bench_gdn_verify.py $EXTRA (the shipped picks of the tuned file, commit $COMMIT)" \
            > /tmp/long_$DT.log 2>&1
        echo "== $DT rc=$? at $(( $(date +%s) - T0 )) s"
        grep -E "compile failed|time budget|out of memory|Error" /tmp/long_$DT.log | cut -c1-300
        sed -n '/^  L   B /,$p' /tmp/long_$DT.log | head -10
    done
fi

if [ "$MODE" = chunk26 ]; then
    mkdir -p "$OUT" /tmp/gdn
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl && export PYTHONPATH=/tmp/pk:/tmp/site
    if [ "${CHUNK_TESTS:-1}" = 1 ]; then
        timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -n ${TEST_WORKERS:-6} \
            -k "${TEST_K:-chunked}" tests/ops/test_gdn_verify.py > /tmp/gdn/pytest.log 2>&1
        echo "pytest rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error|assert" /tmp/gdn/pytest.log | tail -12
    fi
    for DT in float32 bfloat16; do
        if [ $DT = float32 ]; then SET=chunk26 STEM=gdn_verify_long B=1,8,32,64; else SET=chunk26bf16 STEM=gdn_verify_long_bf16_state B=1,8,32; fi
        EXTRA="--lens 17,32 --batches $B --sweep-lens 17,32 --no-fold --total-margin 0.02 --recon-margin 0.02 --results-stem $STEM"
        timeout ${BENCH_S:-260} python3 eval/bench_gdn_verify.py --ssm-dtype $DT --out /tmp/gdn --sweep --sweep-set $SET \
            --precompile --write-tuned "/tmp/gdn/tuned_$DT.json" $EXTRA \
            --command "python eval/bench_gdn_verify.py --ssm-dtype $DT --sweep --sweep-set $SET --precompile $EXTRA (eval/run_gpu_gdn.sh MODE=$MODE, commit $COMMIT)" \
            > /tmp/gdn/bench_$DT.log 2>&1
        echo "== bench $DT rc=$? at $(( $(date +%s) - T0 )) s"
        cp /tmp/gdn/tuned_$DT.json triton_kernels/gdn_verify/tuned_verify_configs.json
        cp /tmp/gdn/$STEM.json /tmp/gdn/$STEM.md /tmp/gdn/$STEM.png "$OUT/" 2>/dev/null
        grep -E "^precompile|compile failed|^correctness|^config errors|time budget|out of memory|Error" /tmp/gdn/bench_$DT.log | cut -c1-900
        grep "^sweep verify" /tmp/gdn/bench_$DT.log | cut -c14-125
        sed -n '/^  L   B /,$p' /tmp/gdn/bench_$DT.log | head -12
    done
    cp /tmp/gdn/tuned_bfloat16.json "$OUT/" 2>/dev/null
    echo "== end at $(( $(date +%s) - T0 )) s"
fi

if [ "$MODE" = chunk26c ]; then
    # session 26, call 3: the second chunk without a carried state block against the first build (.vendor/base26,
    # carried: `git archive <base> triton_kernels | tar -x -C .vendor/base26`): the chunked GPU tests, grids at L 17
    # alternating new / base (twice, the shipped picks; verify alone on stdout), then MODE=chunk26 without its tests
    mkdir -p "$OUT" /tmp/gdn /tmp/ab /tmp/pkbase
    ln -sfn "$PWD/.vendor/base26/triton_kernels" /tmp/pkbase/hybridspec_kernels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl
    PYTHONPATH=/tmp/pk:/tmp/site timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu \
        -n ${TEST_WORKERS:-8} -k "${TEST_K:-chunked}" tests/ops/test_gdn_verify.py > /tmp/gdn/pytest.log 2>&1
    echo "pytest rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error|assert|^FAILED" /tmp/gdn/pytest.log | tail -12
    for R in new1 base1 new2 base2; do
        case $R in new*) PP=/tmp/pk;; *) PP=/tmp/pkbase;; esac
        PYTHONPATH=$PP:/tmp/site timeout ${AB_S:-120} python3 eval/bench_gdn_verify.py --ssm-dtype float32 \
            --lens ${AB_LENS:-17} --batches ${AB_BATCHES:-1,8,32} --no-fold --no-plot --precompile --out /tmp/ab/$R \
            --results-stem gdn_verify_ab26 --command "ab $R" > /tmp/ab/$R.log 2>&1
        echo "== $R rc=$? at $(( $(date +%s) - T0 )) s"
        grep -E "compile failed|time budget|Error" /tmp/ab/$R.log | cut -c1-300
        sed -n '/^  L   B /,$p' /tmp/ab/$R.log | head -5
    done
    [ "${SWEEP:-1}" = 1 ] && CHUNK_TESTS=0 MODE=chunk26 bash eval/run_gpu_gdn.sh
fi

if [ "$MODE" = chunk26b ]; then
    mkdir -p "$OUT" /tmp/gdn
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl && export PYTHONPATH=/tmp/pk:/tmp/site
    timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu -n ${TEST_WORKERS:-8} \
        -k "${TEST_K:-chunked or every_shipped_pick}" tests/ops/test_gdn_verify.py > /tmp/gdn/pytest.log 2>&1
    echo "pytest rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error|assert|^FAILED" /tmp/gdn/pytest.log | tail -20
    EXTRA="--ssm-dtype float32 --lens 16,17,32 --batches 1,8,32 --no-fold --precompile --results-stem gdn_verify_long_vs_16"
    timeout ${BENCH_S:-200} python3 eval/bench_gdn_verify.py $EXTRA --out /tmp/gdn \
        --command "python eval/bench_gdn_verify.py $EXTRA (the shipped picks of the tuned file, commit $COMMIT)" \
        > /tmp/gdn/grid.log 2>&1
    echo "== grid rc=$? at $(( $(date +%s) - T0 )) s"
    cp /tmp/gdn/gdn_verify_long_vs_16.* "$OUT/" 2>/dev/null
    grep -E "compile failed|time budget|out of memory|Error" /tmp/gdn/grid.log | cut -c1-300
    sed -n '/^  L   B /,$p' /tmp/gdn/grid.log | head -14
    timeout ${DIAG_S:-120} python3 eval/bench_gdn_verify.py --state-diag chunk26 --rep-ms 20 --out /tmp/gdn \
        --budget-s ${DIAG_BUDGET_S:-90} > /tmp/gdn/diag.log 2>&1
    echo "== state diag rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "^(error|prep|state|both|floor|reconstruct) " /tmp/gdn/diag.log | cut -c1-200
fi

if [ "$MODE" = long12bf16 ]; then
    mkdir -p "$OUT/gdn"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        && export PYTHONPATH=/tmp/pk:/tmp/site
    EXTRA="--lens 17,32 --batches 1,8,32 --sweep-lens 17,32 --no-fold --total-margin 0.02 --recon-margin 0.02 --results-stem gdn_verify_long_bf16_state --stop-at-s ${STOP_AT_S:-90}"
    timeout ${BENCH_S:-120} python3 eval/bench_gdn_verify.py --ssm-dtype bfloat16 --out "$OUT/gdn" --sweep \
        --sweep-set long12bf16 --precompile --write-tuned "$OUT/gdn/tuned_verify_configs.json" --no-plot $EXTRA \
        --command "python eval/bench_gdn_verify.py --ssm-dtype bfloat16 --sweep --sweep-set long12bf16 --precompile $EXTRA (eval/run_gpu_gdn.sh MODE=$MODE, commit $COMMIT)" \
        > "$OUT/gdn/bench_bf16.log" 2>&1
    echo "== bench bf16 rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "^precompile|compile failed|^correctness|^config errors|^recon errors|fla failed|time budget|out of memory|Error" \
        "$OUT/gdn/bench_bf16.log" | cut -c1-600
    grep "^sweep " "$OUT/gdn/bench_bf16.log" | cut -c1-170
    sed -n '/^  L   B /,$p' "$OUT/gdn/bench_bf16.log"
fi

if [ "$MODE" = final ] || [ "$MODE" = final2 ] || [ "$MODE" = final3 ] || [ "$MODE" = final4 ] || [ "$MODE" = final5 ] || [ "$MODE" = final6 ] || [ "$MODE" = final7 ] || [ "$MODE" = final8 ] || [ "$MODE" = final9 ] || [ "$MODE" = final10 ] || [ "$MODE" = long11 ] || [ "$MODE" = prep13 ] || [ "$MODE" = pdl23 ] || [ "$MODE" = nopdl24 ]; then
    # final: all GDN GPU tests, sweep set v4; final2 (v5 call): only the weight_tiles GPU tests (the bench's
    # bf16-vs-float64 gate covers every swept config's outputs), sweep set v5; final3: the fold
    if [ "$MODE" = final ]; then
        SWEEP_SET=v4 TEST_K="" TEST_S=${TEST_S:-100} BENCH_S=${BENCH_S:-270} GRID_S=${GRID_S:-150} CUT=1500
    elif [ "$MODE" = final2 ]; then
        SWEEP_SET=v5 TEST_K=weight-tiles TEST_S=${TEST_S:-80} BENCH_S=${BENCH_S:-200} GRID_S=${GRID_S:-100} CUT=1800
    elif [ "$MODE" = final3 ]; then
        SWEEP_SET=fold TEST_K=fold SWEEP_CUT=120 TEST_S=${TEST_S:-120} BENCH_S=${BENCH_S:-380} GRID_S=${GRID_S:-170} CUT=2500
    elif [ "$MODE" = final4 ]; then
        SWEEP_SET=short TEST_K=hoisted-weight-tiles SWEEP_CUT=110 TEST_S=${TEST_S:-60} \
            BENCH_S=${BENCH_S:-200} GRID_S=${GRID_S:-1000} CUT=1200
        EXTRA="--sweep-lens 4,16 --no-fold --stop-at-s ${STOP_AT_S:-165}"
    elif [ "$MODE" = final5 ]; then
        SWEEP_SET=short4 TEST_K="short_forms or hoisted-weight-tiles" SWEEP_CUT=120 TEST_S=${TEST_S:-80} \
            BENCH_S=${BENCH_S:-240} GRID_S=${GRID_S:-1000} CUT=1500
        EXTRA="--sweep-lens 4,16 --no-fold --ladder --stop-at-s ${STOP_AT_S:-200}"
    elif [ "$MODE" = final6 ]; then
        SWEEP_SET=short5 TEST_K="short_forms or hoisted-weight-tiles or hoisted-early-stores" SWEEP_CUT=120 \
            TEST_S=${TEST_S:-80} BENCH_S=${BENCH_S:-240} GRID_S=${GRID_S:-1000} CUT=1500
        EXTRA="--sweep-lens 4,16 --no-fold --stop-at-s ${STOP_AT_S:-200}"
    elif [ "$MODE" = final9 ]; then
        SWEEP_SET=tma9 TEST_K="tma" SWEEP_CUT=170 TEST_S=${TEST_S:-90} BENCH_S=${BENCH_S:-230} \
            GRID_S=${GRID_S:-1000} CUT=1500 XDIST="-n ${TEST_WORKERS:-6}"
        EXTRA="--sweep-lens 4,16 --no-fold --verify-margin 0.02 --stop-at-s ${STOP_AT_S:-200}"
    elif [ "$MODE" = final10 ]; then
        SWEEP_SET=l2pf10 TEST_K="l2_prefetch" SWEEP_CUT=210 TEST_S=${TEST_S:-90} BENCH_S=${BENCH_S:-300} \
            GRID_S=${GRID_S:-1000} CUT=1500 XDIST="-n ${TEST_WORKERS:-4}"
        EXTRA="--sweep-lens 4,16 --no-fold --total-margin 0.03 --recon-margin 0.02 --stop-at-s ${STOP_AT_S:-250}"
    elif [ "$MODE" = prep13 ]; then
        # session 11: the stacked picks with their prep on 8 warps (eval/bench_gdn_verify.py, prep13); results beside
        # the headline (gdn_verify_prep13.*), the tuned file from the sweep
        SWEEP_SET=prep13 TEST_K="tma_loads" SWEEP_CUT=210 TEST_S=${TEST_S:-60} BENCH_S=${BENCH_S:-300} \
            GRID_S=${GRID_S:-1000} CUT=1500 XDIST="-n ${TEST_WORKERS:-4}"
        EXTRA="--sweep-lens 4,16 --no-fold --total-margin 0.03 --recon-margin 0.02 --results-stem gdn_verify_prep13 --stop-at-s ${STOP_AT_S:-250}"
    elif [ "$MODE" = pdl23 ] || [ "$MODE" = nopdl24 ]; then
        # session 23 (pdl23): each shipped pick with its first launch by PDL; session 24 (nopdl24): the fp32 stacked
        # picks against the stacked form without PDL (with and without the L2 prefetch). The sweep set of the same
        # name (eval/bench_gdn_verify.py); results beside the headline (gdn_verify_<mode>.*), the tuned file from it
        SWEEP_SET=$MODE TEST_K="pdl_first" SWEEP_CUT=210 TEST_S=${TEST_S:-60} BENCH_S=${BENCH_S:-300} \
            GRID_S=${GRID_S:-1000} CUT=1500 XDIST="-n ${TEST_WORKERS:-4}"
        EXTRA="--sweep-lens 4,16 --no-fold --total-margin 0.02 --recon-margin 0.02 --results-stem gdn_verify_$MODE --stop-at-s ${STOP_AT_S:-250}"
    elif [ "$MODE" = long11 ]; then
        SWEEP_SET=long11 TEST_K="long11" SWEEP_CUT=210 TEST_S=${TEST_S:-90} BENCH_S=${BENCH_S:-200} \
            GRID_S=${GRID_S:-1000} CUT=1500 XDIST="-n ${TEST_WORKERS:-3}"
        EXTRA="--lens 17,32 --sweep-lens 17,32 --no-fold --total-margin 0.02 --recon-margin 0.02 --results-stem gdn_verify_long --stop-at-s ${STOP_AT_S:-170}"
    elif [ "$MODE" = final8 ]; then
        SWEEP_SET=stacked7 TEST_K="stacked or maxnreg or two-pass or two_pass" SWEEP_CUT=140 TEST_S=${TEST_S:-100} \
            BENCH_S=${BENCH_S:-230} GRID_S=${GRID_S:-1000} CUT=1500
        EXTRA="--sweep-lens 4,16 --no-fold --stop-at-s ${STOP_AT_S:-200}"
    else
        SWEEP_SET=split6 TEST_K="split or unaligned or short_forms or hoisted-weight-tiles or checkpoint" \
            SWEEP_CUT=120 TEST_S=${TEST_S:-90} BENCH_S=${BENCH_S:-200} GRID_S=${GRID_S:-1000} CUT=1500
        EXTRA="--sweep-lens 4,16 --no-fold --stop-at-s ${STOP_AT_S:-170}"
        TEST_FILES=tests/ops/test_gdn_checkpoint.py
    fi
    mkdir -p "$OUT/gdn"
    # FLA from the carried wheel (.whl, pure Python): the issue's second baseline
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/fla_core-*.whl \
        .whl/execnet-*.whl .whl/pytest_xdist-*.whl && export PYTHONPATH=/tmp/pk:/tmp/site
    rm -f /tmp/gpu_tests_done
    # the GPU tests compile while the bench precompiles (16 cores); the bench times nothing before they end
    ( timeout $TEST_S python3 -m pytest -q -p no:cacheprovider --noconftest -m gpu $XDIST ${TEST_K:+-k "$TEST_K"} \
        tests/ops/test_gdn_verify.py $TEST_FILES > "$OUT/gdn/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/gdn/pytest.log"
      touch /tmp/gpu_tests_done ) &
    timeout $BENCH_S python3 eval/bench_gdn_verify.py --out "$OUT/gdn" --sweep --sweep-set $SWEEP_SET --precompile \
        --wait-file /tmp/gpu_tests_done --budget-s $GRID_S --write-tuned "$OUT/gdn/tuned_verify_configs.json" $EXTRA \
        --command "python eval/bench_gdn_verify.py --sweep --sweep-set $SWEEP_SET --precompile $EXTRA (eval/run_gpu_gdn.sh MODE=$MODE, commit $COMMIT)" \
        > "$OUT/gdn/bench.log" 2>&1
    echo "== bench rc=$? at $(( $(date +%s) - T0 )) s"
    wait
    tail -4 "$OUT/gdn/pytest.log"
    grep -E "^precompile|compile failed|^correctness|^config errors|^recon errors|fla failed|time budget|waited|^ladder" "$OUT/gdn/bench.log" | cut -c1-$CUT
    grep "^sweep " "$OUT/gdn/bench.log" | cut -c1-${SWEEP_CUT:-200}
    sed -n '/^  L   B /,$p' "$OUT/gdn/bench.log"
    [ "$MODE" = long11 ] && python3 -c "import json; d = json.load(open('$OUT/gdn/tuned_verify_configs.json')); print({L: {b: (c['block_v'], c['num_warps'], c['stacked'], c['prep_maxnreg'], c['prep_warps'], c['tma_loads'], c['l2_prefetch_mib']) for b, c in t.items()} for L, t in d['verify_by_len'].items()}, d['reconstruct_by_len'])"
    [ "$MODE" = final3 ] || [ "$MODE" = final4 ] || [ "$MODE" = final5 ] || [ "$MODE" = final6 ] || [ "$MODE" = final7 ] || [ "$MODE" = final8 ] || [ "$MODE" = final9 ] || [ "$MODE" = final10 ] || { cat "$OUT/gdn/tuned_verify_configs.json" 2>/dev/null | tr -d ' \n' | cut -c1-$CUT; echo; }
    echo "== end at $(( $(date +%s) - T0 )) s"
fi
ls -la "$OUT"/*
