"""GDN verification per layer: ours (gdn_verify, then one gdn_reconstruct launch for all layers; the fold of
the reconstruction into the next verify beside it) against vLLM 0.33's spec-decode verify path and FLA's
fused_recurrent_gated_delta_rule, at Qwen3-Next's GDN shape.

Every variant runs over a stack of --layers GDN layers, each with its own inputs and states (one layer's states
fit in the 60 MB L2 at batch 1); one whole step (all layers) is captured in a CUDA graph and timed by replay
(median of triton.testing.do_bench); times are per layer.

    ours      (what the vLLM wiring runs) per layer gdn_verify (no state written), then one ssm + conv
              reconstruction launch for all layers, its time shared over the layers
    ours_folded  (measured, not wired: eval/notes/gdn_verify.md) per layer gdn_verify with a GDNFold: the
              previous step's accepted tokens are folded into the committed ssm state (read + written once)
              before verifying; then one conv-only reconstruction launch for all layers. Two steps (workspace
              rows double-buffered, parity 0 and 1) per graph, time halved; fold counts = this pattern's
              accepted counts (the steady state).
    vllm      causal_conv1d_update (spec mode, window of W-1+K rows) + q/k/v split copy (rearrange_mixed_qkv)
              + fused_sigmoid_gating_delta_rule_update writing the fp32 state after every token into L slots;
              from the pinned wheel's Triton sources (eval/_vllm_sources.py). Its CUDA op for K+1 <= 8
              (fused_gdn_decode_post_conv_mtp, a compiled extension) cannot run without vLLM: not measured.
    fla       the same conv + split, then FLA 0.6.0 fused_recurrent_gated_delta_rule (gate, beta sigmoid and q/k
              L2 norm in kernel, [V, K] state) from a dense per-request state, final state only: it keeps no
              per-token state, so it cannot serve partial acceptance - a lower bound on a recurrent kernel.
Accept patterns: all (every draft accepted, n = L) and random (n uniform in 1..L, same draws for every variant).
State dtype (--ssm-dtype): float32 is the headline (the issue's benchmark, vLLM's --mamba-ssm-cache-dtype float32:
eval/results/gdn_verify.*); bfloat16 is what `vllm serve` runs by default (mamba_ssm_cache_dtype "auto" = the model's
bf16) and writes eval/results/gdn_verify_bf16_state.*: every ssm state (ours, vLLM's, FLA's initial one) in that dtype.

GPU (one call):   here  python eval/_vllm_sources.py .vendor/extracted     (carry .vendor/extracted and .whl)
                  there python eval/bench_gdn_verify.py --out $OUT [--sweep]
CPU smoke:        python eval/bench_gdn_verify.py --quick --out /tmp/gdn_quick   (interpreter, tiny shapes)
"""
import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

T_START = time.time()
ON_GPU = torch.cuda.is_available()
if not ON_GPU:  # Triton picks interpreter or compiler when kernels are defined: before any triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

EVAL = Path(__file__).resolve().parent
sys.path.insert(0, str(EVAL))
from _cuda_graph import call_ms  # noqa: E402
from _results import write_results  # noqa: E402
from _vllm_sources import GDN_VERIFY_MODULES, extract, fix_interpreter_masks  # noqa: E402

from hybridspec_kernels.gdn_verify.reconstruct import FALLBACK_RECONSTRUCT as FALLBACK_RECON  # noqa: E402
from hybridspec_kernels.gdn_verify.reconstruct_short import (  # noqa: E402
    RANK1_MAX_LEN, SHORT_MAX_LEN, gdn_reconstruct_short)
from hybridspec_kernels.gdn_verify.verify import TUNED_CONFIGS_FILE, nearest_tuned  # noqa: E402
from hybridspec_kernels.gdn_verify import (  # noqa: E402
    GDNFold,
    GDNStateTable,
    GDNVerifyWorkspace,
    VerifyConfig,
    default_reconstruct_config,
    default_verify_config,
    gdn_reconstruct,
    write_tuned_verify_configs,
    gdn_verify,
    naive_gdn_reconstruct,
    naive_gdn_verify,
)

BENCH = "gdn_verify"
QWEN3_NEXT_GDN = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, width=4)
TINY_GDN = dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, width=4)
HBM_BYTES_PER_S = 4.3e12  # measured device-to-device copy on the lent H200 (anchors.md)
VLLM_NUM_SPEC_FOR_STATE_RATIO = 15  # DFlash b16: K = 15 drafts, K + 1 state slots
SSM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# ssm state relative error vs float64 under which a reconstruction counts as correct: fp32 states carry tf32 product
# noise (~3e-5 measured); a bf16 state is rounded once more when stored (unit roundoff 2^-8: ~1.5e-3 rms relative)
STATE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}
OUT_TOLERANCE = 1e-2  # bf16 outputs (rounded to 2^-8) vs float64, either state dtype
SSM_DTYPE_NOTES = {
    "float32": "fp32 ssm states: the issue's benchmark and the headline (vLLM with --mamba-ssm-cache-dtype float32)",
    "bfloat16": "bf16 ssm states: what `vllm serve` runs by default for a bf16 Qwen3-Next / Qwen3.5 model "
                "(mamba_ssm_cache_dtype auto = the model dtype); not the headline (eval/results/gdn_verify.*, fp32)",
    "float16": "fp16 ssm states: the CPU smoke's stand-in for bf16 (the Triton interpreter computes bf16 wrongly)",
}


BF16_TUNED_KEYS = ("verify_by_len", "reconstruct_by_len", "reconstruct_short_by_len")


def with_bf16_tables(shipped, swept):
    """The shipped tuned doc (fp32-state picks) with a bf16-state sweep's per-length tables beside its own, as
    `<key>_bf16` (what the launch code reads for bf16 states), and their provenance records as `<key>_bf16/<L>`: a
    drop-in for tuned_verify_configs.json."""
    if shipped.get("device") != swept.get("device"):
        raise ValueError(f"the bf16-state sweep ran on {swept.get('device')!r}, the shipped picks on "
                         f"{shipped.get('device')!r}")
    doc = {k: v for k, v in shipped.items() if not k.endswith("_bf16")}
    doc.update({f"{key}_bf16": swept[key] for key in BF16_TUNED_KEYS if key in swept})
    provenance = {k: v for k, v in shipped.get("provenance", {}).items() if not k.split("/")[0].endswith("_bf16")}
    for name, run in swept.get("provenance", {}).items():
        key, _, length = name.partition("/")
        if key in BF16_TUNED_KEYS:
            provenance[f"{key}_bf16/{length}"] = run
    doc["provenance"] = provenance
    return doc


def bench_name(ssm_dtype):
    """Results file stem: the fp32-state headline, or the bf16-state run beside it (never over the headline)."""
    return BENCH if ssm_dtype == torch.float32 else f"{BENCH}_bf16_state"


# ---------------------------------------------------------------------------------------------------------------
# Problem setup

def make_stack(gdn, seqlen, batch, num_layers, device, seed, vllm=True, fla=True, ssm_dtype=torch.float32):
    """Per-layer inputs and states for `num_layers` layers; weights shared (they are tiny), states not; every ssm
    state (ours, vLLM's slots, FLA's initial one) in `ssm_dtype`."""
    torch.manual_seed(seed)
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    D = 2 * H * K + HV * V
    T = seqlen * batch
    act = torch.bfloat16 if ON_GPU else torch.float32
    s = dict(gdn=gdn, L=seqlen, B=batch, T=T, D=D, num_layers=num_layers)
    s["x"] = torch.randn(num_layers, T, D, device=device).to(act)
    s["a"] = torch.randn(num_layers, T, HV, device=device).to(act)
    s["b"] = torch.randn(num_layers, T, HV, device=device).to(act)
    s["conv_weight"] = (torch.randn(D, W, device=device) * 0.5).to(act)
    s["A_log"] = torch.rand(HV, device=device) * 2 - 1
    s["dt_bias"] = torch.randn(HV, device=device)
    s["cu"] = torch.arange(0, T + 1, seqlen, dtype=torch.int32, device=device)
    # ours: slot 0 is the null block, request i owns slot i + 1
    s["slots"] = torch.arange(1, batch + 1, dtype=torch.int32, device=device)
    # drawn in their own dtype: vLLM's slots at L16 b64 are 32 GB in bf16, and an fp32 draw first would add 64 GB
    s["ssm"] = torch.randn(num_layers, batch + 1, HV, V, K, device=device, dtype=ssm_dtype).mul_(0.1)
    s["conv"] = torch.randn(num_layers, batch + 1, W - 1, D, device=device).to(act)
    # 2 x batch rows: the folded step double-buffers (rows r + parity * batch); zeros so the first fold is a no-op
    s["ws"] = GDNVerifyWorkspace.allocate(num_layers, 2 * batch, seqlen, H, HV, K, V, act, device)
    for t in (s["ws"].u, s["ws"].k, s["ws"].g, s["ws"].x):
        t.zero_()
    s["rows"] = [torch.arange(batch, dtype=torch.int32, device=device) + parity * batch for parity in (0, 1)]
    s["table"] = GDNStateTable(list(s["ssm"]), list(s["conv"]), W)
    s["out"] = torch.empty(num_layers, T, HV, V, dtype=act, device=device)
    if vllm:  # vLLM: L = K + 1 slots per request; the conv window has W - 1 + K rows and lives in column 0's block
        s["v_slots"] = torch.arange(1, batch * seqlen + 1, dtype=torch.int32, device=device).view(batch, seqlen)
        s["v_ssm"] = torch.randn(num_layers, batch * seqlen + 1, HV, V, K, device=device, dtype=ssm_dtype).mul_(0.1)
        s["v_conv"] = torch.randn(num_layers, batch * seqlen + 1, W - 1 + seqlen - 1, D, device=device).to(act)
        s["v_conv_out"] = torch.empty(T, D, dtype=act, device=device)
    if fla:
        s["f_state"] = torch.randn(num_layers, batch, HV, V, K, device=device, dtype=ssm_dtype).mul_(0.1)
    return s


def accept_counts(seqlen, batch, pattern, device, seed=1):
    if pattern == "all":
        return torch.full((batch,), seqlen, dtype=torch.int32, device=device)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, seqlen + 1, (batch,), generator=gen, dtype=torch.int32).to(device)


# ---------------------------------------------------------------------------------------------------------------
# One step of each variant over all layers

def default_recon(s):
    return dict(default_reconstruct_config(s["B"], s["L"], num_v_heads=s["gdn"]["num_v_heads"]), outer_loop=False)


def reconstruct_all(s, num_accepted, recon):
    """One reconstruction launch for all layers: recon None = the library's default path (tuned launch, the short
    form where the shipped tuned file claims it: what the wiring runs); {"short": True, ...} = the short form; else
    the general kernel with these launch arguments."""
    args = (s["table"], s["ws"], s["slots"], num_accepted, s["cu"])
    if recon is None:
        gdn_reconstruct(*args)
    elif recon.get("short"):
        gdn_reconstruct_short(*args, block_v=recon["block_v"], num_warps=recon["num_warps"],
                              early=recon.get("early", False))
    else:
        gdn_reconstruct(*args, **recon)


def is_short(recon):
    """A reconstruction launch of the short form (tuned at max_seqlen <= 4; up to RANK1_MAX_LEN as its rank-1 loop,
    timed in a sweep but not written to the tuned file)."""
    return bool(recon.get("short"))


def ours_step(s, num_accepted, verify=True, reconstruct=True, config=None, recon=None):
    config = config or default_verify_config(s["B"], max_seqlen=s["L"], num_v_heads=s["gdn"]["num_v_heads"])

    def run():
        if verify:
            for layer in range(s["num_layers"]):
                gdn_verify(s["x"][layer], s["a"][layer], s["b"][layer], s["conv_weight"], None, s["A_log"],
                           s["dt_bias"], s["conv"][layer], s["ssm"][layer], s["slots"], s["cu"],
                           s["ws"].layer(layer), max_seqlen=s["L"], out=s["out"][layer], config=config)
        if reconstruct:
            reconstruct_all(s, num_accepted, recon)
    return run


def ours_fold_step(s, num_accepted, verify=True, conv=True, config=None):
    """Two folded steps (parity 0 then 1): each verifies every layer with a GDNFold of the other parity's rows
    (counts = num_accepted, the previous step's), then advances the conv windows in one conv-only launch."""
    config = config or default_verify_config(s["B"], folded=True, num_v_heads=s["gdn"]["num_v_heads"])

    def run():
        for parity in (0, 1):
            rows, prev_rows = s["rows"][parity], s["rows"][1 - parity]
            if verify:
                for layer in range(s["num_layers"]):
                    ws = s["ws"].layer(layer)
                    gdn_verify(s["x"][layer], s["a"][layer], s["b"][layer], s["conv_weight"], None, s["A_log"],
                               s["dt_bias"], s["conv"][layer], s["ssm"][layer], s["slots"], s["cu"], ws,
                               max_seqlen=s["L"], out=s["out"][layer], config=config, workspace_rows=rows,
                               fold=GDNFold(ws, prev_rows, num_accepted))
            if conv:
                gdn_reconstruct(s["table"], s["ws"], s["slots"], num_accepted, s["cu"], parts="conv",
                                workspace_rows=rows)
    return run


def vllm_split(mixed, gdn):
    """vLLM's rearrange_mixed_qkv: one copy into contiguous q, k, v."""
    key_dim = gdn["num_k_heads"] * gdn["head_k_dim"]
    T = mixed.shape[0]
    q, k, v = torch.split(mixed, [key_dim, key_dim, mixed.shape[1] - 2 * key_dim], dim=-1)
    fused = torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)])
    return (fused[: T * key_dim].view(1, T, -1, gdn["head_k_dim"]),
            fused[T * key_dim : 2 * T * key_dim].view(1, T, -1, gdn["head_k_dim"]),
            fused[2 * T * key_dim :].view(1, T, -1, gdn["head_v_dim"]))


def vllm_step(s, num_accepted, vk):
    causal_conv1d_update, fused_gating = vk

    def run():
        for layer in range(s["num_layers"]):
            mixed = causal_conv1d_update(
                s["x"][layer], s["v_conv"][layer].transpose(-1, -2), s["conv_weight"], None, "silu",
                conv_state_indices=s["v_slots"][:, 0], num_accepted_tokens=num_accepted, query_start_loc=s["cu"],
                max_query_len=s["L"], out=s["v_conv_out"],
            )
            q, k, v = vllm_split(mixed, s["gdn"])
            fused_gating(A_log=s["A_log"], a=s["a"][layer], b=s["b"][layer], dt_bias=s["dt_bias"], q=q, k=k, v=v,
                         initial_state=s["v_ssm"][layer], inplace_final_state=True, cu_seqlens=s["cu"],
                         ssm_state_indices=s["v_slots"], num_accepted_tokens=num_accepted,
                         use_qk_l2norm_in_kernel=True)
    return run


def fla_step(s, vk, fla_fn):
    causal_conv1d_update = vk[0]
    cu_long = s["cu"].long()
    ones = torch.ones(s["B"], dtype=torch.int32, device=s["cu"].device)

    def run():
        for layer in range(s["num_layers"]):
            mixed = causal_conv1d_update(
                s["x"][layer], s["v_conv"][layer].transpose(-1, -2), s["conv_weight"], None, "silu",
                conv_state_indices=s["v_slots"][:, 0], num_accepted_tokens=ones, query_start_loc=s["cu"],
                max_query_len=s["L"], out=s["v_conv_out"],
            )
            q, k, v = vllm_split(mixed, s["gdn"])
            fla_fn(q, k, v, g=s["a"][layer][None], beta=s["b"][layer][None], initial_state=s["f_state"][layer],
                   output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                   A_log=s["A_log"], dt_bias=s["dt_bias"], use_beta_sigmoid_in_kernel=True, state_v_first=True,
                   cu_seqlens=cu_long)
    return run


# ---------------------------------------------------------------------------------------------------------------
# Timing, bytes

def time_step(fn, rep_ms):
    """Milliseconds of one call: CUDA graph replay median on GPU, one wall-clock run on CPU."""
    return call_ms(fn, rep_ms, warmup_calls=2)


def per_layer_us(fn, rep_ms, num_layers, steps=1):
    return time_step(fn, rep_ms) * 1e3 / (num_layers * steps)


def state_bytes(gdn, state_dtype_bytes=4, conv_dtype_bytes=2):
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    D = 2 * H * K + HV * V
    return HV * V * K * state_dtype_bytes, D, D * conv_dtype_bytes


def bytes_ours(gdn, L, B, n_total, act_bytes=2, folded=True, state_dtype_bytes=4):
    """Fewest bytes ours moves per layer per step (each tensor read or written once). Unfolded: verify reads the
    state, reconstruction reads and writes it again. Folded: verify reads it, writes it (all requests have pending
    tokens in the steady state) and reads the previous step's u / k / G; reconstruction moves conv windows only."""
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    ssm, D, _ = state_bytes(gdn, state_dtype_bytes)
    T = L * B
    ws_tok = HV * V * 4 + H * K * 4 + HV * 4  # u, k, G per token (x counted apart)
    verify = B * ssm + B * (W - 1) * D * act_bytes + T * D * act_bytes + T * 2 * HV * act_bytes \
        + T * HV * V * act_bytes + T * (ws_tok + D * act_bytes)
    conv = 2 * B * (W - 1) * D * act_bytes + B * (W - 1) * D * act_bytes
    if folded:
        return verify + B * ssm + n_total * ws_tok, conv
    return verify, 2 * B * ssm + n_total * ws_tok + conv


def bytes_vllm(gdn, L, B, act_bytes=2, state_dtype_bytes=4):
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    ssm, D, _ = state_bytes(gdn, state_dtype_bytes)
    T = L * B
    rows = W - 1 + L - 1
    conv = B * rows * D * act_bytes * 2 + T * D * act_bytes * 2  # window read+write, x read, conv out write
    split = 2 * T * D * act_bytes
    core = T * D * act_bytes + T * 2 * HV * act_bytes + B * ssm + T * ssm + T * HV * V * act_bytes
    return conv + split + core


