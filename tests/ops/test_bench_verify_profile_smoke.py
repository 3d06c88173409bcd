"""CPU pieces of the verify-latency profile (eval/bench_verify_profile.py): the LatencyProfile format, the
synthetic routing model, the fused elementwise kernels (Triton interpreter vs their torch math), vLLM's
expert alignment (moe_align.py) and fused-MoE kernel (extracted from the wheel) vs torch references, and the
whole script end to end in its tiny mode (torch paths, wall clock) and on the Triton kernels (interpreter)."""
import json
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler when a kernel is defined: set the flag before the first import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

EVAL = Path(__file__).resolve().parents[2] / "eval"
sys.path.insert(0, str(EVAL))

import bench_verify_profile as bench  # noqa: E402
from verify_model import fused_ops  # noqa: E402
from verify_model import moe_align  # noqa: E402
from verify_model.routing import synthetic_routing, unique_experts  # noqa: E402

lp = bench.load_latency_profile_module()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = EVAL.parent
HAS_WHEEL_SOURCES = (REPO / ".vendor" / "vllm033").exists() or any((REPO / ".vendor").glob("vllm-0.33.0-*.whl"))
needs_wheel = pytest.mark.skipif(not HAS_WHEEL_SOURCES, reason="vLLM 0.33 wheel (sources) not under .vendor/")


def _profile(**kw):
    d = dict(device="H200", model="m", variant="ours", batch_sizes=[1, 8], lengths=[1, 4, 16],
             t_us=[[100, 130, 220], [150, 200, 400]])
    d.update(kw)
    return lp.LatencyProfile(**d)


def test_latency_profile_roundtrip_and_interpolation(tmp_path):
    p = _profile(per_layer_type={"gdn": [[1, 2, 3], [4, 5, 6]]}, meta={"rho": 0.3})
    p.save(tmp_path / "p.json")
    assert lp.LatencyProfile.load(tmp_path / "p.json") == p
    assert p.interpolate(1, 4) == 130
    assert p.interpolate(1, 10) == pytest.approx(175)               # between L = 4 and 16
    assert p.interpolate(4.5, 1) == pytest.approx(125)              # between batch 1 and 8
    assert p.interpolate(1, 17) == pytest.approx(220 + 90 / 12)     # linear beyond the last length
    lp.save_profiles(tmp_path / "many.json", [p, _profile(variant="baseline")], default_variant="ours")
    assert lp.LatencyProfile.load(tmp_path / "many.json").variant == "ours"
    assert lp.LatencyProfile.load(tmp_path / "many.json", variant="baseline").variant == "baseline"


@pytest.mark.parametrize("bad, match", [
    (dict(t_us=[[1, 2, 3]]), "t_us must be"),
    (dict(lengths=[4, 1, 16]), "strictly increasing"),
    (dict(t_us=[[1, 2, float("nan")], [1, 2, 3]]), "non-finite"),
    (dict(per_layer_type={"ssm": [[1, 2, 3], [4, 5, 6]]}), "unknown layer types"),
    (dict(variant=""), "variant"),
])
def test_latency_profile_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        _profile(**bad)


def test_latency_profile_load_errors(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a latency profile"):
        lp.LatencyProfile.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="batch and L must be positive"):
        _profile().interpolate(0, 4)
    _profile().save(tmp_path / "p.json")
    with pytest.raises(ValueError, match="asked for"):
        lp.LatencyProfile.load(tmp_path / "p.json", variant="baseline")


@pytest.mark.parametrize("batch, length, rho", [(1, 1, 0.0), (3, 7, 0.4), (2, 17, 1.0), (5, 5, 0.95)])
def test_routing_rows_are_sorted_distinct(batch, length, rho):
    ids = synthetic_routing(batch, length, 3, 64, 8, rho, seed=batch)
    assert ids.shape == (3, batch * length, 8) and ids.dtype == np.int16
    rows = ids.reshape(-1, 8)
    assert (np.diff(rows, axis=1) > 0).all() and rows.min() >= 0 and rows.max() < 64


def test_routing_correlation_controls_unique_experts():
    def uniq(rho):
        return unique_experts(synthetic_routing(1, 16, 40, 256, 8, rho, seed=0), 1)["per_batch"]
    u0, u5, u1 = uniq(0.0), uniq(0.5), uniq(1.0)
    assert u1 == 8                       # every token copies the first token's set
    assert u0 > u5 > u1
    one = synthetic_routing(1, 1, 40, 256, 8, 0.0, seed=0)
    assert unique_experts(one, 1)["per_batch"] == 8


def test_routing_rejects_bad_input():
    with pytest.raises(ValueError, match="rho"):
        synthetic_routing(1, 4, 2, 16, 4, 1.5)
    with pytest.raises(ValueError, match="top_k"):
        synthetic_routing(1, 4, 2, 16, 17, 0.5)
    with pytest.raises(ValueError, match="zipf_s"):
        synthetic_routing(1, 4, 2, 16, 4, 0.5, zipf_s=-1)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("T, N", [(1, 64), (7, 100), (33, 2048)])
