"""eval/bench_gdn_verify.py --quick runs end to end on the CPU (Triton interpreter, tiny shapes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".vendor" / "vllm033").exists(), reason="vLLM 0.33 wheel sources not unpacked")
def test_bench_quick_writes_results(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONSAFEPATH": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, str(REPO / "eval" / "bench_gdn_verify.py"), "--quick", "--out", str(tmp_path / "res"),
           "--extracted", str(tmp_path / "vsrc")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    doc = json.loads((tmp_path / "res" / "gdn_verify.json").read_text())
    for key in ("bench", "device", "commit", "date", "command", "rows", "summary"):
        assert key in doc
    assert doc["correctness"]["ours_out_rel_err"] < 1e-5
    assert doc["correctness"]["vllm_out_rel_err"] < 1e-5
    assert doc["correctness"]["ours_fold_out_rel_err"] < 1e-5  # two folded steps vs the sequential reference
    assert doc["correctness"]["ours_fold_ssm_rel_err"] < 1e-5
    for key in ("ours_us_all", "ours_folded_us_all", "fold_gain_all", "ours_folded_conv_us"):
        assert key in doc["rows"][0]
    assert doc["summary"]["state_bytes_ratio"] > 1
    assert (tmp_path / "res" / "gdn_verify.md").exists()