def state_bytes_per_request(gdn, ws_bytes, num_spec=VLLM_NUM_SPEC_FOR_STATE_RATIO, workspace_copies=1,
                            state_dtype_bytes=4):
    """Per layer: vLLM keeps K+1 blocks, each with an ssm state and a conv window of W-1+K rows; ours one ssm
    state, a W-1 row window and the compact workspace for K+1 tokens (twice if the reconstruction were folded
    into the next verify: the previous step's rows must stay until it has folded them)."""
    ssm, D, conv_row = state_bytes(gdn, state_dtype_bytes)
    W = gdn["width"]
    vllm = (num_spec + 1) * (ssm + (W - 1 + num_spec) * conv_row)
    ours = ssm + (W - 1) * conv_row + workspace_copies * ws_bytes
    return vllm, ours


# ---------------------------------------------------------------------------------------------------------------
# Correctness at the benchmark shape

def rel_err(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    if torch.isnan(x).any():
        return float("nan")
    return ((x - ref).norm() / ref.norm()).item()


MIXED_LENS = [17, 4, 1, 16, 9, 12]
SHORT_LENS = [4, 2, 1, 4, 3, 1]  # the same problem for the short forms (max_seqlen <= 4); request 2 on slot 0


def mixed_length_problem(gdn, device, seed, lens=MIXED_LENS, ssm_dtype=torch.float32):
    """The correctness problem of the GPU checks: lengths 1..17 in one batch, one request on the null slot 0,
    bf16 inputs on the GPU (fp32 under the interpreter) and an `ssm_dtype` state (the float64 references start from
    its values). Returns (gdn_verify kwargs, lens, act)."""
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    D = 2 * H * K + HV * V
    B, T = len(lens), sum(lens)
    act = torch.bfloat16 if ON_GPU else torch.float32
    torch.manual_seed(seed)
    p = dict(
        mixed_qkv=torch.randn(T, D, device=device).to(act), a=torch.randn(T, HV, device=device).to(act),
        b=torch.randn(T, HV, device=device).to(act), conv_weight=(torch.randn(D, W, device=device) * 0.5).to(act),
        conv_bias=None, A_log=torch.rand(HV, device=device) * 2 - 1, dt_bias=torch.randn(HV, device=device),
        conv_state=torch.randn(B + 2, W - 1, D, device=device).to(act),
        ssm_state=(torch.randn(B + 2, HV, V, K, device=device) * 0.1).to(ssm_dtype),
        state_indices=torch.tensor([3, 1, 0, 2, 7, 5], dtype=torch.int32, device=device),
        cu_seqlens=torch.tensor([0] + [sum(lens[: i + 1]) for i in range(B)], dtype=torch.int32, device=device),
    )
    return p, lens, act


_FOLD_REFERENCES = {}


def _fold_problem(gdn, device, seed, ssm_dtype=torch.float32):
    """The two-step problem of `fold_errors` and its float64 references (computed once per seed: the naive
    replay at the real shape takes seconds)."""
    key = (tuple(sorted(gdn.items())), str(device), seed, ssm_dtype)
    if key not in _FOLD_REFERENCES:
        HV = gdn["num_v_heads"]
        p1, lens1, act = mixed_length_problem(gdn, device, seed=seed, ssm_dtype=ssm_dtype)
        B = len(lens1)
        order, lens2 = [4, 0, 2, 5, 1, 3], [16, 3, 5, 1, 0, 17]
        counts1 = torch.tensor([11, 4, 1, 16, 0, 12], dtype=torch.int32)
        counts2 = torch.tensor([16, 2, 5, 1, 0, 9], dtype=torch.int32)
        torch.manual_seed(seed + 1)
        T2 = sum(lens2)
        p2 = {**p1, "mixed_qkv": torch.randn(T2, p1["mixed_qkv"].shape[1], device=device).to(act),
              "a": torch.randn(T2, HV, device=device).to(act), "b": torch.randn(T2, HV, device=device).to(act),
              "state_indices": p1["state_indices"][order].contiguous(),
              "cu_seqlens": torch.tensor([0] + [sum(lens2[: i + 1]) for i in range(B)], dtype=torch.int32,
                                         device=device)}
        cpu = lambda p: {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in p.items()}  # noqa: E731
        ref1 = {**cpu(p1), "ssm_state": p1["ssm_state"].cpu().double(),
                "conv_state": p1["conv_state"].cpu().double()}
        naive_gdn_reconstruct(**ref1, num_accepted=counts1)
        ref2 = {**cpu(p2), "ssm_state": ref1["ssm_state"], "conv_state": ref1["conv_state"]}
        ref_out2 = naive_gdn_verify(**ref2)
        naive_gdn_reconstruct(**ref2, num_accepted=counts2)
        _FOLD_REFERENCES[key] = (p1, p2, lens1, lens2, order, counts1, counts2, act,
                                 (ref_out2, ref2["ssm_state"], ref2["conv_state"]))
    return _FOLD_REFERENCES[key]


def fold_errors(gdn, device, config=None, seed=77, ssm_dtype=torch.float32):
    """Two folded steps as the wiring runs them (verify 1, conv-only reconstruct, verify 2 folding step 1's ssm
    update, conv + ssm reconstruct of step 2) on the mixed-length problem, step 2 in another batch order with
    other lengths (one request with none), rows scattered over a 2x workspace; errors vs float64 token by token."""
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    p1, p2, lens1, lens2, order, counts1, counts2, act, (ref_out2, ref_ssm, ref_conv) = _fold_problem(
        gdn, device, seed, ssm_dtype)
    ssm, conv = p1["ssm_state"].clone(), p1["conv_state"].clone()  # the run's own copies of the states
    p1, p2 = {**p1, "ssm_state": ssm, "conv_state": conv}, {**p2, "ssm_state": ssm, "conv_state": conv}
    B, T2 = len(lens1), sum(lens2)
    rows = torch.randperm(2 * B, generator=torch.Generator().manual_seed(seed)).to(torch.int32).to(device)
    rows1, rows2 = rows[:B], rows[B:]
    ws = GDNVerifyWorkspace.allocate(1, 2 * B, 32, H, HV, K, V, act, device)
    table = GDNStateTable([ssm], [conv], W)
    c1, c2 = counts1.to(device), counts2.to(device)
    nothing_pending = GDNFold(ws.layer(0), rows2, torch.zeros(B, dtype=torch.int32, device=device))
    gdn_verify(**p1, workspace=ws.layer(0), max_seqlen=max(lens1), workspace_rows=rows1, fold=nothing_pending,
               config=config)  # the wiring's first step after prefill: a fold with counts 0 (same kernel build)
    gdn_reconstruct(table, ws, p1["state_indices"], c1, p1["cu_seqlens"], parts="conv", workspace_rows=rows1)
    out2 = torch.full((T2, HV, V), float("nan"), dtype=act, device=device)
    fold = GDNFold(ws.layer(0), rows1[order].contiguous(), c1[order].contiguous())
    gdn_verify(**p2, workspace=ws.layer(0), max_seqlen=max(lens2), out=out2, workspace_rows=rows2, fold=fold,
               config=config)
    gdn_reconstruct(table, ws, p2["state_indices"], c2, p2["cu_seqlens"], parts="conv", workspace_rows=rows2)
    gdn_reconstruct(table, ws, p2["state_indices"], c2, p2["cu_seqlens"], parts="ssm", workspace_rows=rows2)
    return dict(fold_out_rel_err=rel_err(out2, ref_out2), fold_ssm_rel_err=rel_err(ssm, ref_ssm),
                fold_conv_rel_err=rel_err(conv, ref_conv))


def check_correctness(gdn, device, vk, ssm_dtype=torch.float32):
    """Mixed lengths (1..17), one null-slot request, every variant against the float64 reference (started from the
    same `ssm_dtype` state values); the tolerances used for this state dtype are recorded beside the errors."""
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    D = 2 * H * K + HV * V
    p, lens, act = mixed_length_problem(gdn, device, seed=123, ssm_dtype=ssm_dtype)
    B, T = len(lens), sum(lens)
    cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in p.items()}
    ref = naive_gdn_verify(**cpu)
    ws = GDNVerifyWorkspace.allocate(1, B, 32, H, HV, K, V, act, device)
    ssm0, conv0 = p["ssm_state"].clone(), p["conv_state"].clone()
    poison = torch.full((T, HV, V), float("nan"), dtype=act, device=device)
    out = gdn_verify(**p, workspace=ws.layer(0), max_seqlen=max(lens), out=poison)
    untouched = torch.equal(p["ssm_state"], ssm0) and torch.equal(p["conv_state"], conv0)
    num_accepted = torch.tensor([9, 4, 1, 16, 1, 12], dtype=torch.int32)
    gdn_reconstruct(GDNStateTable([p["ssm_state"]], [p["conv_state"]], W), ws, p["state_indices"],
                    num_accepted.to(device), p["cu_seqlens"])
    ref_states = {**cpu, "ssm_state": ssm0.cpu().double(), "conv_state": conv0.cpu().double()}
    naive_gdn_reconstruct(**ref_states, num_accepted=num_accepted)
    result = {
        "lens": lens, "dtype": str(act).replace("torch.", ""), "ssm_dtype": str(ssm_dtype).replace("torch.", ""),
        "tolerance_out_rel_err": OUT_TOLERANCE, "tolerance_ssm_rel_err": STATE_TOLERANCE[ssm_dtype],
        "ours_out_rel_err": rel_err(out, ref),
        "ours_ssm_rel_err": rel_err(p["ssm_state"], ref_states["ssm_state"]),
        "ours_conv_rel_err": rel_err(p["conv_state"], ref_states["conv_state"]),
        "verify_left_states_untouched": untouched,
    }
    result.update({f"ours_{k}": v for k, v in fold_errors(gdn, device, ssm_dtype=ssm_dtype).items()})
    if vk is not None:  # vLLM from one slot column per request, uniform length needed for its conv max_query_len
        causal_conv1d_update, fused_gating = vk
        num_spec = max(lens) - 1
        v_slots = torch.zeros(B, num_spec + 1, dtype=torch.int32, device=device)
        v_slots[:, 0] = p["state_indices"]
        v_slots[:, 1:] = torch.arange(B * num_spec, dtype=torch.int32, device=device).view(B, num_spec) + B + 2
        v_ssm = torch.zeros(B * (num_spec + 1) + 2, HV, V, K, dtype=ssm_dtype, device=device)
        v_ssm[: B + 2] = ssm0
        v_conv = torch.zeros(v_ssm.shape[0], W - 1 + num_spec, D, dtype=act, device=device)
        v_conv[: B + 2, : W - 1] = conv0
        ones = torch.ones(B, dtype=torch.int32, device=device)
        mixed = causal_conv1d_update(p["mixed_qkv"].clone(), v_conv.transpose(-1, -2), p["conv_weight"], None,
                                     "silu", conv_state_indices=v_slots[:, 0], num_accepted_tokens=ones,
                                     query_start_loc=p["cu_seqlens"], max_query_len=num_spec + 1)
        q, k, v = vllm_split(mixed, gdn)
        v_out, _ = fused_gating(A_log=p["A_log"], a=p["a"], b=p["b"], dt_bias=p["dt_bias"], q=q, k=k, v=v,
                                initial_state=v_ssm, inplace_final_state=True, cu_seqlens=p["cu_seqlens"],
                                ssm_state_indices=v_slots, num_accepted_tokens=ones, use_qk_l2norm_in_kernel=True)
        live = torch.cat([torch.arange(int(p["cu_seqlens"][i]), int(p["cu_seqlens"][i + 1]))
                          for i in range(B) if int(p["state_indices"][i]) > 0])
        result["vllm_out_rel_err"] = rel_err(v_out[0][live], ref[live])
        result["ours_vs_vllm_out_rel_err"] = rel_err(out[live], v_out[0][live].double())
    fold_ssm = result.get("ours_fold_ssm_rel_err", 0.0)
    result["within_tolerance"] = bool(
        max(result["ours_out_rel_err"], result.get("ours_fold_out_rel_err", 0.0)) < OUT_TOLERANCE
        and max(result["ours_ssm_rel_err"], fold_ssm) < STATE_TOLERANCE[ssm_dtype]
        and result["ours_conv_rel_err"] == 0 and result.get("ours_fold_conv_rel_err", 0) == 0)
    return result


# ---------------------------------------------------------------------------------------------------------------

def load_vllm_kernels(extracted):
    if not (Path(extracted) / "vllm_extracted").exists():
        extract(GDN_VERIFY_MODULES, extracted)  # needs the unpacked wheel (.vendor/vllm033) here
    sys.path.insert(0, str(extracted))
    conv = importlib.import_module("vllm_extracted.model_executor.layers.mamba.ops.causal_conv1d")
    gating = importlib.import_module("vllm_extracted.third_party.flash_linear_attention.ops.fused_sigmoid_gating")
    return conv.causal_conv1d_update, gating.fused_sigmoid_gating_delta_rule_update


def load_fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule, None
    except Exception as exc:  # reported in the results, not fatal
        return None, f"{type(exc).__name__}: {exc}"


SWEEP_VERIFY = [
    VerifyConfig(block_v=32),
    VerifyConfig(block_v=16),
    VerifyConfig(block_v=32, group_heads=True),
    VerifyConfig(block_v=32, whole_v=True),
    VerifyConfig(block_v=32, whole_v=True, group_heads=True),
    VerifyConfig(block_v=32, whole_v=True, group_heads=True, num_warps=8),
    VerifyConfig(block_v=64, whole_v=True, group_heads=True, num_warps=8),
    VerifyConfig(block_v=32, big_dot="tf32x3"),
]  # the v3 forms (transposed / fuse_qk / prefetch / state_as_a) were removed after losing every sweep (notes)
# --sweep-set v4: the v2 winners (reference) and the v4 forms; only state_dot="fp32" configs can become defaults
_LF = dict(loads_first=True)
SWEEP_VERIFY_V4 = [
    VerifyConfig(block_v=32), VerifyConfig(block_v=32, whole_v=True),
    VerifyConfig(block_v=32, hoist=True, **_LF), VerifyConfig(block_v=32, hoist=True, num_warps=8, **_LF),
    VerifyConfig(block_v=32, hoist=True, num_warps=8, state_dot="bf16", **_LF),
    VerifyConfig(block_v=16, hoist=True, **_LF),
    VerifyConfig(block_v=32, two_pass=True, **_LF), VerifyConfig(block_v=32, two_pass=True, prep_warps=8, **_LF),
    VerifyConfig(block_v=64, two_pass=True, num_warps=8, **_LF),
    VerifyConfig(block_v=32, two_pass=True, state_dot="bf16", **_LF),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, **_LF),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, state_dot="bf16", **_LF),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, **_LF),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, state_dot="bf16", **_LF),
]
# --sweep-set v5: the current winners (v2 per-head b1, v2 whole-V b8, two-pass whole-V rolled loads_first b32/b64)
# against the v5 weight_tiles forms (never timed before) and the rolled forms without loads_first
SWEEP_VERIFY_V5 = [
    VerifyConfig(block_v=32), VerifyConfig(block_v=32, whole_v=True),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, **_LF),
    VerifyConfig(block_v=32, num_warps=8),
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True), VerifyConfig(block_v=32, hoist=True, weight_tiles=True,
                                                                          num_warps=8),
    VerifyConfig(block_v=32, weight_tiles=True), VerifyConfig(block_v=32, weight_tiles=True, num_warps=8),
    VerifyConfig(block_v=32, two_pass=True, weight_tiles=True),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, weight_tiles=True),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, weight_tiles=True),
]
# --sweep-set fold (session 3): the tuned winners and their near rivals, each timed without and with a fold
SWEEP_VERIFY_FOLD = [
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True, num_warps=8),  # b1 winner (v5)
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True),
    VerifyConfig(block_v=32),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2),  # b8 winner (v5)
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, weight_tiles=True),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),  # b32 / b64 winner (v5)
    VerifyConfig(block_v=32, two_pass=True, weight_tiles=True),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=1),  # fold: 51 vs 79 KB shared (triton 3.6)
]
# --sweep-set short (session 3, G4): the tuned winners and their rivals, timed at every --sweep-lens length (the
# earlier sweeps ran at L = 16 only and applied the winner per batch to every L); hoisted BV 16 is new at batch 1
# (256 programs per layer instead of 128, half the state product per program; triton 3.6 sm_90: 48 B stack)
SWEEP_VERIFY_SHORT = [
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True, num_warps=8),  # b1 winner (v5, final3)
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True),
    VerifyConfig(block_v=16, hoist=True, weight_tiles=True, num_warps=8),  # 4 warps: 200 B stack (triton 3.6)
    VerifyConfig(block_v=32),  # v2 per-head: the no-tuned-file fallback below batch 8
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2),  # b8 winner
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),  # b32 / b64 winner
    VerifyConfig(block_v=32, two_pass=True, weight_tiles=True),
]
# --sweep-set short4 (session 4): the short set with the short reconstruction's launches (SWEEP_RECON_SHORT4).
# (It also timed the 4-row FMA verify form, VerifyConfig(short=True): 1.5-2.8x slower, removed; see the notes.)
_B1 = dict(block_v=32, hoist=True, weight_tiles=True, num_warps=8)  # the b1 winner
SWEEP_VERIFY_SHORT4 = SWEEP_VERIFY_SHORT
# --sweep-set short5 (session 4, second call): the tuned winners and the b1 winner with early workspace stores
# (triton 3.6 sm_90 at L = 4: 2,080 -> 1,976 instructions per warp, 244 -> 217 registers, no stack). (It also timed
# flat_small, O's product beside U's: slower everywhere, removed; see the notes.)
_ES = dict(early_stores=True)
SWEEP_VERIFY_SHORT5 = [
    VerifyConfig(**_B1), VerifyConfig(**_B1, **_ES),
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True), VerifyConfig(block_v=32, hoist=True, weight_tiles=True,
                                                                          **_ES),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2),  # b8 winner
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),  # b32 / b64 winner
    VerifyConfig(block_v=32, two_pass=True, weight_tiles=True),
]
# --sweep-set split6 (session 4, G2): the tuned winners with and without the split Gram products (two half-K MMA
# chains each; triton 3.6 sm_90, b1 winner + early stores at L = 4: 1,976 -> 2,112 instructions per warp, 217 -> 172
# registers, 24.6 -> 36.9 KB shared, no stack)
_SG = dict(split_gram=True)
_B1_4 = dict(_B1, num_warps=4)
SWEEP_VERIFY_SPLIT6 = [
    VerifyConfig(**_B1), VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1, **_ES, **_SG),
    VerifyConfig(**_B1_4, **_ES), VerifyConfig(**_B1_4, **_ES, **_SG),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2), VerifyConfig(block_v=32, whole_v=True, loop_stages=2, **_SG),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),  # b32 / b64 winner
    VerifyConfig(block_v=32, two_pass=True, weight_tiles=True),
]
# --sweep-set stacked7 (session 5, GB): the tuned picks, the two-pass pick with its prep capped at 128 registers (one
# wave of prep programs at b32), and the stacked forms (stacked.py) with the picks of call 1 (commit 80d4be1, L16 b32:
# stacked BV64 + pdl + prep_maxnreg 128 60.1 us vs the two-pass pick 63.3; b64 110.4 vs 113.4)
SWEEP_VERIFY_STACKED7 = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1_4, **_ES),  # b1 picks (L4 / L16)
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2), VerifyConfig(block_v=32, whole_v=True, loop_stages=2, **_SG),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),  # b32 / b64 pick
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, prep_maxnreg=128),
    VerifyConfig(block_v=64, two_pass=True, stacked=True, prep_maxnreg=128),
    VerifyConfig(block_v=64, two_pass=True, stacked=True, pdl=True, prep_maxnreg=128),
    VerifyConfig(block_v=64, two_pass=True, stacked=True, pdl=True, prep_warps=8),
    VerifyConfig(block_v=64, two_pass=True, stacked=True, pdl=True, prep_warps=8, prep_maxnreg=64),  # 4 per SM
    VerifyConfig(block_v=128, num_warps=8, two_pass=True, stacked=True, pdl=True, prep_maxnreg=128),
]
# --sweep-set bf16state (session 5, GB2; with --ssm-dtype bfloat16): the fp32-state picks of the tuned file (final8)
# and the rivals that a halved state read could bring back: the one-pass whole-V rolled form (no prep chain, final7's
# b8 pick) and the two-pass whole-V rolled form with its prep capped (final7's b32 / b64 pick)
SWEEP_VERIFY_BF16STATE = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1_4, **_ES),  # b1 picks (L <= 8 / L >= 12)
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, prep_maxnreg=128),
    VerifyConfig(block_v=128, num_warps=8, two_pass=True, stacked=True, pdl=True, prep_maxnreg=128),  # b8 pick
    VerifyConfig(block_v=64, two_pass=True, stacked=True, pdl=True, prep_maxnreg=128),  # b32 pick (b64 at L <= 8)
    VerifyConfig(block_v=64, two_pass=True, stacked=True, prep_maxnreg=128),  # b64 pick at L >= 12
]
# --sweep-set bf16recon (session 5, GB3; with --ssm-dtype bfloat16): the bf16-state verify picks (GB2's run) only, so
# the grid runs them; the sweep is about the reconstruction's launches (SWEEP_RECON_BF16RECON)
SWEEP_VERIFY_BF16RECON = [VerifyConfig(**_B1, **_ES), VerifyConfig(block_v=64, two_pass=True, stacked=True,
                                                                   prep_maxnreg=128)]