def test_fused_ops_match_torch(T, N):
    g = torch.Generator().manual_seed(T)
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    x, res = (torch.randn(T, N, generator=g).to(DEVICE, dtype) for _ in range(2))
    w = torch.randn(N, generator=g).to(DEVICE, dtype)
    r1, r2 = res.clone(), res.clone()
    assert _rel(fused_ops.rmsnorm(x, w, 1e-6, r1), fused_ops.rmsnorm(x, w, 1e-6, r2, backend="torch")) < tol
    assert _rel(r1, r2) < tol
    assert _rel(fused_ops.silu_mul(x[:, : N // 2 * 2]), fused_ops.silu_mul(x[:, : N // 2 * 2], backend="torch")) < tol
    gate = torch.randn(T, 1, generator=g).to(DEVICE, dtype)
    assert _rel(fused_ops.moe_combine(x, res, gate), fused_ops.moe_combine(x, res, gate, backend="torch")) < tol
    parts = fused_ops.split_columns(x, [N // 4, N // 4, N // 2])
    assert torch.equal(torch.cat(parts, dim=1), x[:, : N // 4 * 2 + N // 2])


@pytest.mark.parametrize("B, L, H, D, rot", [(1, 1, 2, 32, 8), (2, 5, 4, 64, 16), (3, 3, 16, 256, 64)])
def test_attention_side_ops_match_torch(B, L, H, D, rot):
    g = torch.Generator().manual_seed(L)
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    qg = torch.randn(B * L, H, 2 * D, generator=g).to(DEVICE, dtype)
    w = torch.randn(D, generator=g).to(DEVICE, dtype)
    cos, sin = (torch.randn(B * L, rot // 2, generator=g).to(DEVICE) for _ in range(2))
    o1, o2 = (torch.zeros(B, H, L + 2, D, device=DEVICE, dtype=dtype) for _ in range(2))
    fused_ops.head_norm_rope(qg[:, :, :D], w, cos, sin, 1e-6, o1[:, :, 1:L + 1], L)
    fused_ops.head_norm_rope(qg[:, :, :D], w, cos, sin, 1e-6, o2[:, :, 1:L + 1], L, backend="torch")
    assert _rel(o1, o2) < tol and o1[:, :, 0].abs().sum() == 0 and o1[:, :, L + 1].abs().sum() == 0
    o = torch.randn(B, L, H, D, generator=g).to(DEVICE, dtype).transpose(1, 2)
    assert _rel(fused_ops.sigmoid_gate(o, qg[:, :, D:]), fused_ops.sigmoid_gate(o, qg[:, :, D:], backend="torch")) < tol
    z = qg[:, :, D:]
    xg = qg[:, :, :D].contiguous()
    assert _rel(fused_ops.gated_rmsnorm(xg, z, w, 1e-6), fused_ops.gated_rmsnorm(xg, z, w, 1e-6, backend="torch")) < tol


def test_tiny_bench_end_to_end(tmp_path):
    """The whole script in tiny mode: checks, calibration, sweep, results + profile files, plots."""
    bench.main(["--tiny", "--batches", "1,2", "--lengths", "1,4,16", "--calibrate-iters", "1",
                "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "verify_profile.json").read_text())
    for key in ("bench", "device", "commit", "date", "command", "rows", "summary"):
        assert key in doc
    for key in ("baseline_growth_4_to_16", "ours_growth_4_to_16", "verify_speedup_L16_b1", "calibrated_rho"):
        assert key in doc["summary"]
    assert {r["variant"] for r in doc["rows"]} == {"baseline", "ours", "ours_probe"}
    assert doc["rhos"][0] == doc["summary"]["calibrated_rho"] and {0.0, 0.95} <= set(doc["rhos"])
    assert doc["checks"]["gdn_baseline_vs_naive"] < 1e-4 and doc["checks"]["gdn_ours_vs_naive"] < 1e-4
    profile = lp.LatencyProfile.load(tmp_path / "latency_profile_tiny_cpu.json")
    assert profile.variant == "ours_probe" and profile.batch_sizes == [1, 2] and profile.lengths == [1, 4, 16]
    assert set(profile.per_layer_type) == {"gdn", "attention", "moe", "rest"}
    assert lp.LatencyProfile.load(tmp_path / "verify_profile.json", variant="baseline").variant == "baseline"
    pytest.importorskip("matplotlib")
    bench.plot(tmp_path / "verify_profile.json")
    assert (tmp_path / "verify_profile_T_of_L.png").stat().st_size > 0
    assert (tmp_path / "verify_profile_breakdown.png").stat().st_size > 0


@pytest.mark.parametrize("T, k, E, block", [(1, 4, 16, 16), (3, 4, 16, 4), (7, 8, 256, 16), (37, 8, 256, 16),
                                            (5, 2, 7, 3), (200, 8, 64, 32), (33, 10, 512, 16)])
def test_moe_align_matches_reference(T, k, E, block):
    g = torch.Generator().manual_seed(T * 31 + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int().to(DEVICE)
    out = moe_align.moe_align_block_size(ids, block, E)
    ref = moe_align.naive_moe_align_block_size(ids, block, E)
    assert moe_align.alignment_mismatch(out, ref, block) is None
    # the checker itself notices a wrong grouping
    swapped = out[0].clone()
    used = int(ref[2][0])
    first_expert_end = block * (1 + int((ref[1][:used // block] == ref[1][0]).sum()) - 1)
    if first_expert_end < used:
        swapped[[0, first_expert_end]] = swapped[[first_expert_end, 0]]
        assert moe_align.alignment_mismatch((swapped, out[1], out[2]), ref, block) is not None


def test_moe_align_rejects_bad_input():
    ids = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="int32/int64"):
        moe_align.moe_align_block_size(ids.float(), 16, 4)
    with pytest.raises(ValueError, match="expert_map"):
        moe_align.moe_align_block_size(ids, 16, 4, expert_map=torch.arange(4))
    with pytest.raises(ValueError, match="block_size"):
        moe_align.moe_align_block_size(ids, 0, 4)


@needs_wheel
@pytest.mark.parametrize("T, rho", [(1, 0.0), (3, 1.0), (9, 0.3), (40, 0.0)])
def test_vllm_fused_moe_matches_torch(T, rho):
    """vLLM's fused_moe_kernel + launcher + config rule (extracted) on both expert-assignment paths (one block
    per route at T * top_k * 4 <= E, moe_align_block_size above) vs the torch reference; fp32 on the CPU."""
    from verify_model import kernels_loader as kl
    from verify_model.model import Kernels, MoELayer, routed_experts, torch_moe
    from verify_model.routing import synthetic_routing
    from verify_model.shapes import TINY
    from verify_model.vllm_moe import imposed_topk_weights
    if not (kl.EXTRACTED_DIR / "vllm_extracted" / f"{kl.FUSED_MOE_OUT}.py").exists():
        kl.prepare_sources()
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    shape = TINY
    E = 64 if T == 1 else shape.num_experts       # T = 1: 1 * 4 * 4 <= 64, the one-block-per-route path
    shape = shape.__class__(**{**{f: getattr(shape, f) for f in shape.__dataclass_fields__}, "num_experts": E})
    g = torch.Generator(device=DEVICE).manual_seed(T)
    layer = MoELayer(shape, DEVICE, dtype, g, layout="vllm")
    kernels = Kernels(fused="triton", vllm_moe=kl.load_vllm_moe("lookup"))
    ids = torch.from_numpy(synthetic_routing(1, T, 1, E, shape.top_k, rho, seed=T)[0]).to(DEVICE)
    x = torch.randn(T, shape.hidden, device=DEVICE, generator=g).to(dtype)
    out = routed_experts(x, layer, ids.int(), shape.top_k, kernels)
    ref = torch_moe(x, torch.nn.functional.linear(x, layer.w_router), ids, layer)
    assert _rel(out, ref) < (1e-5 if dtype == torch.float32 else 2e-2)
    logits = torch.randn(T, E, device=DEVICE, generator=g)
    assert _rel(imposed_topk_weights(logits, ids.int()), imposed_topk_weights(logits, ids.int(), backend="torch")) < 1e-6


@needs_wheel
def test_interpreted_bench_end_to_end(tmp_path):
    """The GPU code path on the CPU: MoE probe (child process), checks on the Triton kernels (vLLM GDN + MoE,
    ours), calibration, sweep, the extra-shape section, results and profile files."""
    if DEVICE != "cpu":
        pytest.skip("interpreter run")
    from verify_model import kernels_loader as kl
    if not (kl.EXTRACTED_DIR / "vllm_extracted" / f"{kl.FUSED_MOE_OUT}.py").exists():
        kl.prepare_sources()
    bench.main(["--tiny", "--interpret", "--batches", "1", "--lengths", "4,16", "--calibrate-iters", "1",
                "--moe-options", "vllm_fused_lookup,vllm_fused_tuned", "--extra-shape", "tiny", "--extra-layers", "4",
                "--extra-lengths", "4", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "verify_profile.json").read_text())
    assert doc["checks"]["moe_option"] in ("vllm_fused_lookup", "vllm_fused_tuned")
    assert doc["meta"]["moe"]["impl"] == "vllm"
    bad = {k: v for k, v in doc["checks"].items() if isinstance(v, float) and not k.endswith("states_changed")
           and not v < 1e-4}
    assert not bad
    assert {r["variant"] for r in doc["rows"]} == {"baseline", "ours", "ours_probe"}
    assert {r["L"] for r in doc["extra_shape"]["rows"]} == {4} and not doc["extra_shape"]["checks"] == {}
    for rho in doc["rhos"]:
        assert "baseline_growth_4_to_16" in doc["summary"]["by_rho"][str(rho)]
    profile = lp.LatencyProfile.load(tmp_path / "latency_profile_tiny_cpu.json")
    assert profile.batch_sizes == [1] and profile.lengths == [4, 16]
    assert lp.LatencyProfile.load(tmp_path / "latency_profile_tiny_extra_cpu.json").lengths == [4]
