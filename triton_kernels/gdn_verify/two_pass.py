"""Two-launch form of gdn_verify (v4, `VerifyConfig(two_pass=True)`): the per-k-head chain apart from the state.

    prep   grid (H, B)         q/k conv + L2 norm, Gram products, gates, Neumann inverse of every v-head of the
                               k-head: writes k (workspace), q, M = (I + A)^-1 diag(beta) and attn = decay * (q k^T)
                               [BT, BT] per v-head to a scratch buffer, G (workspace), raw q/k inputs (workspace)
    state  grid (V / VP, HV, B) per value block: S_block [BV, K], v conv, KS = k S^T, QS = q S^T,
                               U = M (V - gamma KS), O = gamma QS + attn U; writes O, u and raw v (workspace)

The single-launch kernel runs the prep chain (a dozen dependent steps through shared memory) in every
(value block, head) program before its state block is touched: at batch 1 that chain and the state load are
serial, at batch 32 the chain holds registers (255 a thread) that the state stream needs. Split, the state pass
is a short load -> 4 products -> store program whose loads all issue up front. The scratch (q and the two
[BT, BT] factors per v-head) is per call, read back from L2.
"""
import torch
import triton
import triton.language as tl

from .._pdl import interpreted
from .verify import (_causal_conv_silu, _conv_math, _conv_taps, _fold_head, _state_block, _value_block,
                     _value_block_math, _value_block_taps)


@triton.jit
def _norm_qk_and_store(b_q, b_k, b_xq, b_xk, ws_k, ws_x, ws_rows, i_n, i_h, o_t, o_k, m_t, WS_LEN, H: tl.constexpr,
                       K: tl.constexpr, D: tl.constexpr, HAS_WS_ROWS: tl.constexpr):
    """The prep's L2-normalised q, k [BT, K] of k-head i_h and each token's workspace row; stores k and the raw q / k
    rows (b_xq, b_xk) of the request's tokens in the workspace."""
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
    if HAS_WS_ROWS:
        ws_row = tl.load(ws_rows + i_n).to(tl.int64) * WS_LEN + o_t
    else:
        ws_row = i_n.to(tl.int64) * WS_LEN + o_t
    tl.store(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_t[:, None])
    tl.store(ws_x + ws_row[:, None] * D + (i_h * K + o_k)[None, :], b_xq, mask=m_t[:, None])
    tl.store(ws_x + ws_row[:, None] * D + ((H + i_h) * K + o_k)[None, :], b_xk, mask=m_t[:, None])
    return b_q, b_k, ws_row


