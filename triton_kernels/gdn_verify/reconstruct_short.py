"""Reconstruction for short verify blocks (workspace max_len <= 4): the state update as unrolled rank-1 FMAs.

    S_n = exp(G_{n-1}) S_0 + sum_{s<n} exp(G_{n-1} - G_s) u_s k_s^T          (n <= 4; explicit launches: n <= 16)

The general kernel (reconstruct.py) feeds a [BV, 16] x [16, K] tf32x3 product, so its state block goes through
shared memory into the MMA accumulator layout and is stored from there as scalars; with at most 4 terms the
update is 4 rank-1 FMAs per element, so this form keeps the block in its coalesced load layout (16-byte loads and
stores) and issues every u / k / G load of the 4 tokens before any math. Conv windows: as the general kernel.
An explicit `gdn_reconstruct_short` launch also takes workspaces of up to 16 tokens (one rank-1 update per token,
a static loop): the general kernel's shared-memory round trip of the state block was measured to set its time at
bf16 states (H200, session 5 GB3); the loop form is not timed yet, so no default launch takes it.

`gdn_reconstruct` offers the running-state pass of every plain call (parts="all", default launch config, no
workspace_rows; block-boundary checkpoints, if any, are written before it by the general kernel) to
`reconstruct_short`; it runs this form only where `tuned_verify_configs.json` (measured on this GPU) says it
was faster than the general kernel at the nearest measured batch, else returns False and the general kernel runs.
"""
import torch
import triton
import triton.language as tl

from .verify import _tuned_by_len, nearest_tuned, work_batch
from .workspace import GDNStateTable, GDNVerifyWorkspace, conv_window_after

SHORT_MAX_LEN = 4  # tokens per request the tuned short form serves (the unrolled update has 4 terms)
RANK1_MAX_LEN = 16  # the same form as a static loop of rank-1 updates: an explicit launch only, not tuned yet
FALLBACK_SHORT = dict(block_v=32, num_warps=4, early=False)  # before any sweep: final5's fastest (H200)


