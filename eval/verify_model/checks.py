"""Correctness of every kernel the verify pass times, on fresh random inputs, before any timing.

Each check returns ‖out - ref‖ / ‖ref‖ against a float32/float64 reference written independently of the
timed kernel. The GDN checks also cross-check ours against the baseline: after `gdn_reconstruct` with n
accepted tokens, ours' committed state must equal the state vLLM's kernel stored after token n.
"""
from __future__ import annotations

import torch
from _cuda_graph import capture_graph  # eval/ is on sys.path: the verify_model package lives there

from . import fused_ops
from .model import GDNLayer, VerifyModel, attention, naive_attention, routed_experts, torch_moe


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_fused_ops(device, dtype, gen) -> dict[str, float]:
    r = {}
    x = torch.randn(37, 2048, device=device, generator=gen).to(dtype)
    res = torch.randn(37, 2048, device=device, generator=gen).to(dtype)
    w = torch.randn(2048, device=device, generator=gen).to(dtype)
    r1, r2 = res.clone(), res.clone()
    r["rmsnorm_residual"] = rel_err(fused_ops.rmsnorm(x, w, 1e-6, r1), fused_ops.rmsnorm(x, w, 1e-6, r2, backend="torch"))
    qkvz = torch.randn(5, 8 * 128 + 40, device=device, generator=gen).to(dtype)
    xg, zg = qkvz[:, :8 * 128].view(5, 8, 128), qkvz[:, 40:40 + 8 * 128].view(5, 8, 128)
    r["gated_rmsnorm"] = rel_err(fused_ops.gated_rmsnorm(xg.contiguous(), zg, w[:128], 1e-6),
                                 fused_ops.gated_rmsnorm(xg.contiguous(), zg, w[:128], 1e-6, backend="torch"))
    B, L, H, D = 3, 5, 4, 256
    qg = torch.randn(B * L, H, 2 * D, device=device, generator=gen).to(dtype)
    cos, sin = (torch.randn(B * L, 32, device=device, generator=gen) for _ in range(2))
    o1, o2 = (torch.empty(B, H, L, D, device=device, dtype=dtype) for _ in range(2))
    fused_ops.head_norm_rope(qg[:, :, :D], w[:D], cos, sin, 1e-6, o1, L)
    fused_ops.head_norm_rope(qg[:, :, :D], w[:D], cos, sin, 1e-6, o2, L, backend="torch")
    r["head_norm_rope"] = rel_err(o1, o2)
    o = torch.randn(B, L, H, D, device=device, generator=gen).to(dtype).transpose(1, 2)
    r["sigmoid_gate"] = rel_err(fused_ops.sigmoid_gate(o, qg[:, :, D:]),
                                fused_ops.sigmoid_gate(o, qg[:, :, D:], backend="torch"))
    r["silu_mul"] = rel_err(fused_ops.silu_mul(x[:, :1024]), fused_ops.silu_mul(x[:, :1024], backend="torch"))
    g = torch.randn(37, 1, device=device, generator=gen).to(dtype)
    r["moe_combine"] = rel_err(fused_ops.moe_combine(x, res, g), fused_ops.moe_combine(x, res, g, backend="torch"))
    parts = fused_ops.split_columns(x, [300, 700, 1000])
    r["split_columns"] = max(rel_err(p, x[:, o:o + n]) for p, o, n in zip(parts, (0, 300, 1000), (300, 700, 1000)))
    return r