@triton.jit(do_not_specialize=["WS_LEN"])
def _gdn_verify_prep_kernel(
    x, a, b, conv_w, conv_b, A_log, dt_bias, conv_state, state_indices, cu_seqlens, ws_k, ws_g, ws_x, ws_rows, q_hat,
    wy, stride_x, stride_a, stride_b, stride_conv_slot, WS_LEN,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr,
    HPG: tl.constexpr, NEUMANN_STEPS: tl.constexpr, HAS_BIAS: tl.constexpr, BIG_DOT: tl.constexpr,
    SMALL_DOT: tl.constexpr, BW: tl.constexpr, LOADS_FIRST: tl.constexpr, WT: tl.constexpr,
    HAS_WS_ROWS: tl.constexpr,
):
    """Program (k-head, request). Every load is issued before the first cross-thread step (the q/k norms)."""
    i_h, i_n = tl.program_id(0), tl.program_id(1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    if slot <= 0:
        return
    o_t = tl.arange(0, BT)
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    o_j = tl.arange(0, HPG)  # the v-heads of this k-head
    i_hv = i_h * HPG + o_j
    conv_window = conv_state + slot * stride_conv_slot
    # gates of all v-heads of the k-head at once: [BT, HPG]
    b_a = tl.load(a + (bos + o_t)[:, None] * stride_a + i_hv[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
    b_b = tl.load(b + (bos + o_t)[:, None] * stride_b + i_hv[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
    b_a += tl.load(dt_bias + i_hv).to(tl.float32)[None, :]
    b_xq = tl.load(x + (bos + o_t)[:, None] * stride_x + (i_h * K + o_k)[None, :], mask=m_t[:, None], other=0.0)
    b_xk = tl.load(x + (bos + o_t)[:, None] * stride_x + ((H + i_h) * K + o_k)[None, :], mask=m_t[:, None],
                   other=0.0)
    if LOADS_FIRST:
        b_qin, b_qw, b_qb = _conv_taps(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, i_h * K + o_k,
                                       D, W, BW, HAS_BIAS)
        b_kin, b_kw, b_kb = _conv_taps(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t,
                                       (H + i_h) * K + o_k, D, W, BW, HAS_BIAS)
        b_q = _conv_math(b_qin, b_qw, b_qb, m_t)
        b_k = _conv_math(b_kin, b_kw, b_kb, m_t)
    else:
        b_q = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, i_h * K + o_k, D, W,
                                HAS_BIAS, WT)
        b_k = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, (H + i_h) * K + o_k, D, W,
                                HAS_BIAS, WT)
    softplus = tl.where(b_a <= 20.0, tl.log(1.0 + tl.exp(b_a)), b_a)
    b_g = tl.where(m_t[:, None], -tl.exp(tl.load(A_log + i_hv).to(tl.float32))[None, :] * softplus, 0.0)
    b_beta = tl.where(m_t[:, None], tl.sigmoid(b_b), 0.0)
    b_Gs = tl.cumsum(b_g, 0)  # [BT, HPG]

    b_q, b_k, ws_row = _norm_qk_and_store(b_q, b_k, b_xq, b_xk, ws_k, ws_x, ws_rows, i_n, i_h, o_t, o_k, m_t, WS_LEN,
                                          H, K, D, HAS_WS_ROWS)
    tl.store(ws_g + ws_row[:, None] * HV + i_hv[None, :], b_Gs, mask=m_t[:, None])
    tl.store(q_hat + ((i_n * BT + o_t[:, None]) * H + i_h) * K + o_k[None, :], b_q)  # padded rows are zeros
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=BIG_DOT)  # [BT, BT]
    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=BIG_DOT)
    causal = o_t[:, None] >= o_t[None, :]
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    for j in tl.static_range(HPG):
        b_G = tl.sum(tl.where(o_j[None, :] == j, b_Gs, 0.0), 1)
        b_bj = tl.sum(tl.where(o_j[None, :] == j, b_beta, 0.0), 1)
        decay = tl.where(causal, tl.exp(tl.where(causal, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
        b_A = tl.where(o_t[:, None] > o_t[None, :], b_bj[:, None] * decay * b_kk, 0.0)
        b_inv = eye - b_A  # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...
        b_pow = b_A
        for _ in tl.static_range(NEUMANN_STEPS):
            b_pow = tl.dot(b_pow, b_pow, input_precision=SMALL_DOT)
            b_inv = tl.dot(b_inv, eye + b_pow, input_precision=SMALL_DOT)
        p_wy = wy + ((i_n * HV + i_h * HPG + j) * 2 * BT + o_t[:, None]) * BT + o_t[None, :]
        tl.store(p_wy, b_inv * b_bj[None, :])  # M = (I + A)^-1 diag(beta)
        tl.store(p_wy + BT * BT, decay * b_qk)


@triton.jit(do_not_specialize=["scale", "WS_LEN", "F_LEN"])
def _gdn_verify_state_kernel(
    x, conv_w, conv_b, conv_state, ssm_state, state_indices, cu_seqlens, o, ws_u, ws_k, ws_g, ws_x, ws_rows, fu, fk,
    fg, f_rows, f_counts, q_hat, wy, scale, stride_x, stride_conv_slot, stride_ssm_slot, WS_LEN, F_LEN,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, V_PER_PROGRAM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr, STATE_DOT: tl.constexpr, LOOP_STAGES: tl.constexpr,
    BW: tl.constexpr, LOADS_FIRST: tl.constexpr, WT: tl.constexpr, HAS_WS_ROWS: tl.constexpr, FOLD: tl.constexpr,
    BTF: tl.constexpr,
):
    """Program (value span, v-head, request): V_PER_PROGRAM value columns in BV-wide blocks. FOLD: each state block
    is first advanced by the previous step's pending tokens and stored back (see _gdn_verify_kernel)."""
    i_vs, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    o_t = tl.arange(0, BT)
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    if slot <= 0:  # vLLM's null block: a padding row of a CUDA-graph batch
        for i_vb in tl.static_range(V_PER_PROGRAM // BV):
            o_v = i_vs * V_PER_PROGRAM + i_vb * BV + tl.arange(0, BV)
            p_o = o + ((bos + o_t[:, None]) * HV + i_hv) * V + o_v[None, :]
            tl.store(p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty), mask=m_t[:, None])
        return
    i_h = i_hv // (HV // H)
    if HAS_WS_ROWS:
        ws_row = tl.load(ws_rows + i_n).to(tl.int64) * WS_LEN + o_t
    else:
        ws_row = i_n.to(tl.int64) * WS_LEN + o_t
    if FOLD:
        f_n = tl.maximum(tl.minimum(tl.load(f_counts + i_n), F_LEN), 0).to(tl.int64)
        f_base = tl.load(f_rows + i_n).to(tl.int64) * F_LEN
    else:
        f_n = 0
        f_base = 0
    f_kc, f_gamma = _fold_head(fk, fg, f_base, f_n, i_hv, o_k, H, HV, K, BTF, FOLD)
    conv_window = conv_state + slot * stride_conv_slot
    if LOADS_FIRST and V_PER_PROGRAM == BV:  # one block: v taps, G, q/k, factors, then the state block last
        b_xv, b_vin, b_vw, b_vb = _value_block_taps(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot,
                                                    stride_ssm_slot, bos, o_t, m_t, o_k, i_hv, i_vs * BV, HV, K,
                                                    V, D, W, BW, BV, H, HAS_BIAS)
    b_k = tl.load(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None], other=0.0)
    b_q = tl.load(q_hat + ((i_n * BT + o_t[:, None]) * H + i_h) * K + o_k[None, :])
    b_G = tl.load(ws_g + ws_row * HV + i_hv, mask=m_t, other=0.0)
    p_wy = wy + ((i_n * HV + i_hv) * 2 * BT + o_t[:, None]) * BT + o_t[None, :]
    b_m = tl.load(p_wy)
    b_attn = tl.load(p_wy + BT * BT)
    b_gamma = tl.where(m_t, tl.exp(b_G), 0.0)
    b_one = tl.full([BT], 1.0, dtype=tl.float32)
    if STATE_DOT == "bf16":
        b_k = b_k.to(tl.bfloat16)
        b_q = b_q.to(tl.bfloat16)
    elif STATE_DOT == "fp16":
        b_k = b_k.to(tl.float16)
        b_q = b_q.to(tl.float16)
    if LOADS_FIRST and V_PER_PROGRAM == BV:
        b_h = _state_block(ssm_state, slot, stride_ssm_slot, i_hv, i_vs * BV + tl.arange(0, BV), o_k, V, K, fu,
                           f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
        b_v = _conv_math(b_vin, b_vw, b_vb, m_t)
        _value_block_math(b_h, b_v, b_xv, o, ws_u, ws_x, ws_row, bos, o_t, m_t, i_hv, i_vs * BV, b_k, b_q, b_m,
                          b_attn, b_one, b_gamma, scale, HV, K, V, D, BV, H, BIG_DOT, SMALL_DOT, 0)
    elif LOOP_STAGES > 0:
        for i_vb in tl.range(0, V_PER_PROGRAM // BV, num_stages=LOOP_STAGES):
            _value_block(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, o, ws_u, ws_x,
                         ws_row, bos, o_t, m_t, o_k, i_hv, i_vs * V_PER_PROGRAM + i_vb * BV, b_k, b_q, b_m, b_attn,
                         b_one, b_gamma, scale, HV, K, V, D, W, BV, H, HAS_BIAS, BIG_DOT, SMALL_DOT, 0, BW,
                         LOADS_FIRST, WT, fu, f_kc, f_gamma, f_base, f_n, BTF, FOLD)
    else:
        for i_vb in tl.static_range(V_PER_PROGRAM // BV):
            _value_block(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, o, ws_u, ws_x,
                         ws_row, bos, o_t, m_t, o_k, i_hv, i_vs * V_PER_PROGRAM + i_vb * BV, b_k, b_q, b_m, b_attn,
                         b_one, b_gamma, scale, HV, K, V, D, W, BV, H, HAS_BIAS, BIG_DOT, SMALL_DOT, 0, BW,
                         LOADS_FIRST, WT, fu, f_kc, f_gamma, f_base, f_n, BTF, FOLD)


def launch_two_pass(mixed_qkv, a, b, conv_w, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices,
                    cu_seqlens, workspace, out, scale, config, num_k_heads, block_t, neumann_steps, big_dot, small_dot,
                    rows_and_fold, parts=("prep", "state"), scratch=None):
    """The two launches; shapes already checked by gdn_verify. conv_w: [D, W], or [W, D] with config.loads_first
    or config.weight_tiles. Timing only: `parts` runs one of them alone, on a `scratch` = (q_hat, wy) that
    persists between calls (the state pass then reads what an earlier prep wrote)."""
    num_requests = cu_seqlens.shape[0] - 1
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    conv_dim, width = conv_w.shape[::-1] if config.loads_first or config.weight_tiles else conv_w.shape
    heads_per_group = num_v_heads // num_k_heads
    if heads_per_group & (heads_per_group - 1):
        raise ValueError(f"two_pass needs num_v_heads / num_k_heads to be a power of two, got {heads_per_group}")
    q_hat, wy = scratch or two_pass_scratch(out.device, num_requests, num_k_heads, num_v_heads, block_t, head_k_dim)
    if "prep" in parts:
        _gdn_verify_prep_kernel[(num_k_heads, num_requests)](
            mixed_qkv, a, b, conv_w, conv_bias, A_log, dt_bias, conv_state, state_indices, cu_seqlens, workspace.k,
            workspace.g, workspace.x, rows_and_fold["pointers"][0], q_hat, wy, mixed_qkv.stride(0), a.stride(0), b.stride(0), conv_state.stride(0),
            workspace.max_len, H=num_k_heads, HV=num_v_heads, K=head_k_dim, D=conv_dim, W=width, BT=block_t,
            HPG=heads_per_group, NEUMANN_STEPS=neumann_steps, HAS_BIAS=conv_bias is not None, BIG_DOT=big_dot,
            SMALL_DOT=small_dot, BW=triton.next_power_of_2(width), LOADS_FIRST=config.loads_first,
            WT=config.weight_tiles, HAS_WS_ROWS=rows_and_fold["constexprs"]["HAS_WS_ROWS"], num_warps=config.prep_warps,
            **(dict(maxnreg=config.prep_maxnreg) if config.prep_maxnreg and not _interpreting() else {}),
        )
    block_v = min(config.block_v, head_v_dim)
    v_per_program = head_v_dim if config.whole_v else block_v
    if "state" in parts:
        _gdn_verify_state_kernel[(head_v_dim // v_per_program, num_v_heads, num_requests)](
            mixed_qkv, conv_w, conv_bias, conv_state, ssm_state, state_indices, cu_seqlens, out, workspace.u,
            workspace.k, workspace.g, workspace.x, *rows_and_fold["pointers"], q_hat, wy, scale, mixed_qkv.stride(0),
            conv_state.stride(0), ssm_state.stride(0), workspace.max_len, rows_and_fold["fold_len"], H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim,
            D=conv_dim, W=width, BT=block_t, BV=block_v, V_PER_PROGRAM=v_per_program, HAS_BIAS=conv_bias is not None,
            BIG_DOT=big_dot, SMALL_DOT=small_dot, STATE_DOT=config.state_dot, LOOP_STAGES=config.loop_stages,
            BW=triton.next_power_of_2(width), LOADS_FIRST=config.loads_first, WT=config.weight_tiles,
            **rows_and_fold["constexprs"], num_warps=config.num_warps,
        )
    return out


def _interpreting():
    return interpreted(_gdn_verify_prep_kernel)


def two_pass_scratch(device, num_requests, num_k_heads, num_v_heads, block_t, head_k_dim):
    """Per-call scratch: normalised q [B, BT, H, K] and the factors M, attn [B, HV, 2, BT, BT], fp32."""
    return (torch.empty(num_requests, block_t, num_k_heads, head_k_dim, dtype=torch.float32, device=device),
            torch.empty(num_requests, num_v_heads, 2, block_t, block_t, dtype=torch.float32, device=device))