@triton.jit
def _token_loads(ws_u, ws_k, ws_g, ws_base, n_rows, s: tl.constexpr, i_hv, i_h, o_v, o_k, HV: tl.constexpr,
                 H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Token s's workspace entries G_s (scalar), u_s [BV], k_s [K]; zeros (no memory read) unless s < n_rows."""
    b_g = tl.load(ws_g + (ws_base + s) * HV + i_hv, mask=s < n_rows, other=0.0)
    b_u = tl.load(ws_u + ((ws_base + s) * HV + i_hv) * V + o_v, mask=(o_v * 0 + s) < n_rows, other=0.0)
    b_k = tl.load(ws_k + ((ws_base + s) * H + i_h) * K + o_k, mask=(o_k * 0 + s) < n_rows, other=0.0)
    return b_g, b_u, b_k


@triton.jit
def _token_terms(b_g, b_u, b_k, b_Gn, n, s: tl.constexpr):
    """Token s's rank-1 factors exp(G_{n-1} - G_s) u_s and k_s, zeros for s >= n (selected, not multiplied: rows
    past n may hold anything, NaN included)."""
    return tl.where((b_u * 0 + s) < n, b_u * tl.exp(b_Gn - b_g), 0.0), tl.where((b_k * 0 + s) < n, b_k, 0.0)


@triton.jit(do_not_specialize=["WS_REQS", "WS_LEN"])
def _gdn_reconstruct_short_kernel(
    ssm_ptrs, conv_ptrs, ssm_ref, conv_ref, state_indices, num_accepted, cu_seqlens,
    ws_u, ws_k, ws_g, ws_x, stride_ssm_slot, stride_conv_slot, WS_REQS, WS_LEN,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BV: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr, ALIGNED: tl.constexpr, EARLY: tl.constexpr,
    NT: tl.constexpr,
):
    """Program (block, request, layer): blocks 0 .. HV*V/BV - 1 are [BV, K] state blocks, the rest conv blocks of
    BD channels. ALIGNED: every table pointer is a multiple of 16 (elements, hence bytes). Slot <= 0 (vLLM's null
    block) or n = 0: nothing is touched; n is clamped to the request's length.

    EARLY: a state program reads all min(4, WS_LEN) workspace tokens (they exist whatever n is) before it knows n,
    so those reads overlap the slot / length / accepted-count reads instead of waiting for them; the terms past n
    are dropped by selection. Otherwise only the n accepted tokens are read, once n is known.

    NT (without EARLY): terms of the update = the workspace length (up to RANK1_MAX_LEN); 4 or fewer as the
    unrolled short form, more as a static loop of rank-1 updates (the rank-1 form at longer verify blocks)."""
    i_blk, i_n, i_l = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ws_base = (i_l.to(tl.int64) * WS_REQS + i_n) * WS_LEN  # workspace row of this request's token 0
    NUM_V_BLOCKS: tl.constexpr = V // BV
    is_state = i_blk < HV * NUM_V_BLOCKS
    i_hv = i_blk // NUM_V_BLOCKS
    i_h = i_hv // (HV // H)
    o_v = (i_blk % NUM_V_BLOCKS) * BV + tl.arange(0, BV)
    o_k = tl.arange(0, K)
    if EARLY:
        rows = tl.where(is_state, WS_LEN, 0)
        g0, u0, k0 = _token_loads(ws_u, ws_k, ws_g, ws_base, rows, 0, i_hv, i_h, o_v, o_k, HV, H, K, V)
        g1, u1, k1 = _token_loads(ws_u, ws_k, ws_g, ws_base, rows, 1, i_hv, i_h, o_v, o_k, HV, H, K, V)
        g2, u2, k2 = _token_loads(ws_u, ws_k, ws_g, ws_base, rows, 2, i_hv, i_h, o_v, o_k, HV, H, K, V)
        g3, u3, k3 = _token_loads(ws_u, ws_k, ws_g, ws_base, rows, 3, i_hv, i_h, o_v, o_k, HV, H, K, V)
    slot = tl.load(state_indices + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n)
    n = tl.minimum(tl.load(num_accepted + i_n), seqlen).to(tl.int64)
    if (slot <= 0) | (n <= 0):
        return
    if is_state:
        ssm = tl.load(ssm_ptrs + i_l).to(tl.pointer_type(ssm_ref.dtype.element_ty))
        if ALIGNED:  # a table pointer's alignment is unknown to the compiler: without this, scalar loads and stores
            ssm = tl.multiple_of(ssm, 16)
        p_h = ssm + slot * stride_ssm_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_h).to(tl.float32)
        if EARLY:
            b_Gn = tl.where(n == 1, g0, tl.where(n == 2, g1, tl.where(n == 3, g2, g3)))
        elif NT > 4:  # the rank-1 form: the block stays in its load layout, one rank-1 update per token below n
            b_Gn = tl.load(ws_g + (ws_base + n - 1) * HV + i_hv)
            b_h *= tl.exp(b_Gn)
            for s in tl.static_range(NT):
                g_s, u_s, k_s = _token_loads(ws_u, ws_k, ws_g, ws_base, n, s, i_hv, i_h, o_v, o_k, HV, H, K, V)
                c_s, e_s = _token_terms(g_s, u_s, k_s, b_Gn, n, s)
                b_h += c_s[:, None] * e_s[None, :]
        else:
            g0, u0, k0 = _token_loads(ws_u, ws_k, ws_g, ws_base, n, 0, i_hv, i_h, o_v, o_k, HV, H, K, V)
            g1, u1, k1 = _token_loads(ws_u, ws_k, ws_g, ws_base, n, 1, i_hv, i_h, o_v, o_k, HV, H, K, V)
            g2, u2, k2 = _token_loads(ws_u, ws_k, ws_g, ws_base, n, 2, i_hv, i_h, o_v, o_k, HV, H, K, V)
            g3, u3, k3 = _token_loads(ws_u, ws_k, ws_g, ws_base, n, 3, i_hv, i_h, o_v, o_k, HV, H, K, V)
            b_Gn = tl.load(ws_g + (ws_base + n - 1) * HV + i_hv)
        if EARLY or NT <= 4:
            c0, e0 = _token_terms(g0, u0, k0, b_Gn, n, 0)
            c1, e1 = _token_terms(g1, u1, k1, b_Gn, n, 1)
            c2, e2 = _token_terms(g2, u2, k2, b_Gn, n, 2)
            c3, e3 = _token_terms(g3, u3, k3, b_Gn, n, 3)
            b_h = b_h * tl.exp(b_Gn) + c0[:, None] * e0[None, :]
            b_h += c1[:, None] * e1[None, :]
            b_h += c2[:, None] * e2[None, :]
            b_h += c3[:, None] * e3[None, :]
        tl.store(p_h, b_h.to(ssm_ref.dtype.element_ty))
    else:
        p_win, m_win, b_win = conv_window_after(conv_ptrs, conv_ref, i_l, slot, slot, stride_conv_slot, ws_x, ws_base,
                                                n, i_blk - HV * NUM_V_BLOCKS, D, W, BD, BW, ALIGNED)
        # In place: every row read before any is stored (conv_window_after says why; seen wrong on the H200).
        tl.debug_barrier()
        tl.store(p_win, b_win, mask=m_win)


