"""GDN verification for short blocks (max_seqlen <= 4): every product as broadcast FMAs on 4-row tiles.

The general kernel pads a request's tokens to BT = 16 rows, the smallest tensor-core tile, so at L <= 4 three
quarters of its conv, norm and gate work is padding, and each of its eight tl.dot calls stages operands through
shared memory. Here the token axis is 4 wide and the products are explicit broadcast-multiply-sums:

    Gram      kk[t, s] = k_t . k_s, qk[t, s] = q_t . k_s              [4, 4]     (sum over K)
    inverse   (I + A)^-1 = I - A + A^2 - A^3     (A strictly lower triangular 4 x 4: A^4 = 0)
    state     ks[t, v] = k_t . S[v, :], qs[t, v] = q_t . S[v, :]        [4, BV]    (sum over K)
    then      U = (I + A)^-1 diag(beta) (V - diag(exp G) ks),  O = scale (diag(exp G) qs + (decay * qk) U)

One program per (value block, value head, request), every global load issued first (as the hoisted general form
with weight tiles). Same outputs and workspace as `gdn_verify`; the math is in verify.py's docstring.
"""
import triton
import triton.language as tl

from .verify import SHORT_MAX_LEN, _conv4_loads, _conv4_math  # SHORT_MAX_LEN = 4: A^4 = 0 ends the series


@triton.jit
def _mm_small(a, b):
    """[M, J] x [J, N] -> [M, N] as one broadcast-multiply-sum (J small)."""
    return tl.sum(a[:, :, None] * b[None, :, :], 1)


@triton.jit
def _rows_dot(a, b):
    """[M, K] x [N, K] -> [M, N]: a @ b^T as one broadcast-multiply-sum over K."""
    return tl.sum(a[:, None, :] * b[None, :, :], 2)


@triton.jit(do_not_specialize=["scale", "WS_LEN"])
def _gdn_verify_short_kernel(
    x, a, b, conv_wT, conv_b, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
    o, ws_u, ws_k, ws_g, ws_x, scale, stride_x, stride_a, stride_b, stride_conv_slot, stride_ssm_slot, WS_LEN,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Program (value block, value head, request). BT = 4; conv_wT is the transposed [W, D] conv weight."""
    i_vs, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    o_t = tl.arange(0, BT)
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    o_v = i_vs * BV + tl.arange(0, BV)
    p_o = o + ((bos + o_t[:, None]) * HV + i_hv) * V + o_v[None, :]
    if slot <= 0:  # vLLM's null block: a padding row of a CUDA-graph batch
        tl.store(p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty), mask=m_t[:, None])
        return
    conv_window = conv_state + slot * stride_conv_slot
    writer = (i_vs == 0) & (i_hv % (HV // H) == 0)  # one program per k-head writes its k and raw q / k
    m_w = o_t < tl.where(writer, seqlen, 0)

    # every load first: v (raw + taps), gates, raw q / k, q / k taps, the state block last
    o_xv = 2 * H * K + i_hv * V + o_v
    b_xv = tl.load(x + (bos + o_t[:, None]) * stride_x + o_xv[None, :], mask=m_t[:, None], other=0.0)
    v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_ = _conv4_loads(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_xv, D, W)
    b_a = tl.load(a + (bos + o_t) * stride_a + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_b = tl.load(b + (bos + o_t) * stride_b + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_dtb = tl.load(dt_bias + i_hv).to(tl.float32)
    b_alog = tl.load(A_log + i_hv).to(tl.float32)
    b_xq = tl.load(x + (bos + o_t)[:, None] * stride_x + (i_h * K + o_k)[None, :], mask=m_w[:, None], other=0.0)
    b_xk = tl.load(x + (bos + o_t)[:, None] * stride_x + ((H + i_h) * K + o_k)[None, :], mask=m_w[:, None], other=0.0)
    q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_ = _conv4_loads(x, stride_x, conv_window, conv_wT, bos, o_t, m_t,
                                                          i_h * K + o_k, D, W)
    k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_ = _conv4_loads(x, stride_x, conv_window, conv_wT, bos, o_t, m_t,
                                                          (H + i_h) * K + o_k, D, W)
    b_h = tl.load(ssm_state + slot * stride_ssm_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]).to(tl.float32)

    b_q = _conv4_math(q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_, conv_b, o_t, m_t, i_h * K + o_k, HAS_BIAS)
    b_k = _conv4_math(k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_, conv_b, o_t, m_t, (H + i_h) * K + o_k, HAS_BIAS)
    b_v = _conv4_math(v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_, conv_b, o_t, m_t, o_xv, HAS_BIAS)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]

    gate = b_a + b_dtb
    softplus = tl.where(gate <= 20.0, tl.log(1.0 + tl.exp(gate)), gate)
    b_g = tl.where(m_t, -tl.exp(b_alog) * softplus, 0.0)
    b_beta = tl.where(m_t, tl.sigmoid(b_b), 0.0)
    b_G = tl.cumsum(b_g, 0)
    b_gamma = tl.exp(b_G)
    causal = o_t[:, None] >= o_t[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
    b_A = tl.where(o_t[:, None] > o_t[None, :], b_beta[:, None] * decay * _rows_dot(b_k, b_k), 0.0)
    b_A2 = _mm_small(b_A, b_A)
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    b_inv = eye - b_A + b_A2 - _mm_small(b_A2, b_A)
    b_attn = decay * _rows_dot(b_q, b_k)

    b_ks = _rows_dot(b_k, b_h)  # [BT, BV]
    b_qs = _rows_dot(b_q, b_h)
    b_u = _mm_small(b_inv, b_beta[:, None] * (b_v - b_gamma[:, None] * b_ks))
    b_o = b_gamma[:, None] * b_qs + _mm_small(b_attn, b_u)

    tl.store(p_o, (b_o * scale).to(o.dtype.element_ty), mask=m_t[:, None])
    ws_row = i_n.to(tl.int64) * WS_LEN + o_t
    tl.store(ws_u + (ws_row[:, None] * HV + i_hv) * V + o_v[None, :], b_u, mask=m_t[:, None])
    tl.store(ws_x + ws_row[:, None] * D + o_xv[None, :], b_xv, mask=m_t[:, None])
    tl.store(ws_g + ws_row * HV + i_hv, b_G, mask=o_t < tl.where(i_vs == 0, seqlen, 0))
    tl.store(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_w[:, None])
    tl.store(ws_x + ws_row[:, None] * D + (i_h * K + o_k)[None, :], b_xq, mask=m_w[:, None])
    tl.store(ws_x + ws_row[:, None] * D + ((H + i_h) * K + o_k)[None, :], b_xk, mask=m_w[:, None])


def launch_short(mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices,
                 cu_seqlens, workspace, out, scale, block_v, num_warps, num_k_heads):
    """Launch for `gdn_verify` (inputs checked there; max_seqlen <= 4, no workspace_rows, no fold)."""
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    block_v = min(block_v, head_v_dim)
    grid = (head_v_dim // block_v, num_v_heads, cu_seqlens.shape[0] - 1)
    _gdn_verify_short_kernel[grid](
        mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
        out, workspace.u, workspace.k, workspace.g, workspace.x, scale, mixed_qkv.stride(0), a.stride(0),
        b.stride(0), conv_state.stride(0), ssm_state.stride(0), workspace.max_len,
        H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=mixed_qkv.shape[1], W=conv_wT.shape[0],
        BT=SHORT_MAX_LEN, BV=block_v, HAS_BIAS=conv_bias is not None, num_warps=num_warps,
    )
    return out