def check_gdn(model: VerifyModel, batch: int, length: int, gen, naive) -> dict[str, float]:
    """Baseline (vLLM) and ours core outputs vs the float64 naive recurrence; ours' reconstructed state vs the
    state the baseline stored after the same token. Leaves random states behind (callers re-randomise)."""
    s, dev, dt = model.s, model.device, model.dtype
    layer: GDNLayer = model.gdn_layers[0]
    buf = model.prepare(batch, length, seed=7)
    T = batch * length
    mixed_qkv = torch.randn(T, s.gdn_conv_dim, device=dev, generator=gen).to(dt)
    a = torch.randn(T, s.gdn_v_heads, device=dev, generator=gen).to(dt)
    b = torch.randn(T, s.gdn_v_heads, device=dev, generator=gen).to(dt)
    conv0, ssm0 = layer.conv_state.clone(), layer.ssm_state.clone()
    ref = naive.naive_gdn_verify(mixed_qkv, a, b, layer.conv_w, None, layer.A_log, layer.dt_bias,
                                 layer.conv_state, layer.ssm_state, buf.ours_state_indices, buf.cu_seqlens)
    r = {}
    # vLLM's causal_conv1d_update overwrites its input in place (out=None): give each path its own copy
    out_base = model._gdn_core_baseline(layer, mixed_qkv.clone(), a.clone(), b.clone(), buf)
    r["gdn_baseline_vs_naive"] = rel_err(out_base.cpu(), ref)
    base_states = layer.ssm_state.clone()
    layer.conv_state.copy_(conv0)
    layer.ssm_state.copy_(ssm0)
    out_ours = model._gdn_core_ours(layer, mixed_qkv.clone(), a.clone(), b.clone(), buf, 0)
    r["gdn_ours_vs_naive"] = rel_err(out_ours.cpu(), ref)
    r["gdn_ours_states_changed"] = float(not (torch.equal(layer.ssm_state, ssm0) and
                                              torch.equal(layer.conv_state, conv0)))
    if model.k.ours_gdn is not None:
        n = max(1, length - 1)
        buf.ours_num_accepted.fill_(n)
        model.reconstruct(buf)
        slots_ours = buf.ours_state_indices.long()
        slots_base = buf.spec_state_indices[:, n - 1].long()
        r["gdn_reconstruct_vs_baseline_state"] = rel_err(layer.ssm_state[slots_ours], base_states[slots_base])
    return r


MOE_PATTERNS = ((1, 0.0), (5, 0.3), (4, 1.0), (9, 0.0), (16, 0.0), (16, 1.0), (64, 0.0), (136, 0.95), (544, 0.3))
MOE_TIME_TOKENS = (1, 4, 16, 64, 136, 544)


