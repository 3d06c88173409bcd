"""eval/bench_gdn_verify.py --quick runs end to end on the CPU (Triton interpreter, tiny shapes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".vendor" / "vllm033").exists(), reason="vLLM 0.33 wheel sources not unpacked")
@pytest.mark.parametrize("extra", [[], ["--no-fold", "--sweep", "--sweep-set", "stacked7", "--ladder"]],
                         ids=["grid", "sweep-no-fold"])
def test_bench_quick_writes_results(tmp_path, extra):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONSAFEPATH": "1", "CUDA_VISIBLE_DEVICES": ""}
    tuned = tmp_path / "tuned.json"
    cmd = [sys.executable, str(REPO / "eval" / "bench_gdn_verify.py"), "--quick", "--out", str(tmp_path / "res"),
           "--extracted", str(tmp_path / "vsrc"), "--no-plot", *extra] + (["--write-tuned", str(tuned)] if extra else [])
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    doc = json.loads((tmp_path / "res" / "gdn_verify.json").read_text())
    for key in ("bench", "device", "commit", "date", "command", "rows", "summary"):
        assert key in doc
    assert doc["correctness"]["ours_out_rel_err"] < 1e-5
    assert doc["correctness"]["vllm_out_rel_err"] < 1e-5
    assert doc["correctness"]["ours_fold_out_rel_err"] < 1e-5  # two folded steps vs the sequential reference
    assert doc["correctness"]["ours_fold_ssm_rel_err"] < 1e-5
    assert doc["summary"]["state_bytes_ratio"] > 1
    assert (tmp_path / "res" / "gdn_verify.md").exists()
    if not extra:
        for key in ("ours_us_all", "ours_folded_us_all", "fold_gain_all", "ours_folded_conv_us"):
            assert key in doc["rows"][0]
        return
    # the sweep's code path: every swept config correct, tuned tables keyed by (L, batch), no folded columns
    assert "ours_folded_us_all" not in doc["rows"][0] and "fold_gain_L4_b1" not in doc["summary"]
    parts = {r["part"] for r in doc["sweep"]}
    assert parts == {"verify", "reconstruct"}
    assert all(r.get("out_rel_err", r.get("ssm_rel_err")) < 1e-5 for r in doc["sweep"])
    written = json.loads(tuned.read_text())
    assert set(written["verify_by_len"]) == {"4"} and set(written["reconstruct_by_len"]["4"]) == {"3"}
    # stacked7: a split-Gram and a stacked verify form and the short reconstruction were swept (L = 4); the ladder ran
    # every stage
    assert any("split_gram=True" in r["config"] for r in doc["sweep"] if r["part"] == "verify")
    assert any("stacked=True" in r["config"] for r in doc["sweep"] if r["part"] == "verify")
    assert any("'short': True" in r["config"] for r in doc["sweep"] if r["part"] == "reconstruct")
    assert set(written["reconstruct_short_by_len"]["4"]["3"]) == {"short", "block_v", "num_warps", "early"}
    assert [r["skip"] for r in doc["ladder"]][:2] == [0, 1] and all("us" in r for r in doc["ladder"])


@pytest.mark.skipif(not (REPO / ".vendor" / "vllm033").exists(), reason="vLLM 0.33 wheel sources not unpacked")
def test_bench_quick_16bit_states_write_their_own_results(tmp_path):
    """--ssm-dtype bfloat16 (vLLM's default state dtype; fp16 under the interpreter, which computes bf16 wrongly):
    every state in that dtype, results under gdn_verify_bf16_state.*, never the headline's files."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONSAFEPATH": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "res"
    cmd = [sys.executable, str(REPO / "eval" / "bench_gdn_verify.py"), "--quick", "--out", str(out), "--extracted",
           str(tmp_path / "vsrc"), "--no-plot", "--ssm-dtype", "bfloat16", "--no-fold", "--sweep", "--sweep-set",
           "bf16recon", "--recon-margin", "0.02", "--write-tuned", str(tmp_path / "tuned.json")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert not (out / "gdn_verify.json").exists() and (out / "gdn_verify_bf16_state.md").exists()
    doc = json.loads((out / "gdn_verify_bf16_state.json").read_text())
    assert doc["bench"] == "gdn_verify_bf16_state" and doc["ssm_dtype"] == "float16"
    check = doc["correctness"]
    assert check["within_tolerance"] and check["ours_ssm_rel_err"] < check["tolerance_ssm_rel_err"] == 1e-2
    assert check["vllm_out_rel_err"] < 1e-5  # vLLM's kernel upcasts the 16-bit state it loads, as ours does
    # a 16-bit state halves both sides' state bytes: vLLM's K + 1 slots shrink more than our workspace
    assert 1 < doc["summary"]["state_bytes_ratio"] < 13.651
    assert all(r["part"] != "verify" or "stacked=True" in r["config"] or "hoist=True" in r["config"]
               for r in doc["sweep"])
    recon = {r["config"] for r in doc["sweep"] if r["part"] == "reconstruct"}  # the general form's BV64 x 4 and
    assert "{'block_v': 64, 'num_warps': 4, 'outer_loop': False}" in recon  # the short form timed beside it
    assert any("'short': True" in c for c in recon)


def test_bench_refuses_16bit_sweep_over_the_shipped_tuned_file(tmp_path):
    from hybridspec_kernels.gdn_verify.verify import TUNED_CONFIGS_FILE

    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONSAFEPATH": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, str(REPO / "eval" / "bench_gdn_verify.py"), "--quick", "--out", str(tmp_path),
           "--ssm-dtype", "bfloat16", "--sweep", "--write-tuned", str(TUNED_CONFIGS_FILE)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "fp32-state picks" in run.stderr
    assert not list(tmp_path.iterdir())