# --sweep-set tma9 (session 6, GB6; with --verify-margin): final8's picks first (the incumbents), then the stacked
# picks with TMA loads of the state block and Z (triton 3.6, L16 b32 pick: 1,352 -> 1,264 instructions, 106 -> 98
# registers, shared memory unchanged). final9 (901b3f2) also timed the prep's factor products as tf32x3 tensor-core
# products (`prep_dot`, removed: 4-10 % slower in every cell)
_PC9 = dict(two_pass=True, stacked=True, prep_maxnreg=128)
SWEEP_VERIFY_TMA9 = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1_4, **_ES),  # b1 picks (L4 / L16)
    VerifyConfig(block_v=128, num_warps=8, pdl=True, **_PC9),  # b8 pick
    VerifyConfig(block_v=64, pdl=True, **_PC9),  # b32 pick (b64 at L4)
    VerifyConfig(block_v=64, **_PC9),  # b64 pick at L16
    VerifyConfig(block_v=128, num_warps=8, pdl=True, tma_loads=True, **_PC9),
    VerifyConfig(block_v=64, pdl=True, tma_loads=True, **_PC9),
    VerifyConfig(block_v=64, tma_loads=True, **_PC9),
]
# --sweep-set l2pf10 (session 8, GD9; with --total-margin 0.03): final9's picks first (the incumbents), then the
# stacked picks with the L2 bulk prefetch of the states (`l2_prefetch_mib`: the prep brings the first requests' states
# into L2 while its chain runs; `l2_prefetch_ahead`: each state-pass program prefetches the block one wave after it at
# ahead = programs per SM: 4 for BV64 x 4 warps, 2 for BV128 x 8; 2 / 8 are half / two waves). Triton 3.6 sm_90, L16:
# prep 3,744 -> 3,784 instructions, b32 state pass 1,352 -> 1,416 (106 -> 104 registers), b64 1,248 -> 1,288, no new
# stack. Call 1 (a4d5fd3) also timed prep 32 MiB (no gain over 16) and the TMA form's ahead prefetch issued before its
# own state copy (6-10 % slower; now after it)
_B8_9 = dict(block_v=128, num_warps=8, pdl=True, **_PC9)
_B32_9 = dict(block_v=64, pdl=True, **_PC9)
_B64_9 = dict(block_v=128, num_warps=8, pdl=True, tma_loads=True, **_PC9)
SWEEP_VERIFY_L2PF10 = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1_4, **_ES),  # b1 picks (L4 / L16)
    VerifyConfig(**_B8_9), VerifyConfig(**_B32_9), VerifyConfig(**_B64_9),  # b8, b32, b64 picks
    VerifyConfig(**_B8_9, l2_prefetch_mib=16),
    VerifyConfig(**_B64_9, l2_prefetch_mib=16), VerifyConfig(**_B64_9, l2_prefetch_ahead=2),
    VerifyConfig(**_B64_9, l2_prefetch_mib=16, l2_prefetch_ahead=2),
    VerifyConfig(**_B32_9, l2_prefetch_mib=16), VerifyConfig(**_B32_9, l2_prefetch_ahead=4),
    VerifyConfig(**_B32_9, l2_prefetch_mib=16, l2_prefetch_ahead=2),
    VerifyConfig(**_B32_9, l2_prefetch_mib=16, l2_prefetch_ahead=4),
    VerifyConfig(**_B32_9, l2_prefetch_mib=16, l2_prefetch_ahead=8),
]
# --sweep-set long11 (session 8, GD10; --sweep-lens 17,32, --lens 17,32): verify lengths 17..32 share one build (BT 32,
# 4 Neumann steps) and ran the L = 16 picks until now. Triton 3.6 sm_90 at L 17 (BT 32) vs L 16: b1 pick 3,000 ->
# 8,736 instructions, 248 -> 255 registers, 0 -> 856 B stack; stacked prep at its 128-register cap 3,744 -> 13,752
# instructions, 8 -> 968 B stack (1,424 with the L2 prefetch); b32 state pass 104 -> 247 registers (4 -> 2 per SM);
# BV128 x 8 state pass 101 -> 173 registers, 98 KB shared (2 -> 1 per SM). Every b1 single-kernel form spills at BT 32
# (hoisted BV32 x 8: 5,688 instructions, 600 B stack; hoisted BV16 x 8: 5,304 / 248 B; plain BV32 x 8: 6,048 / 208 B);
# the prep uncapped on 4 warps: 12,040 / 255 registers / 8 B, on 8 warps: 7,696 / 194 / none; state pass BV64 x 4
# 183 registers (247 with the L2 prefetch), BV32 x 4 180, BV64 x 8 tma 134. The L = 16 picks come first
# (incumbents), then the b1 forms that spill least, and the stacked forms (also at b1) with the prep uncapped or on 8
# warps and state blocks of 32 / 64 / 128 rows
_B16_1 = dict(_B1_4, early_stores=True)
_PCU = dict(two_pass=True, stacked=True)  # prep without the 128-register cap
_PF = dict(l2_prefetch_mib=16, l2_prefetch_ahead=2)
SWEEP_VERIFY_LONG11 = [
    VerifyConfig(**_B16_1), VerifyConfig(**_B64_9), VerifyConfig(**_B32_9, **_PF),  # L16 b1, b8 / b64, b32 picks
    VerifyConfig(**_B1, **_ES), VerifyConfig(**dict(_B1, block_v=16), **_ES), VerifyConfig(block_v=32, num_warps=8),
    VerifyConfig(block_v=128, num_warps=8, pdl=True, tma_loads=True, **_PCU),
    VerifyConfig(block_v=128, num_warps=8, pdl=True, tma_loads=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=64, pdl=True, prep_warps=8, **_PCU), VerifyConfig(block_v=64, pdl=True, prep_warps=8, **_PCU,
                                                                          **_PF),
    VerifyConfig(block_v=64, pdl=True, **_PCU, **_PF),
    VerifyConfig(block_v=64, num_warps=8, pdl=True, tma_loads=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=32, pdl=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=32, pdl=True, prep_warps=8, **_PCU, l2_prefetch_mib=16, l2_prefetch_ahead=4),
    VerifyConfig(block_v=32, pdl=True, **_PCU),
]
# --sweep-set long12bf16 (session 9, GD12; --ssm-dtype bfloat16 --sweep-lens 17,32): bf16 states at L 17..32 ran the
# L = 16 bf16 picks, the incumbents here: hoisted BV32 x 8 with early stores at b1, stacked BV64 with its prep capped
# at 128 registers from b8 (the cap spills ~1 KB a thread at BT 32, GD10). Challengers: GD10's fp32 picks at L 17 /
# 32 (plain BV32 x 8; stacked BV128 x 8 tma, prep on 8 warps, uncapped) and the stacked forms with the prep on 8
# warps, with and without PDL (the bf16 picks at L 16 run without it, GB2)
SWEEP_VERIFY_LONG12BF16 = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(block_v=64, **_PC9),  # the L16 bf16 picks
    VerifyConfig(block_v=32, num_warps=8),
    VerifyConfig(block_v=128, num_warps=8, pdl=True, tma_loads=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=128, num_warps=8, tma_loads=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=64, prep_warps=8, **_PCU), VerifyConfig(block_v=64, pdl=True, prep_warps=8, **_PCU),
    VerifyConfig(block_v=32, prep_warps=8, **_PCU),
]
# (--sweep-set pf12, session 9 GD11: the b1 picks with every input line prefetched into L1 / L2, `input_prefetch`:
# 1.1-3.5 us slower at L 4 / 16 b1 in its one run at 38737b5, removed; eval/notes/gdn_verify.md)
# --sweep-set prep13 (session 11; MODE=prep13): the stacked prep's launch at L 16 was only ever timed on 4 warps capped
# at 128 registers (8-warp and uncapped preps were swept at L 17..32 only, GD10, where the cap spilled). A first probe
# (call 6 at 39df2ab, L16 b8 / b32 / b64, verify alone, us): on 8 warps capped at 128 the b32 form (BV64, L2 prefetch)
# took 19.03 at b8 vs the b8 pick's 20.94 (-9 %), but 58.38 vs 53.68 at b32 and 108.66 vs 100.32 at b64; uncapped
# 8-warp preps were slower than capped ones everywhere. So: the shipped picks at L 4 / 16 first (incumbents: b1 L4 /
# L16, BV128 x 8 tma, BV64 + prefetch ahead 2 / 4), then the three stacked picks with the prep on 8 warps, capped.
_B8_13 = dict(block_v=128, num_warps=8, pdl=True, tma_loads=True, two_pass=True, stacked=True, prep_maxnreg=128)
_B32_13 = dict(block_v=64, pdl=True, two_pass=True, stacked=True, prep_maxnreg=128, l2_prefetch_mib=16)
SWEEP_VERIFY_PREP13 = [
    VerifyConfig(**_B1, **_ES), VerifyConfig(**_B1_4, **_ES),  # b1 picks (L4 / L16)
    VerifyConfig(**_B8_13), VerifyConfig(**_B32_13, l2_prefetch_ahead=2),  # the stacked picks
    VerifyConfig(**_B32_13, l2_prefetch_ahead=4),
    VerifyConfig(**_B8_13, prep_warps=8), VerifyConfig(**_B32_13, l2_prefetch_ahead=2, prep_warps=8),
    VerifyConfig(**_B32_13, l2_prefetch_ahead=4, prep_warps=8),
]
# --sweep-set pdl23 (session 23; MODE=pdl23): the shipped picks at L 4 / 16 (incumbents: b1 L4 / L16, b8 with its
# 8-warp prep, b32 / b64 at ahead 2, L4 b32 at ahead 4), then each with `pdl_first`: its first launch (the single
# kernel, or the stacked prep) by programmatic dependent launch after the launch before it, waiting for it before
# touching memory; in the 30-layer graph that is the previous layer's verify, in a model the layer's projection
_S13 = dict(block_v=64, pdl=True, two_pass=True, stacked=True, prep_maxnreg=128, l2_prefetch_mib=16)
_PDL23 = [dict(_B1, **_ES), dict(_B1_4, **_ES), dict(_S13, prep_warps=8, l2_prefetch_ahead=4),
          dict(_S13, l2_prefetch_ahead=2), dict(_S13, l2_prefetch_ahead=4)]
SWEEP_VERIFY_PDL23 = [VerifyConfig(**c) for c in _PDL23] + [VerifyConfig(**c, pdl_first=True) for c in _PDL23]
# --sweep-set bf16s24 (session 24; MODE=bf16s24, --ssm-dtype bfloat16): the bf16-state picks at L 4 / 16 date from
# session 5 (GB2): hoisted BV32 x 8 with early stores at b1, stacked BV64 with its prep capped from b8, no PDL, no L2
# prefetch. Every later form (PDL between the prep and the state pass, the L2 bulk prefetch of the states, the prep on
# 8 warps, pdl_first at b1) was swept with fp32 states only. Incumbents: those two picks; challengers: the fp32 picks
# of the tuned file as they are (the b1 4-warp form and both b1 forms with pdl_first; the stacked b8 / b32 / b64 picks)
_S24_B1 = [dict(_B1, **_ES, pdl_first=True), dict(_B1_4, **_ES), dict(_B1_4, **_ES, pdl_first=True)]
_S24_STACKED = [dict(_S13, prep_warps=8, l2_prefetch_ahead=4), dict(_S13, l2_prefetch_ahead=2),
                dict(_S13, l2_prefetch_ahead=4), dict(block_v=64, pdl=True, **_PC9)]
SWEEP_VERIFY_BF16S24 = [VerifyConfig(**_B1, **_ES), VerifyConfig(block_v=64, **_PC9)] + [
    VerifyConfig(**c) for c in _S24_B1 + _S24_STACKED]
# --sweep-set nopdl24 (session 24; MODE=nopdl24): with bf16 states (bf16s24) the stacked BV64 without PDL beat every
# PDL form at b32 / b64 by 5-15 %; with fp32 states it was last timed against PDL before the L2 prefetch (GB, session
# 5). Incumbents: the fp32 picks at L 4 / 16 as shipped (b1 L4 / L16, b8, b32 / b64 at ahead 2, L4 b32 at ahead 4);
# challengers: the stacked BV64 without PDL, alone and with the prefetches the PDL picks use
_NOPDL24 = dict(block_v=64, two_pass=True, stacked=True, prep_maxnreg=128)
SWEEP_VERIFY_NOPDL24 = [VerifyConfig(**c, pdl_first=True) for c in _PDL23[:2]] + [
    VerifyConfig(**c) for c in _PDL23[2:]] + [
    VerifyConfig(**_NOPDL24), VerifyConfig(**_NOPDL24, l2_prefetch_mib=16),
    VerifyConfig(**_NOPDL24, l2_prefetch_mib=16, l2_prefetch_ahead=2),
    VerifyConfig(**_NOPDL24, l2_prefetch_mib=16, l2_prefetch_ahead=4),
    VerifyConfig(**_NOPDL24, l2_prefetch_mib=16, l2_prefetch_ahead=4, prep_warps=8)]
# --sweep-set long24 / long24bf16 (session 24; MODE=long24): the b1 picks at verify lengths 17..32 (BT 32; fp32: the
# plain BV32 x 8 form, bf16: the hoisted one) never took pdl_first (session 23 swept L 4 / 16); incumbents the shipped
# L 17 / 32 picks, challenger the b1 pick with pdl_first
_LONG_STACKED = dict(block_v=128, num_warps=8, pdl=True, tma_loads=True, prep_warps=8, **_PCU)
SWEEP_VERIFY_LONG24 = [VerifyConfig(block_v=32, num_warps=8), VerifyConfig(**_LONG_STACKED),
                       VerifyConfig(block_v=32, num_warps=8, pdl_first=True)]
SWEEP_VERIFY_LONG24BF16 = [VerifyConfig(**_B1, **_ES), VerifyConfig(**dict(_LONG_STACKED, pdl=False)),
                           VerifyConfig(**_LONG_STACKED), VerifyConfig(**_B1, **_ES, pdl_first=True)]