def _graph_time_us(fn, reps=20) -> float:
    """Median replay time of `fn` captured in a CUDA graph (the sweep times MoE inside graphs too)."""
    graph = capture_graph(fn)
    graph.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in ev)[reps // 2]


def check_moe_option(layer, shape, kernels, gen, patterns=MOE_PATTERNS, time_tokens=MOE_TIME_TOKENS) -> dict:
    """One MoE configuration (kernels.moe_impl / moe_routing, OAI opt-flag constraints set by the caller) against
    the torch reference on routing patterns of the sweep (tokens, rho), incl. fully shared ones and both sides of
    vLLM's switch to moe_align_block_size; CUDA-graph timing of the routed experts at `time_tokens`."""
    from .routing import synthetic_routing
    dev, dt = layer.w1.device, layer.w1.dtype
    errs, times = {}, {}
    for tokens, rho in patterns:
        ids16 = torch.from_numpy(synthetic_routing(1, tokens, 1, shape.num_experts, shape.top_k, rho, seed=tokens)[0]).to(dev)
        ids = ids16.to(torch.int32) if layer.layout == "vllm" else ids16
        x = torch.randn(tokens, shape.hidden, device=dev, generator=gen).to(dt)
        bias = torch.full((tokens, shape.num_experts), float("-inf"), device=dev, dtype=dt).scatter_(1, ids16.long(), 0.0)
        out = routed_experts(x, layer, ids, shape.top_k, kernels, bias)
        ref = torch_moe(x, torch.nn.functional.linear(x, layer.w_router), ids16, layer)
        errs[f"T{tokens}_rho{rho}"] = rel_err(out, ref)
    if dev.type == "cuda":
        for tokens in time_tokens:
            ids16 = torch.from_numpy(synthetic_routing(1, tokens, 1, shape.num_experts, shape.top_k, 0.0,
                                                       seed=tokens)[0]).to(dev)
            ids = ids16.to(torch.int32) if layer.layout == "vllm" else ids16
            x = torch.randn(tokens, shape.hidden, device=dev, generator=gen).to(dt)
            bias = torch.full((tokens, shape.num_experts), float("-inf"), device=dev, dtype=dt).scatter_(1, ids16.long(), 0.0)
            times[f"T{tokens}"] = _graph_time_us(lambda: routed_experts(x, layer, ids, shape.top_k, kernels, bias))
    return {"errs": errs, "max_err": max(v if v == v else float("inf") for v in errs.values()), "graph_us": times}


def check_attention(mode: str, device, dtype, gen, B=2, H=16, KV=2, L=5, S=300, D=256) -> float:
    q = torch.randn(B, H, L, D, device=device, generator=gen).to(dtype)
    k = torch.randn(B, KV, S, D, device=device, generator=gen).to(dtype)
    v = torch.randn(B, KV, S, D, device=device, generator=gen).to(dtype)
    mask = None
    if mode == "efficient_folded":
        G = H // KV
        rows = torch.arange(G * L, device=device) % L
        allowed = torch.arange(S, device=device)[None, :] <= (S - L + rows)[:, None]
        mask = torch.zeros(G * L, S, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return rel_err(attention(q, k, v, mask, mode), naive_attention(q, k, v))


def check_ours_standalone(ours, device, gen) -> dict[str, float]:
    """gdn_verify alone at the real head dims on small random problems, fp32 and bf16 inputs (a diagnostic for
    the kernel's owner when the in-model check fails)."""
    r = {}
    H, HV, K, W, B, L = 16, 32, 128, 4, 2, 5
    D, T = 2 * H * K + HV * K, B * L
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(T, D, device=device, generator=gen).to(dt)
        a = torch.randn(T, HV, device=device, generator=gen).to(dt)
        b = torch.randn(T, HV, device=device, generator=gen).to(dt)
        cw = (torch.randn(D, W, device=device, generator=gen) * 0.5).to(dt)
        A_log = torch.rand(HV, device=device, generator=gen) * 2 - 1
        dtb = torch.rand(HV, device=device, generator=gen) * 2 - 1
        conv = torch.randn(20, 20, D, device=device, generator=gen).to(dt)
        ssm = torch.randn(20, HV, K, K, device=device, generator=gen) * 0.05
        idx = torch.tensor([1, 18], dtype=torch.int32, device=device)
        cu = torch.tensor([0, L, 2 * L], dtype=torch.int32, device=device)
        ws = ours.GDNVerifyWorkspace.allocate(1, 4, 18, H, HV, K, K, input_dtype=dt, device=device)
        out = ours.gdn_verify(x, a, b, cw, None, A_log, dtb, conv, ssm, idx, cu, ws.layer(0), max_seqlen=L)
        ref = ours.naive_gdn_verify(x, a, b, cw, None, A_log, dtb, conv, ssm, idx, cu)
        r[f"ours_standalone_{str(dt).split('.')[-1]}"] = rel_err(out.cpu(), ref)
    return r


def check_moe_align(device, shape, gen) -> dict[str, float]:
    """moe_align.py (vLLM's expert alignment, one Triton launch) vs its host reference: 0.0 = same grouping."""
    from .moe_align import alignment_mismatch, moe_align_block_size, naive_moe_align_block_size
    from .routing import synthetic_routing
    r = {}
    for tokens, rho, block in ((9, 0.0, 16), (136, 0.95, 16), (544, 0.3, 64)):
        ids = torch.from_numpy(synthetic_routing(1, tokens, 1, shape.num_experts, shape.top_k, rho,
                                                 seed=tokens)[0]).to(device=device, dtype=torch.int32)
        out = moe_align_block_size(ids, block, shape.num_experts)
        bad = alignment_mismatch(out, naive_moe_align_block_size(ids, block, shape.num_experts), block)
        r[f"moe_align_T{tokens}_bs{block}"] = 0.0 if bad is None else 1.0
    return r