def gdn_reconstruct_short(
    states: GDNStateTable,
    workspace: GDNVerifyWorkspace,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    cu_seqlens: torch.Tensor,
    block_v: int | None = None,
    num_warps: int | None = None,
    block_d: int = 512,
    early: bool | None = None,
) -> None:
    """`gdn_reconstruct(parts="all")` in the short form (same arguments and semantics; inputs are expected to be
    checked by `gdn_reconstruct` already, only the form's own limits are checked here): a workspace of max_len <= 4
    as 4 unrolled rank-1 updates, or up to `RANK1_MAX_LEN` as one rank-1 update per workspace token (the state
    block never leaves its load layout). block_v / num_warps / early None: the tuned short launch, else
    `FALLBACK_SHORT` (early: the kernel's EARLY workspace reads, max_len <= 4 only)."""
    if workspace.max_len > RANK1_MAX_LEN:
        raise ValueError(f"the short reconstruction handles workspace max_len <= {RANK1_MAX_LEN}, got "
                         f"{workspace.max_len}")
    tuned = _tuned_short(cu_seqlens.shape[0] - 1, workspace.max_len, states.ssm_states[0].dtype,
                         states.ssm_states[0].shape[1]) or FALLBACK_SHORT
    if workspace.max_len > SHORT_MAX_LEN:  # the tuned table holds launches measured at L <= 4 only
        tuned = FALLBACK_SHORT
    block_v = tuned["block_v"] if block_v is None else block_v
    num_warps = tuned["num_warps"] if num_warps is None else num_warps
    early = tuned.get("early", False) if early is None else early
    if early and workspace.max_len > SHORT_MAX_LEN:
        raise ValueError(f"early workspace reads need workspace max_len <= {SHORT_MAX_LEN}, got {workspace.max_len}")
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    ssm0, conv0 = states.ssm_states[0], states.conv_states[0]
    _, num_v_heads, head_v_dim, head_k_dim = ssm0.shape
    conv_dim = conv0.shape[2]
    num_k_heads = (conv_dim - num_v_heads * head_v_dim) // (2 * head_k_dim)
    block_v = min(block_v, head_v_dim)
    num_requests = cu_seqlens.shape[0] - 1
    if num_requests == 0:
        return
    width = states.conv_width
    grid = (num_v_heads * (head_v_dim // block_v) + triton.cdiv(conv_dim, block_d), num_requests, states.num_layers)
    _gdn_reconstruct_short_kernel[grid](
        states.ssm_ptrs, states.conv_ptrs, ssm0, conv0, state_indices, num_accepted, cu_seqlens,
        workspace.u, workspace.k, workspace.g, workspace.x, ssm0.stride(0), conv0.stride(0),
        workspace.max_requests, workspace.max_len,
        H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=conv_dim, W=width,
        BV=block_v, BD=block_d, BW=max(2, triton.next_power_of_2(width - 1)),
        ALIGNED=states.aligned16, EARLY=early, NT=max(SHORT_MAX_LEN, workspace.max_len), num_warps=num_warps,
    )


def _tuned_short(num_requests, max_len, state_dtype=None, num_v_heads=None):
    """The nearest measured (length, batch) entry of the tuned file's "reconstruct_short_by_len" table (its bf16-state
    table for bf16 states, when it has one; the batch looked up is `work_batch` with num_v_heads): {"short": bool
    (measured faster than the general kernel), "block_v", "num_warps"[, "early"]}; None if absent."""
    return nearest_tuned(_tuned_by_len("reconstruct_short_by_len", state_dtype), work_batch(num_requests, num_v_heads),
                         max_len)


def reconstruct_short(
    states: GDNStateTable,
    workspace: GDNVerifyWorkspace,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> bool:
    """Advance the states as `gdn_reconstruct` does, if this form applies; True when done (inputs already checked).
    Applies when the workspace holds at most 4 tokens per request and the tuned file (measured on this GPU) marks
    the short form faster at the nearest measured batch."""
    if workspace.max_len > SHORT_MAX_LEN:
        return False
    tuned = _tuned_short(cu_seqlens.shape[0] - 1, workspace.max_len, states.ssm_states[0].dtype,
                         states.ssm_states[0].shape[1])
    if not tuned or not tuned.get("short"):
        return False
    gdn_reconstruct_short(states, workspace, state_indices, num_accepted, cu_seqlens, block_v=tuned["block_v"],
                          num_warps=tuned["num_warps"], early=tuned.get("early", False))
    return True