# --sweep-set chunk26 / chunk26bf16 (session 26; MODE=chunk26): verify lengths 17..32 as two 16-token chunks
# (`chunked`: the prep builds each chunk's factors in a program of its own, the state pass verifies the second chunk
# from the first's result) instead of one BT 32 chunk (2.6x / 3.8x the L 16 verify at b1 / b32, GD10). Incumbents:
# the L 17 / 32 picks of the state dtype before session 26 (one chunk); challengers: those stacked forms and the L 16
# stacked picks, chunked, and narrow state blocks (more programs at b1), chunked. Offline sm_90 (triton 3.6), chunked
# (v2, the shipped state pass): BV128 x 8 tma state pass 153 registers (one chunk at BT 32: 168), BV64 x 4 168, BV32
# x 4 255; prep capped at 128 3,416 instructions / 8 B stack (BT 32: 13,952 / 1,424 B)
_CHUNKED = dict(two_pass=True, stacked=True, pdl=True, chunked=True)
_CHUNK26 = [dict(_LONG_STACKED, chunked=True), dict(_S13, prep_warps=8, l2_prefetch_ahead=4, chunked=True),
            dict(_S13, l2_prefetch_ahead=2, chunked=True), dict(block_v=32, **_CHUNKED),
            dict(block_v=32, prep_warps=8, **_CHUNKED), dict(block_v=64, prep_warps=8, **_CHUNKED)]
SWEEP_VERIFY_CHUNK26 = [VerifyConfig(block_v=32, num_warps=8), VerifyConfig(**_LONG_STACKED)] + [
    VerifyConfig(**c) for c in _CHUNK26]
SWEEP_VERIFY_CHUNK26BF16 = [VerifyConfig(**_B1, **_ES), VerifyConfig(**dict(_LONG_STACKED, pdl=False)),
                            VerifyConfig(**_LONG_STACKED), VerifyConfig(**dict(_LONG_STACKED, pdl=False, chunked=True)),
                            VerifyConfig(**dict(_PC9, block_v=64, chunked=True))] + [
    VerifyConfig(**c) for c in _CHUNK26]
# the first this many configs of the set: the picks a new form must beat by the margin
SWEEP_INCUMBENTS = {"tma9": 5, "l2pf10": 5, "long11": 3, "long12bf16": 2, "prep13": 5, "pdl23": 5, "bf16s24": 2,
                    "nopdl24": 5, "long24": 2, "long24bf16": 3, "chunk26": 2, "chunk26bf16": 3}
SWEEP_SETS = {"full": SWEEP_VERIFY, "v4": SWEEP_VERIFY_V4, "v5": SWEEP_VERIFY_V5, "fold": SWEEP_VERIFY_FOLD,
              "short": SWEEP_VERIFY_SHORT, "short4": SWEEP_VERIFY_SHORT4, "short5": SWEEP_VERIFY_SHORT5,
              "split6": SWEEP_VERIFY_SPLIT6, "stacked7": SWEEP_VERIFY_STACKED7, "bf16state": SWEEP_VERIFY_BF16STATE,
              "bf16recon": SWEEP_VERIFY_BF16RECON, "tma9": SWEEP_VERIFY_TMA9, "l2pf10": SWEEP_VERIFY_L2PF10,
              "long11": SWEEP_VERIFY_LONG11, "long12bf16": SWEEP_VERIFY_LONG12BF16, "prep13": SWEEP_VERIFY_PREP13,
              "pdl23": SWEEP_VERIFY_PDL23, "bf16s24": SWEEP_VERIFY_BF16S24,
              "nopdl24": SWEEP_VERIFY_NOPDL24, "long24": SWEEP_VERIFY_LONG24,
              "long24bf16": SWEEP_VERIFY_LONG24BF16, "chunk26": SWEEP_VERIFY_CHUNK26,
              "chunk26bf16": SWEEP_VERIFY_CHUNK26BF16}
SWEEP_RECON = [dict(block_v=bv, num_warps=w, outer_loop=outer) for bv, w in ((32, 4), (64, 8)) for outer in (True, False)]
SWEEP_RECON.append(dict(block_v=16, num_warps=4, outer_loop=True))
# block_v 128 = one program per (request, head, layer); timed at every sweep batch and length
SWEEP_RECON_SHORT = [dict(block_v=bv, num_warps=w, outer_loop=False) for bv in (32, 64, 128) for w in (4, 8)]
SWEEP_RECON_SHORT.append(dict(block_v=128, num_warps=16, outer_loop=False))
# short4: the general kernel's winner (BV32 x 4 warps at every (L, batch) in G4's final4) against the short form's
# launches (triton 3.6 sm_90, no stack: BV16 x 2 warps 107 registers, BV32 x 4 104, BV64 x 8 104, BV128 x 8 165)
SWEEP_RECON_SHORT4 = [dict(block_v=32, num_warps=4, outer_loop=False)] + [
    dict(short=True, block_v=bv, num_warps=w) for bv, w in ((16, 2), (32, 4), (64, 8), (128, 8))]
# short5: final5's two fastest short launches with and without the early workspace reads (EARLY), and BV64 x 8
SWEEP_RECON_SHORT5 = [dict(block_v=32, num_warps=4, outer_loop=False)] + [
    dict(short=True, block_v=bv, num_warps=w, early=early) for bv, w in ((16, 2), (32, 4)) for early in (False, True)]
SWEEP_RECON_SHORT5.append(dict(short=True, block_v=64, num_warps=8, early=True))
# split6: the general kernel now stores 16 bytes at a time (ALIGNED; triton 3.6 BV32 x 4: STG 44 -> 10, LDG 55 -> 24),
# so its launches are timed again beside final6's short picks
SWEEP_RECON_SPLIT6 = [dict(block_v=bv, num_warps=w, outer_loop=False) for bv, w in ((32, 4), (32, 8), (64, 8))] + [
    dict(short=True, block_v=bv, num_warps=w, early=early) for bv, w, early in ((16, 2, False), (32, 4, True))]
# stacked7: final7's reconstruction picks only (BV32 x 8 and BV64 x 8 lost every cell there)
SWEEP_RECON_STACKED7 = [SWEEP_RECON_SPLIT6[0]] + SWEEP_RECON_SPLIT6[3:]
# long11: the general kernel at L 17..32 (BT 32; triton 3.6 BV32 x 4: 164 registers vs 124-128 at L 16, no stack),
# the L = 16 pick first
SWEEP_RECON_LONG11 = [dict(block_v=bv, num_warps=w, outer_loop=False) for bv, w in ((32, 4), (16, 4), (32, 8), (64, 8))]
# (occ12, session 9 GD12: the general and short launches with register caps (maxnreg 96 / 80 / 64: 5..16 programs per
# SM): level to 100 % slower in every cell at af63436, removed with the option; eval/notes/gdn_verify.md)
# long12bf16: the general kernel at L 17..32, bf16 states (triton 3.6: BV32 x 4 148 registers, BV16 x 4 93, no stack)
SWEEP_RECON_LONG12BF16 = [dict(block_v=32, num_warps=4, outer_loop=False), dict(block_v=16, num_warps=4,
                                                                                 outer_loop=False)]
# bf16recon: a bf16 state block is half an fp32 one, so per SM fewer bytes are in flight at the fp32 picks (triton 3.6
# sm_90, general kernel at L16: BV32 x 4 83 registers -> 5 programs x 8 KB; BV64 x 4 168 -> 3 x 16 KB; BV128 x 4 254
# -> 2 x 32 KB; BV64 x 8 104 -> 2 x 16 KB; BV128 x 8 148 -> 1 x 32 KB; all 16-byte loads and stores, no stack). The
# incumbents (GB2's picks) come first: a rival replaces one only when faster by --recon-margin. The short launches
# are timed at L 16 too, as the short form's rank-1 loop (sweep rows only; first timed after GB3's call).
SWEEP_RECON_BF16RECON = [dict(block_v=bv, num_warps=w, outer_loop=False) for bv, w in
                         ((32, 4), (64, 4), (64, 8), (128, 4), (128, 8))] + [
    dict(short=True, block_v=bv, num_warps=w, early=False) for bv, w in ((16, 2), (32, 4), (32, 2), (64, 4), (64, 8))]


def write_tuned(args, device_name, ssm_dtype, sweep_lens, best_verify, best_fold, best_recon, best_recon_short):
    """The sweep's picks as a drop-in tuned_verify_configs.json at args.write_tuned: the swept lengths from this run,
    every other table and length kept from the shipped file (when it was measured on this GPU), the other state
    dtype's tables included. `provenance` gives each table (each length of a per-length table) one flat record of
    the run that measured it: {run, commit, command}."""
    sweep_desc = f"eval/bench_gdn_verify.py sweep, L={','.join(map(str, sweep_lens))}, ssm state {args.ssm_dtype}"
    this_run = dict(run=sweep_desc, commit=os.environ.get("HYBRIDSPEC_COMMIT", "unknown"),
                    command=args.command or "python " + " ".join(sys.argv))
    shipped = json.loads(TUNED_CONFIGS_FILE.read_text()) if TUNED_CONFIGS_FILE.exists() else {}
    same_gpu = shipped.get("device") == device_name
    old_provenance = shipped.get("provenance", {}) if same_gpu else {}
    suffix = "" if ssm_dtype == torch.float32 else "_bf16"  # the shipped tables this sweep's dtype reads
    by_len = dict(best_verify)
    recon_by_len = {L: {B: {k: v for k, v in r.items() if k != "outer_loop"}
                        for B, r in t.items() if not r.get("outer_loop")} for L, t in best_recon.items()}
    short_by_len = dict(best_recon_short)
    folded_by_batch = best_fold.get(16)
    provenance = {}
    if folded_by_batch:
        provenance["verify_fold"] = this_run
    elif same_gpu and shipped.get("verify_fold"):  # not swept: keep the shipped fold table
        folded_by_batch = {int(b): VerifyConfig(**c) for b, c in shipped["verify_fold"].items()}
        provenance["verify_fold"] = old_provenance.get("verify_fold")
    if same_gpu:  # lengths not swept keep their shipped (measured) entries
        for L in sorted({int(L) for L in shipped.get(f"verify_by_len{suffix}", {})} - set(by_len)):
            by_len[L] = {int(b): VerifyConfig(**c) for b, c in shipped[f"verify_by_len{suffix}"][str(L)].items()}
        for key, table in (("reconstruct_by_len", recon_by_len), ("reconstruct_short_by_len", short_by_len)):
            for L, entries in shipped.get(f"{key}{suffix}", {}).items():
                if int(L) not in best_verify:
                    table[int(L)] = {int(b): e for b, e in entries.items()}
    for key, table in (("verify_by_len", by_len), ("reconstruct_by_len", recon_by_len),
                       ("reconstruct_short_by_len", short_by_len)):
        for L in sorted(table):
            provenance[f"{key}/{L}"] = this_run if L in best_verify else old_provenance.get(f"{key}{suffix}/{L}")
    verify_len = 16 if 16 in by_len else max(by_len)
    provenance["verify"] = provenance[f"verify_by_len/{verify_len}"]
    write_tuned_verify_configs(args.write_tuned, device_name, by_len[verify_len],
                               f"{sweep_desc}, commit {this_run['commit']} (each table's run: provenance)",
                               folded_by_batch, best_by_len=by_len, best_recon_by_len=recon_by_len,
                               best_recon_short_by_len=short_by_len)
    swept = json.loads(Path(args.write_tuned).read_text())
    swept["provenance"] = provenance
    if same_gpu:  # a drop-in that keeps the other state dtype's tables
        if ssm_dtype != torch.float32:
            swept = with_bf16_tables(shipped, swept)
        else:
            swept.update({k: v for k, v in shipped.items() if k.endswith("_bf16")})
            swept["provenance"].update({k: v for k, v in old_provenance.items() if k.split("/")[0].endswith("_bf16")})
    Path(args.write_tuned).write_text(json.dumps(swept, indent=1) + "\n")


def default_eligible(config):
    """Configs a sweep may make the default: tf32 state products (tf32x3 and 16-bit operands are timed as the
    price / gain of another precision, not chosen), no timing-only stage skips."""
    return config.big_dot == "tf32" and config.state_dot == "fp32" and not config.skip_stages


def sweep(gdn, device, num_layers, rep_ms, batches, seqlen=16, configs=SWEEP_VERIFY, recon_configs=SWEEP_RECON,
          errors=None, fold_errs=None, folded=False, recon_every_batch=False, recon_errs=None,
          ssm_dtype=torch.float32, recon_margin=0.0, verify_margin=0.0, incumbents=(), total_margin=0.0):
    """Launch configs of ours per batch size at one verify length (verify alone, reconstruction alone; with
    `folded` also the folded verify alone, part "verify_fold"); returns rows and the fastest eligible verify config
    (`default_eligible`, and bf16 output error below 1e-2 in `errors` / `fold_errs` when given) per batch, the same
    with a fold, and the fastest reconstruction config per batch (ssm error below 1e-3 in `recon_errs` when given;
    timed at the smallest and largest batch, or at every batch with `recon_every_batch`); the ssm error bound is
    STATE_TOLERANCE[ssm_dtype], the dtype of every state here. recon_margin: the first reconstruction config of
    each kind (general / short) is the incumbent; another replaces it only when faster by this fraction.
    verify_margin: a verify config not in `incumbents` (the shipped picks, timed first) replaces the best so far only
    when faster by this fraction; total_margin: only when faster by this fraction of the incumbent's verify + the
    fastest reconstruction timed at that batch (the step's total)."""
    rows, best_verify, best_fold, best_recon, best_short = [], {}, {}, {}, {}
    errors, fold_errs, recon_errs = errors or {}, fold_errs or {}, recon_errs or {}

    def ok(err):
        if isinstance(err, dict):
            err = max(err.values())
        return err is None or (isinstance(err, float) and err < OUT_TOLERANCE)

    for B in batches:
        s = make_stack(gdn, seqlen, B, num_layers, device, seed=7, vllm=False, fla=False, ssm_dtype=ssm_dtype)
        n = accept_counts(seqlen, B, "all", device)
        challengers = {}  # part -> the fastest eligible config outside `incumbents` at this batch: (config, us)
        for config in configs:
            parts = [("verify", lambda: ours_step(s, n, reconstruct=False, config=config), 1, errors, best_verify)]
            if folded:
                parts.append(("verify_fold", lambda: ours_fold_step(s, n, conv=False, config=config), 2, fold_errs,
                              best_fold))
            for part, make, steps, errs, best in parts:
                try:
                    us = per_layer_us(make(), rep_ms, num_layers, steps)
                except Exception as exc:  # a config that fails to compile is reported, not fatal
                    rows.append(dict(part=part, L=seqlen, B=B, config=repr(config), error=repr(exc)[:300]))
                    continue
                err = errs.get(repr(config))
                rows.append(dict(part=part, L=seqlen, B=B, config=repr(config), us=round(us, 3), out_rel_err=err))
                top = best if config in incumbents else challengers.setdefault(part, {})
                if default_eligible(config) and ok(err) and us < top.get(B, (None, float("inf")))[1]:
                    top[B] = (config, us)
        for recon in recon_configs if recon_every_batch or B in (1, max(batches)) else []:
            if is_short(recon) and (seqlen > RANK1_MAX_LEN or (recon.get("early") and seqlen > SHORT_MAX_LEN)):
                continue
            try:
                us = time_step(ours_step(s, n, verify=False, recon=recon), rep_ms) * 1e3 / num_layers
            except Exception as exc:  # a config that fails to compile is reported, not fatal
                rows.append(dict(part="reconstruct", L=seqlen, B=B, config=repr(recon), error=repr(exc)[:300]))
                continue
            err = recon_errs.get(repr(recon))
            rows.append(dict(part="reconstruct", L=seqlen, B=B, config=repr(recon), us=round(us, 3), ssm_rel_err=err))
            best = best_short if is_short(recon) else best_recon
            incumbent = B not in best  # the kind's first config timed at this batch
            if (err is None or (isinstance(err, float) and err < STATE_TOLERANCE[ssm_dtype])) and \
                    us < best.get(B, (None, float("inf")))[1] * (1.0 if incumbent else 1.0 - recon_margin):
                best[B] = (recon, us)
        # the fastest challenger replaces the fastest incumbent only when faster by the margin (session 6's final9
        # compared each challenger with the best so far, challengers included: its b64 picks are the first
        # challenger over the margin, 1.3-1.5 % slower than the fastest one)
        recon_us = min([t[B][1] for t in (best_recon, best_short) if B in t] or [0.0])
        for part, best in (("verify", best_verify), ("verify_fold", best_fold)):
            if B in challengers.get(part, {}):
                config, us = challengers[part][B]
                incumbent_us = best.get(B, (None, float("inf")))[1]
                if us * (1 + verify_margin) < incumbent_us and \
                        incumbent_us - us > total_margin * (incumbent_us + recon_us):
                    best[B] = (config, us)
        del s
        torch.cuda.empty_cache()
    # the short form per batch: its fastest launch, and whether it beat the general kernel's fastest
    short = {B: dict(short=us < best_recon.get(B, (None, float("inf")))[1], block_v=c["block_v"],
                     num_warps=c["num_warps"], early=c.get("early", False)) for B, (c, us) in best_short.items()}
    return (rows, {B: c for B, (c, _) in best_verify.items()}, {B: c for B, (c, _) in best_fold.items()},
            {B: c for B, (c, _) in best_recon.items()}, short)


def distinct_specialisations(lens):
    """One length per distinct (block_t, Neumann steps) pair: the only ways the verify kernels depend on L."""
    seen = {}
    for L in sorted(lens):
        key = (max(16, triton.next_power_of_2(L)), max(0, math.ceil(math.log2(max(L, 1))) - 1))
        seen.setdefault(key, L)
    return list(seen.values())


def wait_for_file(path, limit_s=120):
    """Block until `path` exists (None: no wait): a GPU test run sharing the device marks its end with it."""
    t0 = time.time()
    while path and not os.path.exists(path) and time.time() - t0 < limit_s:
        time.sleep(0.5)
    if path:
        print(f"waited {time.time() - t0:.0f} s for {path}", flush=True)


def nearest(table, B):
    return table[min(table, key=lambda key: (abs(key - B), key))] if table else None


# ---------------------------------------------------------------------------------------------------------------
# Diagnosis (v4, GPU call 1): compile report, leave-one-stage-out ladder, launch-shape candidates

