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


def test_write_tuned_keeps_unswept_tables_and_records_provenance(tmp_path, monkeypatch):
    """--write-tuned: the swept lengths replace their entries, every other table and length (and the other state
    dtype's tables) stays as shipped, and each table / length carries one flat {run, commit, command} record: this
    run's for what it swept, the shipped one's otherwise. A bf16-state sweep fills the `_bf16` tables the same way."""
    import dataclasses
    import importlib.util
    import types

    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("HYBRIDSPEC_COMMIT", "abc1234")
    spec = importlib.util.spec_from_file_location("bench_gdn_verify_under_test", REPO / "eval" / "bench_gdn_verify.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = lambda **kw: dataclasses.asdict(bench.VerifyConfig(**kw))  # noqa: E731
    old = lambda name: {"run": f"old {name}", "commit": "0ld", "command": f"old command {name}"}  # noqa: E731
    shipped = {"device": "some GPU", "source": "old", "verify": {"1": cfg(block_v=16)},
               "verify_fold": {"1": cfg(block_v=32)},
               "verify_by_len": {"4": {"1": cfg(block_v=16)}, "16": {"1": cfg(block_v=16)}},
               "reconstruct_by_len": {"4": {"1": {"block_v": 32, "num_warps": 4}},
                                      "16": {"1": {"block_v": 32, "num_warps": 4}}},
               "reconstruct_short_by_len": {"4": {"1": {"short": True, "block_v": 16, "num_warps": 2, "early": False}}},
               "verify_by_len_bf16": {"16": {"1": cfg(block_v=64)}},
               "reconstruct_by_len_bf16": {"16": {"1": {"block_v": 64, "num_warps": 4}}}}
    shipped["provenance"] = {name: old(name) for name in
                             ["verify", "verify_fold", "verify_by_len/4", "verify_by_len/16", "reconstruct_by_len/4",
                              "reconstruct_by_len/16", "reconstruct_short_by_len/4", "verify_by_len_bf16/16",
                              "reconstruct_by_len_bf16/16"]}
    path = tmp_path / "shipped.json"
    path.write_text(json.dumps(shipped))
    monkeypatch.setattr(bench, "TUNED_CONFIGS_FILE", path)

    # fp32 sweep at L 16: new verify and reconstruction picks there; L 4, the fold, bf16 tables kept
    out = tmp_path / "fp32.json"
    args = types.SimpleNamespace(ssm_dtype="float32", command="command fp32", write_tuned=str(out))
    bench.write_tuned(args, "some GPU", torch.float32, [16], {16: {1: bench.VerifyConfig(block_v=128)}}, {},
                      {16: {1: {"block_v": 16, "num_warps": 2, "outer_loop": False}}}, {})
    doc = json.loads(out.read_text())
    assert doc["verify_by_len"]["16"]["1"] == cfg(block_v=128) == doc["verify"]["1"]
    assert doc["verify_by_len"]["4"] == shipped["verify_by_len"]["4"] and doc["verify_fold"] == shipped["verify_fold"]
    assert doc["reconstruct_by_len"]["16"]["1"] == {"block_v": 16, "num_warps": 2}
    assert doc["reconstruct_short_by_len"] == shipped["reconstruct_short_by_len"]
    assert all(doc[k] == shipped[k] for k in ("verify_by_len_bf16", "reconstruct_by_len_bf16"))
    new = {"run": "eval/bench_gdn_verify.py sweep, L=16, ssm state float32", "commit": "abc1234",
           "command": "command fp32"}
    assert doc["provenance"] == {**shipped["provenance"], "verify": new, "verify_by_len/16": new,
                                 "reconstruct_by_len/16": new}
    assert "kept from" not in doc["source"]

    # bf16 sweep at L 17 / 32 over that file: its tables gain those lengths; every fp32 table as it was
    path.write_text(out.read_text())
    out16 = tmp_path / "bf16.json"
    args = types.SimpleNamespace(ssm_dtype="bfloat16", command="command bf16", write_tuned=str(out16))
    picks = {L: {1: bench.VerifyConfig(block_v=32, num_warps=8)} for L in (17, 32)}
    bench.write_tuned(args, "some GPU", torch.bfloat16, [17, 32], picks, {},
                      {L: {1: {"block_v": 32, "num_warps": 4, "outer_loop": False}} for L in (17, 32)}, {})
    doc16 = json.loads(out16.read_text())
    assert {k: v for k, v in doc16.items() if not k.endswith("_bf16") and k != "provenance"} == \
        {k: v for k, v in doc.items() if not k.endswith("_bf16") and k != "provenance"}
    assert set(doc16["verify_by_len_bf16"]) == {"16", "17", "32"}
    assert doc16["verify_by_len_bf16"]["16"] == shipped["verify_by_len_bf16"]["16"]
    assert doc16["reconstruct_by_len_bf16"]["32"] == {"1": {"block_v": 32, "num_warps": 4}}
    new16 = {"run": "eval/bench_gdn_verify.py sweep, L=17,32, ssm state bfloat16", "commit": "abc1234",
             "command": "command bf16"}
    assert doc16["provenance"] == {**doc["provenance"], **{f"{key}_bf16/{L}": new16 for key in
                                                           ("verify_by_len", "reconstruct_by_len") for L in (17, 32)}}