LADDER_BITS = [0, 1, 2, 4, 8, 1 | 2 | 4 | 8, 16, 32, 16 | 32, 64, 128, 256, 1 | 2 | 4 | 8 | 64 | 128, 512]
LADDER_BITS_SHORT = [0, 1 | 2 | 4 | 8, 16, 32, 16 | 32, 64, 128, 256, 512]
LADDER_BASES = [  # (name, config, batch, bits)
    ("b1 per-head v2", VerifyConfig(block_v=32), 1, LADDER_BITS),
    ("b32 whole-V rolled loop2", VerifyConfig(block_v=32, whole_v=True, loop_stages=2), 32, LADDER_BITS_SHORT),
    ("b32 whole-V v2", VerifyConfig(block_v=32, whole_v=True), 32, [1 | 2 | 4 | 8, 16 | 32]),
]
LADDER_B1_WINNER = VerifyConfig(block_v=32, hoist=True, weight_tiles=True, num_warps=8)
LADDER_STAGES = {0: "none", 1: "q/k conv", 2: "q/k norms", 4: "Gram products", 8: "Neumann steps",
                 15: "q/k conv+norms+Gram+Neumann", 16: "state load", 32: "state products", 48: "state load+products",
                 64: "v conv", 128: "small products", 256: "workspace stores", 207: "all but state + stores",
                 512: "everything (launch floor)"}


def stage_ladder(gdn, device, num_layers, rep_ms, L=4, B=1):
    """Verify alone with one stage left out at a time (outputs wrong: timing only), the b1 winner at (L, B):
    where its time goes. Rows {stage, skip, us}; printed as they come."""
    s = make_stack(gdn, L, B, num_layers, device, seed=7, vllm=False, fla=False)
    n = accept_counts(L, B, "all", device)
    rows = []
    for bit in LADDER_BITS:
        config = dataclasses.replace(LADDER_B1_WINNER, skip_stages=bit)
        try:
            us = per_layer_us(ours_step(s, n, reconstruct=False, config=config), rep_ms, num_layers)
            rows.append(dict(stage=LADDER_STAGES.get(bit, str(bit)), skip=bit, L=L, B=B, us=round(us, 3)))
        except Exception as exc:  # reported, not fatal
            rows.append(dict(stage=LADDER_STAGES.get(bit, str(bit)), skip=bit, L=L, B=B, error=repr(exc)[:200]))
        print("ladder", json.dumps(rows[-1]), flush=True)
    return rows


CANDIDATES_LATENCY = [
    VerifyConfig(block_v=32), VerifyConfig(block_v=32, num_warps=8), VerifyConfig(block_v=32, num_warps=2),
    VerifyConfig(block_v=16), VerifyConfig(block_v=32, state_dot="bf16"),
    VerifyConfig(block_v=32, state_dot="bf16", num_warps=8),
    VerifyConfig(block_v=32, hoist=True), VerifyConfig(block_v=32, hoist=True, num_warps=8),
    VerifyConfig(block_v=32, hoist=True, state_dot="bf16"),
    VerifyConfig(block_v=32, two_pass=True), VerifyConfig(block_v=16, two_pass=True),
    VerifyConfig(block_v=32, two_pass=True, prep_warps=8),
    VerifyConfig(block_v=32, weight_tiles=True), VerifyConfig(block_v=32, weight_tiles=True, num_warps=8),
    VerifyConfig(block_v=32, hoist=True, weight_tiles=True, num_warps=8),
]
CANDIDATES_THROUGHPUT = [
    VerifyConfig(block_v=32, whole_v=True), VerifyConfig(block_v=32, whole_v=True, loop_stages=1),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2), VerifyConfig(block_v=32, whole_v=True, loop_stages=3),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, num_warps=8),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, state_dot="bf16"),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=3, state_dot="bf16"),
    VerifyConfig(block_v=64, whole_v=True, loop_stages=2, num_warps=8),
    VerifyConfig(block_v=32, whole_v=True, group_heads=True, loop_stages=2),
    VerifyConfig(block_v=32, whole_v=True, group_heads=True, loop_stages=2, state_dot="bf16"),
    VerifyConfig(block_v=32, two_pass=True), VerifyConfig(block_v=64, two_pass=True, num_warps=8),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2),
    VerifyConfig(block_v=32, two_pass=True, state_dot="bf16"),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, state_dot="bf16"),
    VerifyConfig(block_v=32, whole_v=True, two_pass=True, loop_stages=2, weight_tiles=True),
    VerifyConfig(block_v=32, whole_v=True, loop_stages=2, weight_tiles=True),
]


def _compile_one(gdn, seqlen, config, folded=False, ssm_dtype=torch.float32):
    """Compile (and run once) one kernel specialisation in a worker process; fills Triton's on-disk cache."""
    t0 = time.time()
    try:
        s = make_stack(gdn, seqlen, 2, 1, "cuda", seed=0, vllm=False, fla=False, ssm_dtype=ssm_dtype)
        n = accept_counts(seqlen, 2, "all", "cuda")
        if isinstance(config, dict):  # a reconstruction launch config
            ours_step(s, n, verify=False, recon=config)()
        else:
            ours_fold_step(s, n, config=config)() if folded else ours_step(s, n, reconstruct=False, config=config)()
        torch.cuda.synchronize()
        return repr(config), seqlen, folded, round(time.time() - t0, 1), None
    except Exception as exc:
        return repr(config), seqlen, folded, round(time.time() - t0, 1), repr(exc)[:300]


def precompile(gdn, jobs, workers=15, ssm_dtype=torch.float32):
    """Compile every (seqlen, config[, folded]) with `ssm_dtype` states in parallel worker processes (Triton
    compiles serially per process)."""
    import concurrent.futures
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        results = list(pool.map(_compile_one, [gdn] * len(jobs), [j[0] for j in jobs], [j[1] for j in jobs],
                                [len(j) > 2 and j[2] for j in jobs], [ssm_dtype] * len(jobs)))
    failed = [r for r in results if r[-1]]
    print(f"precompile: {len(jobs)} kernels in {time.time() - t0:.0f} s, {len(failed)} failed", flush=True)
    for r in failed:
        print("  compile failed", r, flush=True)
    return results


def config_errors(gdn, device, configs, folded=True, ssm_dtype=torch.float32):
    """bf16 inputs, `ssm_dtype` state, mixed lengths 1..17 + a null slot: each config's output error vs float64."""
    H, HV, K, V = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
    errors, fold = {}, {}
    p, lens, act = mixed_length_problem(gdn, device, seed=321, lens=MIXED_LENS, ssm_dtype=ssm_dtype)
    ref = naive_gdn_verify(**{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in p.items()})
    ws = GDNVerifyWorkspace.allocate(1, len(lens), 32, H, HV, K, V, act, device)
    T = sum(lens)
    for config in configs:
        try:
            out = torch.full((T, HV, V), float("nan"), dtype=act, device=device)
            gdn_verify(**p, workspace=ws.layer(0), max_seqlen=max(lens), out=out, config=config)
            errors[repr(config)] = rel_err(out, ref)
        except Exception as exc:
            errors[repr(config)] = repr(exc)[:200]
        try:
            if folded:
                fold[repr(config)] = fold_errors(gdn, device, config, ssm_dtype=ssm_dtype)
        except Exception as exc:
            fold[repr(config)] = repr(exc)[:200]
    return errors, fold


def recon_errors(gdn, device, recon_configs, ssm_dtype=torch.float32):
    """Each reconstruction config on the mixed-length problem (bf16 inputs, `ssm_dtype` state, a null slot, accepted
    counts 1..16, full and partial; lengths 1..4 and counts 0..4 for the short form): relative ssm error vs float64
    (conv windows must match exactly, else the error is reported as a string)."""
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    problems = {}
    errors = {}
    for recon in recon_configs:
        short = is_short(recon)
        if short not in problems:
            lens = SHORT_LENS if short else MIXED_LENS
            p, lens, act = mixed_length_problem(gdn, device, seed=456, lens=lens, ssm_dtype=ssm_dtype)
            ws = GDNVerifyWorkspace.allocate(1, len(lens), max(lens) if short else 32, H, HV, K, V, act, device)
            ssm0, conv0 = p["ssm_state"].clone(), p["conv_state"].clone()
            gdn_verify(**p, workspace=ws.layer(0), max_seqlen=max(lens))
            num_accepted = torch.tensor([2, 1, 1, 4, 0, 1] if short else [9, 4, 1, 16, 7, 12], dtype=torch.int32)
            ref = {**{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in p.items()},
                   "ssm_state": ssm0.cpu().double(), "conv_state": conv0.cpu().double()}
            naive_gdn_reconstruct(**ref, num_accepted=num_accepted)
            problems[short] = (p, ws, ssm0, conv0, num_accepted, ref)
        p, ws, ssm0, conv0, num_accepted, ref = problems[short]
        try:
            p["ssm_state"].copy_(ssm0)
            p["conv_state"].copy_(conv0)
            s = dict(table=GDNStateTable([p["ssm_state"]], [p["conv_state"]], W), ws=ws, slots=p["state_indices"],
                     cu=p["cu_seqlens"])
            reconstruct_all(s, num_accepted.to(device), recon)
            conv_err = rel_err(p["conv_state"], ref["conv_state"])
            errors[repr(recon)] = rel_err(p["ssm_state"], ref["ssm_state"]) if conv_err == 0 else \
                f"conv window error {conv_err}"
        except Exception as exc:
            errors[repr(recon)] = repr(exc)[:200]
    return errors


def short_config(text):
    """repr(VerifyConfig) without the fields at their defaults."""
    import re
    defaults = {f"{f.name}={getattr(VerifyConfig(), f.name)!r}" for f in dataclasses.fields(VerifyConfig)}
    inner = re.sub(r"^VerifyConfig\((.*)\)$", r"\1", text)
    return ",".join(part for part in inner.split(", ") if part not in defaults) or "default"


def save_json(doc, path):
    """Write a diagnosis document so far (called after each stage: a call cut short keeps what it measured) as
    <path stem>.json with the results' keys (bench, device, commit, date, command, rows, summary; the document's other
    keys beside them) and a Markdown table of its rows beside it."""
    device = torch.cuda.get_device_name() if ON_GPU else "cpu"
    write_results(path.stem, doc.get("rows", []), doc.get("summary", {}), "python eval/bench_gdn_verify.py "
                  + " ".join(sys.argv[1:]), device, out_dir=path.parent,
                  extra={k: v for k, v in doc.items() if k not in ("rows", "summary")})


def diagnose(gdn, device, num_layers, rep_ms, out_dir, budget_s):
    """One GPU call: precompile everything, check every candidate, then time the ladder and the candidates."""
    t0 = time.time()
    latency_jobs = [(L, c) for c in CANDIDATES_LATENCY for L in (16, 4)]
    jobs = [(16, dataclasses.replace(c, skip_stages=bit)) for _, c, _, bits in LADDER_BASES for bit in bits]
    jobs += latency_jobs + [(16, c) for c in CANDIDATES_THROUGHPUT]
    # config_errors runs the mixed-length problem (L = 17: block_t 32, 4 Neumann steps); v4 call 1 lost its timing
    # half compiling these serially
    jobs += [(17, c) for c in CANDIDATES_LATENCY + CANDIDATES_THROUGHPUT]
    jobs = list(dict.fromkeys(jobs))
    doc = dict(compile=precompile(gdn, jobs) if ON_GPU else [])
    doc["errors"], doc["fold_errors"] = config_errors(gdn, device, CANDIDATES_LATENCY + CANDIDATES_THROUGHPUT)
    for k, v in doc["errors"].items():
        print("error", f"{v:.3g}" if isinstance(v, float) else v, short_config(k), flush=True)
    rows = doc["rows"] = []
    save = functools.partial(save_json, doc, Path(out_dir) / "gdn_verify_diag.json")

    save()
    stacks = {}

    def stack(L, B):
        if (L, B) not in stacks:
            stacks.clear()
            if ON_GPU:
                torch.cuda.empty_cache()
            stacks[(L, B)] = make_stack(gdn, L, B, num_layers, device, seed=7, vllm=False, fla=False)
        return stacks[(L, B)]

    def timed(kind, name, L, B, config):
        if time.time() - t0 > budget_s:
            return
        s = stack(L, B)
        try:
            us = time_step(ours_step(s, accept_counts(L, B, "all", device), reconstruct=False, config=config),
                           rep_ms) * 1e3 / num_layers
            rows.append(dict(kind=kind, name=name, L=L, B=B, config=repr(config), us=round(us, 3)))
        except Exception as exc:
            rows.append(dict(kind=kind, name=name, L=L, B=B, config=repr(config), error=repr(exc)[:200]))
        print(rows[-1], flush=True)

    name, base, B, bits = LADDER_BASES[0]
    for bit in bits:
        timed("ladder", f"{name} skip={bit}", 16, B, dataclasses.replace(base, skip_stages=bit))
    save()
    for L in (16, 4):
        for c in CANDIDATES_LATENCY:
            timed("candidate", "latency", L, 1, c)
    save()
    for B in (32, 8):
        for c in CANDIDATES_THROUGHPUT:
            timed("candidate", "throughput", 16, B, c)
    save()
    for name, base, B, bits in LADDER_BASES[1:]:
        for bit in bits:
            timed("ladder", f"{name} skip={bit}", 16, B, dataclasses.replace(base, skip_stages=bit))
    save()
    try:
        doc["compiled"] = compiled_report()
    except Exception as exc:
        doc["compiled"] = repr(exc)
    save()
    for r in doc["compiled"] if isinstance(doc["compiled"], list) else []:
        print("compiled", r["kernel"][5:], r["regs"], r["spills"], r["shared"], r["warps"], r["consts"][:150])
    print(f"{'kind':9} {'name':34} {'L':>3} {'B':>3} {'us':>8}  config")
    for r in rows:
        cfg = short_config(r["config"])
        print(f"{r['kind']:9} {r['name'][:34]:34} {r['L']:>3} {r['B']:>3} {r.get('us', float('nan')):8.2f}  {cfg[:90]}")


# ---------------------------------------------------------------------------------------------------------------
# Session 5 (GB), call 1: the b32 / b64 verify taken apart (prep alone, state pass alone, both) beside the floors
# measured in the same run (a 64 MiB fp32 copy, the batched state product in cuBLAS)

_TP = dict(two_pass=True)
_ST = dict(two_pass=True, stacked=True)
STATE_DIAG_BASE = VerifyConfig(block_v=32, whole_v=True, loop_stages=2, **_TP)  # the b32 / b64 pick (final7)
STATE_DIAG_STATE = [  # stacked state passes (prep: per k-head, 4 warps)
    VerifyConfig(block_v=64, **_ST), VerifyConfig(block_v=128, num_warps=8, **_ST),
    VerifyConfig(block_v=64, whole_v=True, loop_stages=2, **_ST), VerifyConfig(block_v=64, stacked_dot="tf32", **_ST),
    VerifyConfig(block_v=32, **_ST),
]
# preps with the BV64 state pass (call 1, session 5, also timed: the per-v-head prep (removed: wrong outputs on the
# H200, its BT = 32 build did not compile) and the prep at 2 warps (wrong outputs in graph replays; now refused))
STATE_DIAG_PREP = [VerifyConfig(block_v=64, prep_warps=w, prep_maxnreg=r, **_ST)
                   for w, r in ((4, 0), (8, 0), (4, 128), (8, 128))]
STATE_DIAG_PDL = [VerifyConfig(block_v=64, pdl=True, **_ST), VerifyConfig(block_v=128, num_warps=8, pdl=True, **_ST),
                  VerifyConfig(block_v=64, pdl=True, prep_maxnreg=128, **_ST)]

# Session 6 (GB6): call 1 (fc316c5) timed persistent state passes here (removed: 1.25-2x slower than the per-block
# pass); now the per-block stacked pass with TMA loads of its state block and Z beside final8's picks (the first
# config is the reference every graph replay is compared with)
_PC = dict(prep_maxnreg=128, **_ST)
STATE_DIAG_GB6 = [
    VerifyConfig(block_v=64, pdl=True, **_PC),  # final8's L16 b32 pick: the reference
    VerifyConfig(block_v=64, **_PC),  # final8's L16 b64 pick (per-block state pass without PDL)
    VerifyConfig(block_v=64, tma_loads=True, **_PC),
    VerifyConfig(block_v=64, pdl=True, tma_loads=True, **_PC),
    VerifyConfig(block_v=128, num_warps=8, pdl=True, tma_loads=True, **_PC),  # final9's b64 pick
]
# Session 26: the chunked picks at L 17 (MODE=chunk26b): the b32 pick (PDL; the reference), then both picks without
# PDL, so that prep and state pass are timed apart (`state_diag(..., seqlen=17)`, batches 1 / 32)
_CH26 = dict(block_v=64, two_pass=True, stacked=True, prep_maxnreg=128, l2_prefetch_mib=16, chunked=True)
STATE_DIAG_CHUNK26 = [VerifyConfig(**_CH26, pdl=True, l2_prefetch_ahead=2), VerifyConfig(**_CH26, l2_prefetch_ahead=2),
                      VerifyConfig(**_CH26, prep_warps=8, l2_prefetch_ahead=4)]
STATE_DIAG_SETS = {"gb": None, "gb6": STATE_DIAG_GB6, "chunk26": STATE_DIAG_CHUNK26}


def diag_recorder(rows, t0, budget_s, rep_ms, label):
    """record(row, fn[, per]): times fn's CUDA graph (us, divided by row's "per" or `per`, default 1) into row, appends
    it to rows and prints it after `label`; an error is reported in the row, not raised; nothing after budget_s."""
    def record(row, fn, per=1):
        if time.time() - t0 > budget_s:
            return
        per = row.pop("per", per)
        try:
            row["us"] = round(time_step(fn, rep_ms) * 1e3 / per, 3)
        except Exception as exc:  # reported, not fatal
            row["error"] = repr(exc)[:200]
        rows.append(row)
        print(label, json.dumps(row), flush=True)
    return record


def split_step(s, config, part, scratches):
    """ours_step's verify with only one of the two-pass launches ("prep" or "state"; "both" = the plain call), each
    layer on its own persistent scratch (`scratches[layer]`) so that the state pass reads real factors."""
    from hybridspec_kernels.gdn_verify import stacked as stacked_mod, two_pass as two_pass_mod
    module, name = (stacked_mod, "launch_stacked") if config.stacked else (two_pass_mod, "launch_two_pass")
    launch = getattr(module, name)
    parts = ("prep", "state") if part == "both" else (part,)

    def run():
        for layer in range(s["num_layers"]):
            setattr(module, name, functools.partial(launch, parts=parts, scratch=scratches[layer]))
            try:
                gdn_verify(s["x"][layer], s["a"][layer], s["b"][layer], s["conv_weight"], None, s["A_log"],
                           s["dt_bias"], s["conv"][layer], s["ssm"][layer], s["slots"], s["cu"], s["ws"].layer(layer),
                           max_seqlen=s["L"], out=s["out"][layer], config=config)
            finally:
                setattr(module, name, launch)
    return run


def state_diag(gdn, device, num_layers, rep_ms, out_dir, budget_s, batches=(32, 64), seqlen=16, diag_set="gb"):
    """Precompile, bf16 error of every candidate vs float64, then per batch: floors, and per config prep alone, state
    pass alone and both (us per layer). Rows are printed as they come and saved to gdn_verify_state_diag.json.
    diag_set "gb" (session 5): the two-pass pick first, the stacked candidates; "gb6": STATE_DIAG_GB6 (its first
    config is the reference every graph replay is compared with; the prep is timed once, with the second)."""
    from hybridspec_kernels.gdn_verify.stacked import chunk_plan, stacked_scratch
    from hybridspec_kernels.gdn_verify.two_pass import two_pass_scratch
    t0 = time.time()
    configs = STATE_DIAG_SETS[diag_set] or list(dict.fromkeys(
        [STATE_DIAG_BASE] + STATE_DIAG_STATE + STATE_DIAG_PREP + STATE_DIAG_PDL))
    doc = dict(compile=precompile(gdn, [(L, c) for c in configs for L in (seqlen, 17)]) if ON_GPU else [])
    doc["errors"], _ = config_errors(gdn, device, configs, folded=False)
    for k, v in doc["errors"].items():
        print("error", f"{v:.3g}" if isinstance(v, float) else v, short_config(k), flush=True)
    rows = doc["rows"] = []
    save = functools.partial(save_json, doc, Path(out_dir) / "gdn_verify_state_diag.json")

    record = diag_recorder(rows, t0, budget_s, rep_ms, "diag")

    H, HV, K, V = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
    for B in batches:
        if ON_GPU:
            src = torch.randn(16 * 2**20, device=device)  # 64 MiB fp32
            dst = torch.empty_like(src)
            record(dict(part="floor", name="copy 64 MiB fp32", B=B), lambda: dst.copy_(src))
            torch.backends.cuda.matmul.allow_tf32 = True
            kq = torch.randn(B * HV, 32, K, device=device)
            st = torch.randn(B * HV, V, K, device=device)
            record(dict(part="floor", name=f"bmm [{B}*{HV},32,{K}]x[{B}*{HV},{K},{V}] tf32", B=B),
                   lambda: torch.bmm(kq, st.transpose(1, 2)))
            torch.backends.cuda.matmul.allow_tf32 = False
            del src, dst, kq, st
        s = make_stack(gdn, seqlen, B, num_layers, device, seed=7, vllm=False, fla=False)
        n = accept_counts(seqlen, B, "all", device)
        block_t = max(16, triton.next_power_of_2(seqlen))
        layers = [0, num_layers - 1]
        reference = None
        for config in configs:
            make = stacked_scratch if config.stacked else two_pass_scratch
            chunks, chunk_t, _ = chunk_plan(config, block_t, 0)  # a chunked launch's scratch: a row per chunk
            scratches = [make(device, B * chunks, H, HV, chunk_t, K) for _ in range(num_layers)]
            split_step(s, config, "both", scratches)()  # real factors in every scratch
            if reference is None:  # the final7 pick's outputs and u, eager: what every graph replay below must give
                reference = (s["out"][layers].clone(), s["ws"].u[layers, :B].clone())
            parts = ["prep", "state", "both"]
            if config in STATE_DIAG_PREP and config not in STATE_DIAG_STATE:
                parts = ["prep", "both"]  # the same state pass as STATE_DIAG_STATE[0]
            if diag_set in ("gb6", "chunk26") and not config.pdl:
                parts = ["prep", "state", "both"]
            if config.pdl:
                parts = ["both"]
            for part in parts:
                s["out"][layers] = float("nan")
                record(dict(part=part, L=seqlen, B=B, config=repr(config), per=num_layers),
                       split_step(s, config, part, scratches))
                if part == "both" and ON_GPU:  # after the graph's replays: a race would show far above tf32 noise
                    rows[-1]["out_vs_final7"] = rel_err(s["out"][layers], reference[0])
                    rows[-1]["u_vs_final7"] = rel_err(s["ws"].u[layers, :B], reference[1])
            save()
            del scratches
        record(dict(part="reconstruct", L=seqlen, B=B, config="default", per=num_layers),
               ours_step(s, n, verify=False))
        if diag_set == "gb6":  # the reconstruction with its conv-window barrier (b8921d6), at random accept too
            record(dict(part="reconstruct", L=seqlen, B=B, config="default, random accept", per=num_layers),
                   ours_step(s, accept_counts(seqlen, B, "random", device), verify=False))
        del s
        if ON_GPU:
            torch.cuda.empty_cache()
    save()
    print(f"{'part':12} {'B':>3} {'us':>8} {'out_err':>8}  config")
    for r in rows:
        print(f"{r['part']:12} {r['B']:>3} {r.get('us', float('nan')):8.2f} {r.get('out_vs_final7', float('nan')):8.1e}  "
              f"{short_config(r['config'])[:80] if 'config' in r else r['name']}")


def compiled_report():
    """Registers / spills / shared memory of every compiled gdn_verify kernel in this process (Triton's caches)."""
    from hybridspec_kernels.gdn_verify import two_pass, verify
    keep = ("BT", "BV", "V_PER_PROGRAM", "HEADS_PER_PROGRAM", "NEUMANN_STEPS", "STATE_DOT", "LOOP_STAGES", "SKIP",
            "HOIST", "HPG")
    rows = []
    for fn in (verify._gdn_verify_kernel, two_pass._gdn_verify_prep_kernel, two_pass._gdn_verify_state_kernel):
        for entry in getattr(fn, "device_caches", {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            for kernel in getattr(cache, "values", lambda: [])():
                try:
                    kernel._init_handles()
                except Exception:
                    pass
                consts = getattr(getattr(kernel, "src", None), "constants", {}) or {}
                named = {}
                for k, v in consts.items():
                    name = k if isinstance(k, str) else fn.arg_names[k[0]] if isinstance(k, tuple) else str(k)
                    if name in keep:
                        named[name] = v
                rows.append(dict(kernel=fn.__name__, regs=getattr(kernel, "n_regs", None),
                                 spills=getattr(kernel, "n_spills", None),
                                 shared=getattr(kernel.metadata, "shared", None),
                                 warps=getattr(kernel.metadata, "num_warps", None), consts=str(named)))
    return rows


NCU_TARGETS = {
    # v4: v2 per-head at batch 1 and the rolled whole-V kernel at batch 32
    "v4": ((1, VerifyConfig(block_v=32)), (32, VerifyConfig(block_v=32, whole_v=True, loop_stages=2)),
           (32, VerifyConfig(block_v=32, whole_v=True)), (32, VerifyConfig(block_v=32, two_pass=True))),
    # session 6 (GB6): final8's b32 pick without PDL (ncu serialises launches), the same with TMA loads
    "gb6": ((32, STATE_DIAG_GB6[1]), (32, STATE_DIAG_GB6[2])),
    "gd11": (),  # session 9: the batch-1 picks at L 16 / 4 and their reconstructions (ncu_b1_target)
}


def ncu_target(gdn, device, target="v4"):
    """Eager launches (each config twice) for Nsight Compute; "gd11": `ncu_b1_target`."""
    if target == "gd11":
        return ncu_b1_target(gdn, device)
    for B, config in NCU_TARGETS[target]:
        s = make_stack(gdn, 16, B, 1, device, seed=1, vllm=False, fla=False)
        run = ours_step(s, accept_counts(16, B, "all", device), reconstruct=False, config=config)
        run()
        torch.cuda.synchronize()
        run()
        torch.cuda.synchronize()


def ncu_b1_target(gdn, device, num_layers=30):
    """Session 9 (GD11), for Nsight Compute: at L 16 then 4, batch 1, one eager verify launch of the tuned pick
    (layer 0 of a `num_layers` stack) and the default reconstruction of all layers (one launch, as in the bench)."""
    for L in (16, 4):
        s = make_stack(gdn, L, 1, num_layers, device, seed=1, vllm=False, fla=False)
        n = accept_counts(L, 1, "all", device)
        config = default_verify_config(1, max_seqlen=L)
        print("ncu target", L, short_config(repr(config)), flush=True)
        layer = 0
        gdn_verify(s["x"][layer], s["a"][layer], s["b"][layer], s["conv_weight"], None, s["A_log"], s["dt_bias"],
                   s["conv"][layer], s["ssm"][layer], s["slots"], s["cu"], s["ws"].layer(layer), max_seqlen=L,
                   out=s["out"][layer], config=config)
        reconstruct_all(s, n, None)
        if ON_GPU:
            torch.cuda.synchronize()
        del s


@triton.jit
def _empty_kernel(p):
    pass


# Session 9 (GD11): the ladder of the L16 b1 pick (early stores off: the stage skips need its plain store path)
B1_DIAG_LADDER_BITS = [0, 1, 2, 4, 8, 1 | 2 | 4 | 8, 16, 32, 16 | 32, 64, 128, 256, 1 | 2 | 4 | 8 | 64 | 128, 512]


def b1_diag(gdn, device, num_layers, rep_ms, out_dir, budget_s):
    """Session 9 (GD11): what a batch-1 layer costs in the bench's 30-layer graph, apart from the verify's chain:
    an empty kernel per layer (1 and 128 programs), the L 16 / 4 picks' launch floor (skip 512: slot read, return),
    the picks whole, their reconstructions, and the leave-one-stage-out ladder of the L16 pick without early stores.
    Rows {name, L, us} printed as they come and saved to gdn_verify_b1_diag.json."""
    t0 = time.time()
    picks = {L: default_verify_config(1, max_seqlen=L) for L in (16, 4)}
    ladder = [dataclasses.replace(picks[16], early_stores=False, skip_stages=bit) for bit in B1_DIAG_LADDER_BITS]
    floors = {L: dataclasses.replace(c, skip_stages=512) for L, c in picks.items()}
    jobs = [(16, c) for c in ladder] + [(L, c) for L, c in picks.items()] + [(L, c) for L, c in floors.items()]
    doc = dict(picks={L: repr(c) for L, c in picks.items()},
               compile=precompile(gdn, list(dict.fromkeys(jobs))) if ON_GPU else [])
    rows = doc["rows"] = []
    save = functools.partial(save_json, doc, Path(out_dir) / "gdn_verify_b1_diag.json")

    record = functools.partial(diag_recorder(rows, t0, budget_s, rep_ms, "b1diag"), per=num_layers)

    buf = torch.zeros(16, device=device)
    for grid, warps in ((1, 1), (128, 4), (128, 8)):
        record(dict(name=f"empty kernel, {grid} programs x {warps} warps"),
               lambda: [_empty_kernel[(grid,)](buf, num_warps=warps) for _ in range(num_layers)])
    for L in (16, 4):
        s = make_stack(gdn, L, 1, num_layers, device, seed=7, vllm=False, fla=False)
        n = accept_counts(L, 1, "all", device)
        record(dict(name="launch floor (pick, skip 512)", L=L, config=repr(floors[L])),
               ours_step(s, n, reconstruct=False, config=floors[L]))
        record(dict(name="verify (pick)", L=L, config=repr(picks[L])), ours_step(s, n, reconstruct=False,
                                                                               config=picks[L]))
        record(dict(name="reconstruction (default)", L=L), ours_step(s, n, verify=False))
        record(dict(name="verify + reconstruction", L=L), ours_step(s, n, config=picks[L]))
        if L == 16:
            for config in ladder:
                record(dict(name="ladder " + LADDER_STAGES.get(config.skip_stages, str(config.skip_stages)), L=L,
                            skip=config.skip_stages, config=repr(config)),
                       ours_step(s, n, reconstruct=False, config=config))
        save()
        del s
    save()
    for r in rows:
        print(f"{r['name'][:48]:48} {r.get('L', ''):>3} {r.get('us', float('nan')):8.3f}")


# ---------------------------------------------------------------------------------------------------------------
# Per-rank shapes under tensor parallelism (session 19): vLLM shards the GDN heads, so a rank of a TP 2 / 4 engine
# verifies Qwen3-Next's layers with 8 / 4 key heads and 16 / 8 value heads. The tuned launch configs were swept at
# 32 value heads (picked by batch alone before session 19, by the rank's work, batch x value heads / 32, since); this
# times, per cell, vLLM's path, ours as shipped, and ours with every tuned batch's verify config and every tuned
# batch's reconstruction launch, so that the pick can be checked against the fastest.

TP_STUDY_SIZES = (2, 4)


def library_recon(num_requests, L):
    """The reconstruction launch gdn_reconstruct runs by default for `num_requests` requests of L tokens (fp32 states):
    the short form where the tuned file marks it faster (L <= SHORT_MAX_LEN), else the general kernel's tuned launch."""
    from hybridspec_kernels.gdn_verify.reconstruct_short import _tuned_short

    short = _tuned_short(num_requests, L) if L <= SHORT_MAX_LEN else None
    if short and short.get("short"):
        return dict(short=True, block_v=short["block_v"], num_warps=short["num_warps"], early=short.get("early", False))
    return dict(default_reconstruct_config(num_requests, L), outer_loop=False)


def tp_study(device, num_layers, rep_ms, out_dir, budget_s, vk, lens=(4, 16), batches=(1, 8, 32, 64),
             base_gdn=QWEN3_NEXT_GDN, tp_sizes=TP_STUDY_SIZES):
    t0 = time.time()
    doc = dict(rows=[], tuned_batches=[], summary={})
    save = functools.partial(save_json, doc, Path(out_dir) / "gdn_verify_tp.json")
    tuned_batches = sorted({int(b) for table in json.loads(TUNED_CONFIGS_FILE.read_text())["verify_by_len"].values()
                            for b in table})
    doc["tuned_batches"] = tuned_batches
    for tp in tp_sizes:
        gdn = dict(base_gdn, num_k_heads=base_gdn["num_k_heads"] // tp, num_v_heads=base_gdn["num_v_heads"] // tp)
        if ON_GPU:
            jobs = list(dict.fromkeys((L, default_verify_config(b, max_seqlen=L)) for L in lens for b in tuned_batches))
            recons = {(L, repr(r)): (L, r) for L in lens for b in tuned_batches for r in [library_recon(b, L)]}
            jobs += list(recons.values())
            doc.setdefault("compile", []).append(dict(tp=tp, jobs=len(jobs), result=precompile(gdn, jobs)))
        for L in lens:
            for B in batches:
                if time.time() - t0 > budget_s:
                    print(f"tp study budget reached, skipping tp {tp} L {L} B {B}", flush=True)
                    continue
                s = make_stack(gdn, L, B, num_layers, device, seed=7, vllm=True, fla=False)
                n = accept_counts(L, B, "all", device)
                row = dict(tp=tp, num_v_heads=gdn["num_v_heads"], L=L, B=B,
                           work_batch=B * gdn["num_v_heads"] / base_gdn["num_v_heads"])
                def timed(key, fn):
                    try:
                        row[key] = round(per_layer_us(fn, rep_ms, num_layers), 3)
                    except Exception as exc:  # a config that cannot run at this shape is reported, not fatal
                        row[f"{key}_error"] = repr(exc)[:200]

                timed("vllm_us", vllm_step(s, n, vk))
                timed("ours_us", ours_step(s, n))
                for b in tuned_batches:
                    config = default_verify_config(b, max_seqlen=L)
                    recon = library_recon(b, L)
                    timed(f"verify_us_as_b{b}", ours_step(s, n, reconstruct=False, config=config))
                    timed(f"recon_us_as_b{b}", ours_step(s, n, verify=False, recon=recon))
                if "vllm_us" not in row or "ours_us" not in row:
                    doc["rows"].append(row)
                    continue
                row["speedup"] = round(row["vllm_us"] / row["ours_us"], 3)
                verify = {b: row[f"verify_us_as_b{b}"] for b in tuned_batches if f"verify_us_as_b{b}" in row}
                recon = {b: row[f"recon_us_as_b{b}"] for b in tuned_batches if f"recon_us_as_b{b}" in row}
                row["fastest_verify_as"] = min(verify, key=verify.get)
                row["fastest_recon_as"] = min(recon, key=recon.get)
                row["best_us"] = round(min(verify.values()) + min(recon.values()), 3)
                row["best_speedup"] = round(row["vllm_us"] / row["best_us"], 3)
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
                save()
                del s
                torch.cuda.empty_cache()
    for r in doc["rows"]:
        doc["summary"][f"speedup_tp{r['tp']}_L{r['L']}_b{r['B']}"] = r.get("speedup")
        doc["summary"][f"best_speedup_tp{r['tp']}_L{r['L']}_b{r['B']}"] = r.get("best_speedup")
    doc["summary"]["measures"] = ("per layer of one tensor-parallel rank (Qwen3-Next's GDN heads / tp), fp32 states, "
                                  "all drafts accepted: speedup = vLLM / ours as shipped (verify + reconstruction); "
                                  "best_speedup = vLLM / (the fastest tuned verify config + the fastest tuned "
                                  "reconstruction launch at this cell)")
    save()


@triton.jit
def _state_rmw_floor_kernel(ssm_ptrs, ssm_ref, state_indices, stride_slot, HVVK: tl.constexpr, K: tl.constexpr,
                            BV: tl.constexpr, INDIRECT: tl.constexpr):
    """The reconstruction's state traffic alone: program (block, request, layer) reads its [BV, K] block, scales it,
    writes it back in place. INDIRECT: the block is found as the reconstruction finds it (layer pointer table, then the
    request's slot: two loads before the block's); else the layer's states are rows 1.. of ssm_ref (no dependent
    load)."""
    i_blk, i_n, i_l = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o = (i_blk * BV + tl.arange(0, BV))[:, None] * K + tl.arange(0, K)[None, :]
    if INDIRECT:
        base = tl.multiple_of(tl.load(ssm_ptrs + i_l).to(tl.pointer_type(ssm_ref.dtype.element_ty)), 16)
        base += tl.load(state_indices + i_n).to(tl.int64) * stride_slot
    else:
        base = ssm_ref + (i_l.to(tl.int64) * tl.num_programs(1) + i_n) * HVVK
    tl.store(base + o, tl.load(base + o) * 0.5)


def recon_floors(gdn, device, num_layers, rep_ms, out_dir, budget_s):
    """Session 9 (GD12): the reconstruction (one launch, every layer) beside floors that move its state bytes in the
    same graph: torch's in-place scale and copy of the states, and a Triton in-place scale with the reconstruction's
    programs ([32, K] blocks, 4 warps) with and without its two dependent loads (layer pointer, slot). Rows {name, L, B,
    us per layer} printed and saved to gdn_verify_recon_floors.json."""
    t0 = time.time()
    doc = dict(rows=[])
    record = diag_recorder(doc["rows"], t0, budget_s, rep_ms, "reconfloor")
    HV, V, K = gdn["num_v_heads"], gdn["head_v_dim"], gdn["head_k_dim"]
    BV = min(32, V)
    for L, B in ((16, 1), (4, 1), (16, 32)):
        s = make_stack(gdn, L, B, num_layers, device, seed=7, vllm=False, fla=False)
        n = accept_counts(L, B, "all", device)
        owned = s["ssm"][:, 1:]  # the requests' slots, every layer (slot 0 is the null block)
        scratch = torch.empty_like(owned)
        dense = torch.randn(num_layers, B, HV, V, K, device=device)
        cell = dict(L=L, B=B, per=num_layers)
        record(dict(name="reconstruction (default launch)", **cell), ours_step(s, n, verify=False))
        record(dict(name="torch in-place scale of the owned slots", **cell), lambda: owned.mul_(0.5))
        record(dict(name="torch copy of the owned slots", **cell), lambda: scratch.copy_(owned))
        for indirect in (True, False):  # first once eagerly: the floor kernel must scale exactly its blocks
            before = (s["ssm"] if indirect else dense).clone()
            _state_rmw_floor_kernel[(HV * V // BV, B, num_layers)](
                s["table"].ssm_ptrs, s["ssm"] if indirect else dense, s["slots"], s["ssm"].stride(1), HVVK=HV * V * K,
                K=K, BV=BV, INDIRECT=indirect, num_warps=4)
            expected = before * 0.5
            if indirect:
                expected[:, 0] = before[:, 0]  # the null slot is nobody's
            assert torch.equal(s["ssm"] if indirect else dense, expected), "floor kernel scaled the wrong blocks"
            record(dict(name=f"triton in-place scale, BV{BV} x 4, {'table + slot loads' if indirect else 'direct'}",
                        **cell),
                   lambda: _state_rmw_floor_kernel[(HV * V // BV, B, num_layers)](
                       s["table"].ssm_ptrs, s["ssm"] if indirect else dense, s["slots"], s["ssm"].stride(1),
                       HVVK=HV * V * K, K=K, BV=BV, INDIRECT=indirect, num_warps=4))
        save_json(doc, Path(out_dir) / "gdn_verify_recon_floors.json")
        del s, owned, scratch, dense
        if ON_GPU:
            torch.cuda.empty_cache()
    for r in doc["rows"]:
        print(f"{r['name'][:60]:60} {r['L']:>3} {r['B']:>3} {r.get('us', float('nan')):9.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 layers (CPU interpreter smoke)")
    parser.add_argument("--out", default=str(EVAL / "results"))
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--lens", default="4,8,12,16")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--rep-ms", type=int, default=40)
    parser.add_argument("--sweep", action="store_true",
                        help="first time launch configs of ours per batch and use the fastest (GPU only)")
    parser.add_argument("--sweep-set", choices=sorted(SWEEP_SETS), default="full",
                        help="final: only the v2 winners and the v3 candidates, default reconstruction")
    parser.add_argument("--write-tuned", default=None,
                        help="write the sweep's fastest verify config per batch here (tuned_verify_configs.json)")
    parser.add_argument("--sweep-lens", default="16",
                        help="verify lengths the sweep times (tuned configs are keyed by (L, batch))")
    parser.add_argument("--no-fold", action="store_true", help="grid without the folded path's columns")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--diagnose", action="store_true",
                        help="v4 diagnosis: stage ladder + launch candidates (GPU), writes gdn_verify_diag.json")
    parser.add_argument("--ladder", action="store_true",
                        help="time the leave-one-stage-out ladder of the b1 winner at L = 4, batch 1 (verify alone)")
    parser.add_argument("--ncu-target", nargs="?", const="v4", choices=sorted(NCU_TARGETS),
                        help="a few eager launches to profile with ncu (default set v4)")
    parser.add_argument("--tp-study", action="store_true",
                        help="per-rank shapes of TP 2 / 4: vLLM, ours as shipped, ours with each tuned batch's picks "
                             "(at --lens and --batches)")
    parser.add_argument("--tp-sizes", default="2,4", help="--tp-study: tensor-parallel sizes (1: unsharded heads)")
    parser.add_argument("--recon-floors", action="store_true",
                        help="session 9 (GD12): the reconstruction beside in-place / copy floors on its state bytes")
    parser.add_argument("--b1-diag", action="store_true",
                        help="session 9: launch floors, the b1 picks, their reconstructions and the L16 b1 ladder")
    parser.add_argument("--state-diag", nargs="?", const="gb", choices=sorted(STATE_DIAG_SETS),
                        help="b32 / b64 prep and state pass apart, floors, candidates: gb (session 5 call 1, the "
                             "default), gb6 (session 6: TMA loads), chunk26 (session 26: the chunked picks at L 17, "
                             "b1 / b32)")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop timing after this many seconds")
    parser.add_argument("--stop-at-s", type=float, default=1e9,
                        help="the grid starts no cell later than this many seconds after the process started")
    parser.add_argument("--precompile", action="store_true",
                        help="compile every sweep config for every length in parallel worker processes first")
    parser.add_argument("--wait-file", default=None,
                        help="before any timing, wait until this file exists (a GPU test run sharing the device)")
    parser.add_argument("--extracted", default=str(EVAL.parent / ".vendor" / "extracted"))
    parser.add_argument("--command", default=None, help="command line to record (default: this one)")
    parser.add_argument("--verify-margin", type=float, default=0.0,
                        help="a verify config outside the sweep set's incumbents (its first configs: the shipped "
                             "picks) becomes a pick only when faster than the best so far by this fraction")
    parser.add_argument("--total-margin", type=float, default=0.0,
                        help="sweep: a verify config outside the set's incumbents replaces them only when faster by "
                             "this fraction of the step's total (incumbent verify + fastest reconstruction)")
    parser.add_argument("--recon-margin", type=float, default=0.0,
                        help="a reconstruction launch replaces the set's first (incumbent) one only when faster by "
                             "this fraction (run-to-run spread: ~2-3 %%)")
    parser.add_argument("--from-log", default=None,
                        help="write the results files from a run's bench.log (its printed grid rows, correctness, "
                             "config errors and sweep lines) when the run ended before writing them; --lens / "
                             "--batches name the grid it was to run (cells without a row: grid_not_run)")
    parser.add_argument("--results-stem", default=None,
                        help="results file stem (default gdn_verify / gdn_verify_bf16_state): e.g. gdn_verify_long for "
                             "a run at other verify lengths beside the committed headline; its summary holds "
                             "speedup_L<L>_b<B> for every grid cell")
    parser.add_argument("--ssm-dtype", choices=sorted(SSM_DTYPES), default="float32",
                        help="every layer's ssm states (ours, vLLM's, FLA's): float32 = the headline (the issue's "
                             "benchmark); bfloat16 = vLLM's default (mamba_ssm_cache_dtype auto), written to "
                             f"{BENCH}_bf16_state.*")
    args = parser.parse_args()
    ssm_dtype = SSM_DTYPES[args.ssm_dtype]
    bench = args.results_stem or bench_name(ssm_dtype)
    if not ON_GPU and ssm_dtype == torch.bfloat16:
        ssm_dtype = torch.float16  # the interpreter computes bf16 wrongly: the CPU smoke runs a 16-bit state of fp16
    if args.write_tuned and ssm_dtype != torch.float32 and Path(args.write_tuned).resolve() == \
            TUNED_CONFIGS_FILE.resolve():
        parser.error("--write-tuned: the shipped tuned file holds the fp32-state picks; write a 16-bit state sweep "
                     "elsewhere")

    device = "cuda" if ON_GPU else "cpu"
    if args.quick:
        gdn, lens, batches, num_layers = TINY_GDN, [4], [3], 2
    else:
        gdn, lens, batches, num_layers = QWEN3_NEXT_GDN, [int(x) for x in args.lens.split(",")], \
            [int(x) for x in args.batches.split(",")], args.layers
    if not ON_GPU:
        fix_interpreter_masks()
    if args.ncu_target:
        return ncu_target(gdn, device, args.ncu_target)
    if args.recon_floors:
        return recon_floors(gdn, device, num_layers, args.rep_ms, args.out, args.budget_s)
    if args.b1_diag:
        return b1_diag(gdn, device, num_layers, args.rep_ms, args.out, args.budget_s)
    if args.diagnose:
        return diagnose(gdn, device, num_layers, args.rep_ms, args.out, args.budget_s)
    if args.state_diag:
        return state_diag(gdn, device, num_layers, args.rep_ms, args.out, args.budget_s,
                          batches=batches if args.quick else (1, 32) if args.state_diag == "chunk26" else (32, 64),
                          seqlen=4 if args.quick else 17 if args.state_diag == "chunk26" else 16,
                          diag_set=args.state_diag)
    if args.tp_study:
        return tp_study(device, num_layers, args.rep_ms, args.out, args.budget_s, load_vllm_kernels(args.extracted),
                        **(dict(lens=(4,), batches=(1, 3), base_gdn=gdn, tp_sizes=(2,)) if args.quick else
                           dict(lens=lens, batches=batches, tp_sizes=[int(x) for x in args.tp_sizes.split(",")])))
    if args.from_log:
        return write_grid_results(args, bench, gdn, ssm_dtype, **grid_from_log(args.from_log, args.lens, args.batches))
    vk = load_vllm_kernels(args.extracted)
    fla_fn, fla_error = load_fla() if ON_GPU else (None, "not run on CPU (FLA not installed in the CPU venv)")
    device_name = torch.cuda.get_device_name() if ON_GPU else "cpu (Triton interpreter)"
    print(f"device {device_name}, layers {num_layers}, gdn {gdn}", flush=True)

    sweep_lens = [int(x) for x in args.sweep_lens.split(",")] if not args.quick else lens
    recon_configs = {"short": SWEEP_RECON_SHORT, "short4": SWEEP_RECON_SHORT4, "short5": SWEEP_RECON_SHORT5,
                     "split6": SWEEP_RECON_SPLIT6, "stacked7": SWEEP_RECON_STACKED7,
                     "bf16state": SWEEP_RECON_STACKED7, "bf16recon": SWEEP_RECON_BF16RECON, "full": SWEEP_RECON,
                     "tma9": SWEEP_RECON_STACKED7, "l2pf10": SWEEP_RECON_STACKED7, "prep13": SWEEP_RECON_STACKED7,
                     "pdl23": SWEEP_RECON_STACKED7, "bf16s24": SWEEP_RECON_STACKED7,
                     "nopdl24": SWEEP_RECON_STACKED7, "long24": SWEEP_RECON_LONG11[:1],
                     "long24bf16": SWEEP_RECON_LONG11[:1], "chunk26": SWEEP_RECON_LONG11[:1],
                     "chunk26bf16": SWEEP_RECON_LONG11[:1],
                     "long11": SWEEP_RECON_LONG11,
                     "long12bf16": SWEEP_RECON_LONG12BF16}.get(
        args.sweep_set, [dict(FALLBACK_RECON, outer_loop=False)])
    if args.precompile and ON_GPU:
        configs = SWEEP_SETS[args.sweep_set]
        jobs = [(L, c, folded) for c in configs for L in distinct_specialisations(lens + sweep_lens + [17])
                for folded in ((False, True) if args.sweep_set == "fold" else (False,))]
        jobs += [(L, r) for r in recon_configs for L in (min(lens + sweep_lens), 17)
                 if L <= SHORT_MAX_LEN or not is_short(r)]
        jobs += [(L, r) for r in recon_configs if is_short(r) and not r.get("early") for L in sorted(set(sweep_lens))
                 if SHORT_MAX_LEN < L <= RANK1_MAX_LEN]  # the rank-1 loop
        if args.ladder:
            jobs += [(4, dataclasses.replace(LADDER_B1_WINNER, skip_stages=bit)) for bit in LADDER_BITS if bit]
        precompile(gdn, jobs, ssm_dtype=ssm_dtype)
    wait_for_file(args.wait_file)
    check = check_correctness(gdn, device, vk, ssm_dtype=ssm_dtype)
    print("correctness", json.dumps(check), flush=True)
    ladder_rows = stage_ladder(gdn, device, num_layers, args.rep_ms) if args.ladder and (ON_GPU or args.quick) else []

    # {L: {batch: config}}: the sweep's fastest per (verify length, batch); the grid takes the nearest measured one
    sweep_rows, best_verify, best_fold, best_recon, config_errs, recon_errs = [], {}, {}, {}, {}, {}
    best_recon_short = {}  # {L <= 4: {batch: {short: faster than the general kernel, block_v, num_warps}}}
    if args.sweep and (ON_GPU or args.quick):
        configs = SWEEP_SETS[args.sweep_set]
        if not ON_GPU:  # CPU smoke of the sweep's code path: two configs of each kind (+ a split form)
            configs = configs[:2] + [c for c in configs[2:] if c.split_gram][:1] + [c for c in configs if c.stacked][:1] \
                + [c for c in configs if c.chunked][:1]
            recon_configs = recon_configs[:2] + [r for r in recon_configs[2:] if is_short(r)][:1]
        wait_for_file(args.wait_file)
        errors, fold_errs = config_errors(gdn, device, configs, folded=args.sweep_set == "fold",
                                          ssm_dtype=ssm_dtype)
        config_errs = {short_config(k): dict(verify=v, fold=fold_errs.get(k)) for k, v in errors.items()}
        print("config errors", json.dumps(config_errs), flush=True)
        recon_errs = recon_errors(gdn, device, recon_configs, ssm_dtype=ssm_dtype)
        print("recon errors", json.dumps(recon_errs), flush=True)
        for L in sweep_lens:
            rows_L, best_verify[L], best_fold_L, best_recon[L], short_L = sweep(
                gdn, device, num_layers, args.rep_ms, batches, seqlen=L, configs=configs,
                recon_configs=recon_configs, errors=errors, fold_errs=fold_errs, folded=args.sweep_set == "fold",
                recon_every_batch=args.sweep_set in ("short", "short4", "short5", "split6", "stacked7", "bf16state",
                                                     "bf16recon", "tma9", "l2pf10", "prep13", "long11",
                                                     "long12bf16", "pdl23", "bf16s24", "nopdl24", "long24",
                                                     "long24bf16", "chunk26", "chunk26bf16"),
                recon_errs=recon_errs, ssm_dtype=ssm_dtype, recon_margin=args.recon_margin,
                verify_margin=args.verify_margin, incumbents=configs[:SWEEP_INCUMBENTS.get(args.sweep_set, 0)],
                total_margin=args.total_margin)
            sweep_rows += rows_L
            if short_L and L <= SHORT_MAX_LEN:  # the rank-1 loop at longer L: sweep rows only, not tuned yet
                best_recon_short[L] = short_L
            if best_fold_L and L == 16:
                best_fold = {16: best_fold_L}
        if args.write_tuned and best_verify:
            write_tuned(args, device_name, ssm_dtype, sweep_lens, best_verify, best_fold, best_recon,
                        best_recon_short)
        for r in sweep_rows:
            print("sweep", r["part"], "L", r["L"], "B", r["B"], r.get("us", r.get("error")), "err",
                  r.get("out_rel_err", r.get("ssm_rel_err")),
                  short_config(r["config"]) if r["part"].startswith("verify") else r["config"], flush=True)

    rows, not_run = [], []
    t_grid = time.time()
    first = [(4, 1), (16, 1), (16, 32)]  # the summary's cells first, in case the time budget ends the grid
    cells = [c for c in first if c[0] in lens and c[1] in batches]
    cells += [(L, B) for L in lens for B in batches if (L, B) not in cells]
    for L, B in cells:
        if time.time() - t_grid > args.budget_s or time.time() - T_START > args.stop_at_s:
            print(f"time budget: grid stopped before L={L} B={B}", flush=True)
            not_run.append([L, B])
            continue
        try:
            s = make_stack(gdn, L, B, num_layers, device, seed=L * 100 + B, fla=fla_fn is not None,
                           ssm_dtype=ssm_dtype)
        except torch.OutOfMemoryError:  # vLLM's per-token conv windows at L 32 b64 over 30 layers: ~64 GiB alone
            print(f"out of memory: grid cell L={L} B={B} not run", flush=True)
            not_run.append([L, B])
            torch.cuda.empty_cache()
            continue
        config = nearest_tuned(best_verify, B, L) or default_verify_config(B, max_seqlen=L)
        # no sweep: None, the library's default path (the wiring's: the tuned file's short form where it claims it)
        recon = nearest_tuned(best_recon, B, L) or (default_recon(s) if best_recon else None)
        short = nearest_tuned(best_recon_short, B, L) if L <= SHORT_MAX_LEN else None
        if short and short["short"]:  # the sweep measured the short form faster here
            recon = dict(short=True, block_v=short["block_v"], num_warps=short["num_warps"],
                         early=short.get("early", False))
        fold_config = nearest_tuned(best_fold, B, L) or default_verify_config(B, folded=True)
        row = dict(L=L, B=B)
        us = functools.partial(per_layer_us, rep_ms=args.rep_ms, num_layers=num_layers)
        for pattern in ("all", "random"):
            n = accept_counts(L, B, pattern, device)
            row[f"vllm_us_{pattern}"] = us(vllm_step(s, n, vk))
            row[f"ours_us_{pattern}"] = us(ours_step(s, n, config=config, recon=recon))
            row[f"speedup_{pattern}"] = row[f"vllm_us_{pattern}"] / row[f"ours_us_{pattern}"]
            if not args.no_fold:
                row[f"ours_folded_us_{pattern}"] = us(ours_fold_step(s, n, config=fold_config), steps=2)
                row[f"speedup_folded_{pattern}"] = row[f"vllm_us_{pattern}"] / row[f"ours_folded_us_{pattern}"]
                row[f"fold_gain_{pattern}"] = row[f"ours_us_{pattern}"] / row[f"ours_folded_us_{pattern}"]
        n = accept_counts(L, B, "all", device)
        row["ours_verify_us"] = us(ours_step(s, n, reconstruct=False, config=config))
        row["ours_reconstruct_us"] = us(ours_step(s, n, verify=False, recon=recon))
        if not args.no_fold:
            row["ours_folded_verify_us"] = us(ours_fold_step(s, n, conv=False, config=fold_config), steps=2)
            row["ours_folded_conv_us"] = us(ours_fold_step(s, n, verify=False), steps=2)
        row["fla_us"] = None
        if fla_fn:
            try:
                row["fla_us"] = time_step(fla_step(s, vk, fla_fn), args.rep_ms) * 1e3 / num_layers
            except Exception as exc:  # reported, not fatal
                fla_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                print("fla failed:", fla_error, flush=True)
                fla_fn = None
        state_b = ssm_dtype.itemsize
        ours_b = sum(bytes_ours(gdn, L, B, n_total=L * B, folded=False, state_dtype_bytes=state_b))
        row["ours_folded_MB"] = sum(bytes_ours(gdn, L, B, n_total=L * B, state_dtype_bytes=state_b)) / 1e6
        row["ours_MB"] = ours_b / 1e6
        row["ours_floor_us"] = ours_b / HBM_BYTES_PER_S * 1e6
        row["ours_TBps"] = ours_b / (row["ours_us_all"] * 1e-6) / 1e12
        vllm_b = bytes_vllm(gdn, L, B, state_dtype_bytes=state_b)
        row["vllm_MB"] = vllm_b / 1e6
        row["vllm_floor_us"] = vllm_b / HBM_BYTES_PER_S * 1e6
        row["vllm_TBps"] = vllm_b / (row["vllm_us_all"] * 1e-6) / 1e12
        row["verify_config"] = repr(config)
        if not args.no_fold:
            row["folded_verify_config"] = repr(fold_config)
        row["reconstruct_config"] = repr(recon)
        rows.append({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
        print(rows[-1], flush=True)
        del s
        if ON_GPU:
            torch.cuda.empty_cache()

    write_grid_results(args, bench, gdn, ssm_dtype, device_name, num_layers, rows, not_run, check, fla_fn, fla_error,
                       ladder_rows, sweep_rows, config_errs)


def grid_from_log(path, lens, batches):
    """write_grid_results' inputs rebuilt from a bench.log: the grid rows (printed as dicts), the correctness and
    config-error lines, and the sweep lines (part, L, B, us or error, error bound, short config)."""
    import ast
    import re

    rows, check, config_errs, sweep_rows, device_name, num_layers = [], {}, {}, [], None, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("device ") and ", layers " in line:
            device_name, rest = line[len("device "):].split(", layers ")
            num_layers = int(rest.split(",")[0])
        elif line.startswith("correctness "):
            check = json.loads(line[len("correctness "):])
        elif line.startswith("config errors "):
            config_errs = json.loads(line[len("config errors "):])
        elif line.startswith("sweep "):
            part, L, B, us, err, config = re.match(r"sweep (\S+) L (\d+) B (\d+) (.*?) err (\S+) (.*)$", line).groups()
            row = dict(part=part, L=int(L), B=int(B), config=config)
            row.update({"us": float(us)} if us[0].isdigit() else {"error": us})
            row["out_rel_err" if part.startswith("verify") else "ssm_rel_err"] = None if err == "None" else float(err)
            sweep_rows.append(row)
        elif line.startswith("{'L': "):
            rows.append(ast.literal_eval(line))
    done = {(r["L"], r["B"]) for r in rows}
    not_run = [[L, B] for L in map(int, lens.split(",")) for B in map(int, batches.split(",")) if (L, B) not in done]
    fla = any(r.get("fla_us") is not None for r in rows)
    return dict(device_name=device_name, num_layers=num_layers, rows=rows, not_run=not_run, check=check,
                fla_fn=fla or None, fla_error=None if fla else "not measured", ladder_rows=[],
                sweep_rows=sweep_rows, config_errs=config_errs)


def write_grid_results(args, bench, gdn, ssm_dtype, device_name, num_layers, rows, not_run, check, fla_fn, fla_error,
                       ladder_rows, sweep_rows, config_errs):
    """The results files of a grid (rows per (L, batch)) with its summary, from a live run or `--from-log`."""
    rows.sort(key=lambda r: (r["L"], r["B"]))
    ws_per_request = GDNVerifyWorkspace.allocate(1, 1, VLLM_NUM_SPEC_FOR_STATE_RATIO + 1, gdn["num_k_heads"],
                                                 gdn["num_v_heads"], gdn["head_k_dim"], gdn["head_v_dim"],
                                                 torch.bfloat16, "cpu").bytes_per_request()
    vllm_state, ours_state = state_bytes_per_request(gdn, ws_per_request, state_dtype_bytes=ssm_dtype.itemsize)

    def speedup(L, B, pattern="all", key="speedup"):
        match = [r for r in rows if r["L"] == L and r["B"] == B]
        return match[0].get(f"{key}_{pattern}") if match else None

    summary = dict(
        speedup_L4_b1=speedup(4, 1), speedup_L16_b1=speedup(16, 1), speedup_L16_b32=speedup(16, 32),
        speedup_L4_b1_random=speedup(4, 1, "random"), speedup_L16_b1_random=speedup(16, 1, "random"),
        speedup_L16_b32_random=speedup(16, 32, "random"),
        state_bytes_ratio=round(vllm_state / ours_state, 3),
        vllm_state_bytes_per_request_per_layer=vllm_state, ours_state_bytes_per_request_per_layer=ours_state,
        ours_workspace_bytes_per_request_per_layer=ws_per_request, ours_workspace_copies=1,
        folded_speedup_L4_b1=speedup(4, 1, key="speedup_folded"),
        folded_speedup_L16_b1=speedup(16, 1, key="speedup_folded"),
        folded_speedup_L16_b32=speedup(16, 32, key="speedup_folded"),
        fold_gain_L4_b1=speedup(4, 1, key="fold_gain"), fold_gain_L16_b1=speedup(16, 1, key="fold_gain"),
        fold_gain_L16_b32=speedup(16, 32, key="fold_gain"),
        measures="speedup_* = vLLM / ours (verify + one ssm/conv reconstruction launch: what the wiring runs); "
                 "folded_speedup_* = the same run's folded path (ssm reconstruction folded into the next verify + "
                 "one conv-only reconstruction; measured, not wired); fold_gain_* = ours / folded time; state "
                 "bytes count one workspace copy (the fold would need two)",
        goals="speedup_L4_b1 >= 3.0, speedup_L16_b1 >= 8.0, speedup_L16_b32 >= 6.0, state_bytes_ratio >= 8",
    )
    if args.results_stem:  # a run beside the headline: every grid cell's speedup, no empty headline keys
        summary = {k: v for k, v in summary.items() if v is not None and k != "goals"}
        for r in rows:
            summary[f"speedup_L{r['L']}_b{r['B']}"] = r["speedup_all"]
            summary[f"speedup_L{r['L']}_b{r['B']}_random"] = r["speedup_random"]
    if args.no_fold:  # the folded path was not timed: no folded keys
        summary = {k: v for k, v in summary.items() if not k.startswith(("folded_", "fold_gain_"))}
        summary["measures"] = ("speedup_* = vLLM / ours (verify + one ssm/conv reconstruction launch: what the wiring "
                               "runs), launch configs tuned per (verify length, batch); state bytes count one "
                               "workspace copy")
    state_name = str(ssm_dtype).replace("torch.", "")
    extra = dict(
        correctness=check, layers=num_layers, gdn_shape=gdn, hbm_bytes_per_s=HBM_BYTES_PER_S, ssm_dtype=state_name,
        ssm_dtype_note=SSM_DTYPE_NOTES.get(state_name, ""),
        fla=("measured: fla-core 0.6.0 fused_recurrent_gated_delta_rule, final state only"
             + ("" if ssm_dtype == torch.float32 else f"; it reads the {state_name} initial state, and its API "
                "always allocates and writes an fp32 final state") if fla_fn else f"not measured: {fla_error}"),
        vllm_cuda_op="vLLM's fused_gdn_decode_post_conv_mtp (CUDA, used when K+1 <= 8 and the batch is all-spec) is "
                     "a compiled vLLM extension; it cannot run without the vLLM wheel's binaries: not measured",
        notes="times are per layer, CUDA-graph replay medians over a stack of layers; ours = verify + one ssm + "
              "conv reconstruction launch for all layers, shared over them (what the wiring runs); ours_folded = "
              "verify with the previous step's ssm update folded in + one conv-only reconstruction launch (two "
              "steps per graph, rows double-buffered); speedup = vLLM / ours",
    )
    if not_run:
        extra["grid_not_run"] = sorted(not_run)
    if ladder_rows:
        extra["ladder"] = ladder_rows
    if sweep_rows:
        extra["sweep"] = sweep_rows
        extra["config_errors"] = config_errs
    command = args.command or "python " + " ".join(sys.argv)
    write_results(bench, rows, summary, command, device_name, out_dir=args.out, extra=extra,
                  markdown=markdown(rows, summary, extra, device_name, command))
    if not args.no_plot:
        plot(rows, Path(args.out) / f"{bench}.png", extra["ssm_dtype"])
    print_table(rows, summary)


def markdown(rows, summary, extra, device_name, command):
    """The run's table; the folded path's columns only when it was timed (not with --no-fold)."""
    folded = any("ours_folded_us_all" in r for r in rows)
    what = ("folded = verify folding the previous step's ssm update in (state read and written once) + one "
            "conv-only reconstruction launch, timed in the same run (not wired); fold gain = ours / folded."
            if folded else "The fold (not wired) was not timed in this run.")
    columns = [("L", "L"), ("batch", "B"), ("vLLM us (all)", "vllm_us_all"), ("ours us (all)", "ours_us_all"),
               ("speedup (all)", "speedup_all"), ("vLLM us (rand)", "vllm_us_random"),
               ("ours us (rand)", "ours_us_random"), ("speedup (rand)", "speedup_random")]
    if folded:
        columns += [("folded us (all)", "ours_folded_us_all"), ("speedup folded (all)", "speedup_folded_all"),
                    ("fold gain (all)", "fold_gain_all"), ("fold gain (rand)", "fold_gain_random")]
    columns += [("ours verify us", "ours_verify_us"), ("ours recon us", "ours_reconstruct_us")]
    if folded:
        columns += [("folded verify us", "ours_folded_verify_us"), ("folded conv recon us", "ours_folded_conv_us")]
    columns += [("FLA us", "fla_us"), ("ours MB", "ours_MB"), ("ours floor us", "ours_floor_us"),
                ("ours TB/s", "ours_TBps"), ("vLLM TB/s", "vllm_TBps")]
    lines = [f"# GDN verification per layer ({device_name}), {extra['ssm_dtype']} ssm states", "", f"`{command}`",
             "", f"State dtype: {extra['ssm_dtype_note']}. Every ssm state of the run (ours, vLLM's slots, FLA's "
             "initial state) has it; the MB / floor columns count it.", "",
             f"{extra['layers']} layers, GDN {extra['gdn_shape']}; CUDA-graph replay medians; speedup = vLLM / ours. "
             "ours = verify + one ssm + conv reconstruction launch for all layers, shared over them (what the "
             "vLLM wiring runs); launch configs = this run's sweep winner of the nearest swept (L, batch), or "
             "without a sweep the tuned file's (reconstruct None: the library's default path, as the wiring calls "
             "it). " + what,
             "", "| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(key)) for _, key in columns) + " |" for r in rows]
    if extra.get("grid_not_run"):
        lines += ["", "Grid cells not run (the run's time limit, --stop-at-s / --budget-s, or out of GPU memory): "
                  + ", ".join(f"L {L} batch {B}" for L, B in extra["grid_not_run"]) + "."]
    lines += ["", "Launch configs of ours per (L, batch):", ""]
    lines += [f"- L {r['L']} batch {r['B']}: verify `{short_config(r['verify_config'])}`, "
              + (f"folded verify `{short_config(r['folded_verify_config'])}`, " if folded else "")
              + f"reconstruct `{r['reconstruct_config']}`" for r in rows]
    if extra.get("ladder"):
        lines += ["", "Stage ladder of the b1 winner (verify alone, one stage left out; outputs wrong, timing only):",
                  "", "| stage left out | skip bits | L | batch | us |", "|---|---|---|---|---|"]
        lines += [f"| {r['stage']} | {r['skip']} | {r['L']} | {r['B']} | {r.get('us', r.get('error'))} |"
                  for r in extra["ladder"]]
    if extra.get("sweep"):
        lines += ["", f"Sweep (us per layer; verify alone, or reconstruction alone; error = bf16 output / "
                  f"{extra['ssm_dtype']} ssm state vs float64, kept below {OUT_TOLERANCE:g} / "
                  f"{extra['correctness']['tolerance_ssm_rel_err']:g}):", "", "| part | L | batch | config | us | error |", "|---|---|---|---|---|---|"]
        for r in extra["sweep"]:
            config = short_config(r["config"]) if r["part"].startswith("verify") else r["config"]
            err = r.get("out_rel_err", r.get("ssm_rel_err"))
            if isinstance(err, dict):  # a folded config: its output and ssm errors
                err = max(v for v in err.values() if isinstance(v, float))
            err = f"{err:.2e}" if isinstance(err, float) else err
            lines.append(f"| {r['part']} | {r['L']} | {r['B']} | `{config}` | "
                         f"{r.get('us', 'failed: ' + r.get('error', '')[:60])} | {err} |")
    lines += ["", "| summary | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in summary.items()
                                                         if v is not None]
    check = extra["correctness"]
    lines += ["", f"Correctness (bf16 output / {extra['ssm_dtype']} ssm state vs float64 from the same state values; "
              f"tolerances {check['tolerance_out_rel_err']:g} / {check['tolerance_ssm_rel_err']:g}, conv windows "
              f"exact: within = {check['within_tolerance']}): `{json.dumps(check)}`", "", f"FLA: {extra['fla']}", "",
              f"vLLM CUDA op: {extra['vllm_cuda_op']}", ""]
    return "\n".join(lines)


def plot(rows, path, ssm_dtype="float32"):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for B in sorted({r["B"] for r in rows}):
        pts = sorted((r["L"], r["speedup_all"]) for r in rows if r["B"] == B)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {B}")
    ax.set_xlabel("verified tokens per request (L)")
    ax.set_ylabel("vLLM time / ours (per layer)")
    ax.set_title(f"GDN verify + reconstruction vs vLLM 0.33, all accepted, {ssm_dtype} ssm states", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_table(rows, summary):
    if not any("ours_folded_us_all" in r for r in rows):
        print(f"{'L':>3} {'B':>3} {'vllm':>8} {'ours':>8} {'x':>6} {'ours_r':>8} {'x_r':>6} {'verify':>7} "
              f"{'recon':>6} {'fla':>7} {'floor':>7} {'TB/s':>5}")
        for r in rows:
            fla = f"{r['fla_us']:7.2f}" if r["fla_us"] is not None else "    n/a"
            print(f"{r['L']:>3} {r['B']:>3} {r['vllm_us_all']:8.2f} {r['ours_us_all']:8.2f} {r['speedup_all']:6.2f} "
                  f"{r['ours_us_random']:8.2f} {r['speedup_random']:6.2f} {r['ours_verify_us']:7.2f} "
                  f"{r['ours_reconstruct_us']:6.2f} {fla} {r['ours_floor_us']:7.2f} {r['ours_TBps']:5.2f}")
        print(json.dumps({k: v for k, v in summary.items() if v is not None and k not in ("measures", "goals")}))
        return
    print(f"{'L':>3} {'B':>3} {'vllm':>8} {'ours':>8} {'x':>6} {'ours_r':>8} {'x_r':>6} {'folded':>8} {'x_f':>6}"
          f" {'gain':>5} {'verify':>7} {'recon':>6} {'f_ver':>7} {'f_conv':>7} {'fla':>7} {'floor':>7} {'TB/s':>5}")
    for r in rows:
        fla = f"{r['fla_us']:7.2f}" if r["fla_us"] is not None else "    n/a"
        print(f"{r['L']:>3} {r['B']:>3} {r['vllm_us_all']:8.2f} {r['ours_us_all']:8.2f} {r['speedup_all']:6.2f} "
              f"{r['ours_us_random']:8.2f} {r['speedup_random']:6.2f} {r['ours_folded_us_all']:8.2f} "
              f"{r['speedup_folded_all']:6.2f} {r['fold_gain_all']:5.2f} {r['ours_verify_us']:7.2f} "
              f"{r['ours_reconstruct_us']:6.2f} {r['ours_folded_verify_us']:7.2f} "
              f"{r['ours_folded_conv_us']:7.2f} {fla} {r['ours_floor_us']:7.2f} {r['ours_TBps']:5.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
