"""Two-launch gdn_verify with the state block as the only large MMA operand (`VerifyConfig(stacked=True)`).

    prep   grid (H, B)          q/k conv + L2 norm, Gram products, gates, Neumann inverse of the k-head's HV/H
                                v-heads: writes k, G, raw q/k (workspace), the stacked operand Z = [k; q] [2BT, K]
                                and per v-head the output factors [3BT, 2BT] (scratch)
    state  grid (V / VP, HV, B) per value block of BV columns:
                                P^T = S_block Z^T                 [BV, 2BT]   (KS^T | QS^T: one product)
                                Y^T = P^T F^T + Vc^T E^T          [BV, 2BT]   (U^T | scale O^T)

With Mb = (I + A)^-1 diag(beta), attn = decay * (q k^T), gamma = exp(G) (zero past the request's length):

    Y = [U; scale O] = E Vc + F [KS; QS],   E = [Mb; scale attn Mb]                        [2BT, BT]
                                            F = [[-Mb diag(gamma),            0                 ],
                                                 [-scale attn Mb diag(gamma), scale diag(gamma)]]  [2BT, 2BT]

which is the two-pass form's U = Mb (Vc - gamma KS), O = gamma QS + attn U, written as two products whose left
operands come straight from the first product's result (P^T is the A operand of the second: no trip through
shared memory) and whose right operands are loop-invariant per program. The state block [BV, K] is the A operand
of the first product in its stored (K-contiguous) order; at BV = 64 and 4 warps that is one warp group's wgmma
tile (M = 64), which reads A from shared memory as loaded. Results are [BV, *] tiles whose rows are the value
columns: every store (u, O, raw v) is contiguous along them.

`VerifyConfig(chunked=True)` runs 17..32 tokens as two chunks of 16 (the L = 16 tiles; one chunk of 32 costs 2.6-3.9x
a 16-token verify, eval/notes/gdn_verify.md): the prep builds each chunk's Z and factors in a program of its own (grid
(H, B, 2)), as a verify from the state at the chunk's start; the state pass takes the second chunk's first product
from the committed block too and corrects it by the first chunk's result (`_stacked_second_chunk`), never forming the
state between the chunks. The workspace gets the same u, k and G as one chunk would write: the reconstruction is
unchanged.
"""
import functools
import logging
import math

import torch
import triton
import triton.language as tl

from .._fast_math import sigmoid
from .._log import log_once
from .._pdl import interpreted, pdl_available, wait_for_the_launch_before
from .two_pass import _norm_qk_and_store
from .verify import _causal_conv_silu, _conv4_loads, _conv4_math, pdl_first_launch

logger = logging.getLogger(__name__)

CHUNK_LEN = 16  # tokens per chunk of a chunked verify (`VerifyConfig.chunked`): the L = 16 builds' tiles


@triton.jit(do_not_specialize=["WS_LEN", "scale", "prefetch_requests"])
def _stacked_prep_kernel(
    x, a, b, conv_w, conv_b, A_log, dt_bias, conv_state, state_indices, cu_seqlens, ws_k, ws_g, ws_x, ws_rows, z_kq,
    fac, scale, stride_x, stride_a, stride_b, stride_conv_slot, WS_LEN, ssm_state, stride_ssm_slot, prefetch_requests,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr,
    HPG: tl.constexpr, NEUMANN_STEPS: tl.constexpr, HAS_BIAS: tl.constexpr, BIG_DOT: tl.constexpr,
    SMALL_DOT: tl.constexpr, HAS_WS_ROWS: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr, V: tl.constexpr = 0,
    L2_PREFETCH: tl.constexpr = False, WAIT_BEFORE: tl.constexpr = False, CHUNKS: tl.constexpr = 1,
):
    """Program (k-head, request, chunk): its k, raw q/k and Z, and G and the factors of its HPG v-heads, for the
    chunk's BT tokens (tokens i_c * BT ..; CHUNKS > 1: `VerifyConfig.chunked`). A chunk's factors are those of a
    verify from the state at the chunk's start (its own G, counted from there); the workspace gets G counted from the
    request's first token, as the reconstruction reads it.

    The [BT, BT] factors are built transposed from the start (rows = input token s, columns = output token t, the
    layout the state pass reads), so each is stored row by row with no layout conversion: with A^T[s, t] =
    beta_t exp(G_t - G_s) k_s.k_t (s < t), (I + A)^-T = (I + A^T)^-1 by the same Neumann product, Mb^T = (I + A)^-T
    scaled by beta per row, attn^T[s, t] = exp(G_t - G_s) k_s.q_t (s <= t), (attn Mb)^T = Mb^T attn^T.
    LAUNCH_DEPENDENTS: let a state pass launched with programmatic dependent launch start as soon as every prep
    program runs. L2_PREFETCH: requests i_n < prefetch_requests bulk-prefetch their k-head's HPG v-heads' states
    (HPG * V * K contiguous elements) into L2 once their own input loads have returned, so the HBM, idle while the
    prep's chain runs, fills L2 with what the state pass reads first."""
    # launched by PDL after the launch before it (VerifyConfig.pdl_first): wait for it first, before the state pass,
    # which reads inputs before its own wait, may start
    wait_for_the_launch_before(WAIT_BEFORE)
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    i_h, i_n = tl.program_id(0), tl.program_id(1)
    i_c = tl.program_id(2) if CHUNKS > 1 else 0
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    if slot <= 0:
        return
    if CHUNKS > 1:
        if (i_c > 0) & (i_c * BT >= seqlen):  # a chunk past the request's tokens: the state pass skips it too
            return
    o_l = tl.arange(0, BT)  # row / column of the chunk's tiles
    o_t = i_c * BT + o_l if CHUNKS > 1 else o_l  # token index in the request
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    o_j = tl.arange(0, HPG)
    i_hv = i_h * HPG + o_j
    conv_window = conv_state + slot * stride_conv_slot
    # gates of all v-heads of the k-head, tokens along columns: [HPG, BT]
    b_a = tl.load(a + (bos + o_t)[None, :] * stride_a + i_hv[:, None], mask=m_t[None, :], other=0.0).to(tl.float32)
    b_b = tl.load(b + (bos + o_t)[None, :] * stride_b + i_hv[:, None], mask=m_t[None, :], other=0.0).to(tl.float32)
    b_a += tl.load(dt_bias + i_hv).to(tl.float32)[:, None]
    b_xq = tl.load(x + (bos + o_t)[:, None] * stride_x + (i_h * K + o_k)[None, :], mask=m_t[:, None], other=0.0)
    b_xk = tl.load(x + (bos + o_t)[:, None] * stride_x + ((H + i_h) * K + o_k)[None, :], mask=m_t[:, None],
                   other=0.0)
    if W <= 4:
        b_q = _conv4_math(*_conv4_loads(x, stride_x, conv_window, conv_w, bos, o_t, m_t, i_h * K + o_k, D, W),
                          conv_b, o_t, m_t, i_h * K + o_k, HAS_BIAS)
        b_k = _conv4_math(*_conv4_loads(x, stride_x, conv_window, conv_w, bos, o_t, m_t, (H + i_h) * K + o_k, D, W),
                          conv_b, o_t, m_t, (H + i_h) * K + o_k, HAS_BIAS)
    else:
        b_q = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, i_h * K + o_k, D, W,
                                HAS_BIAS, True)
        b_k = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, (H + i_h) * K + o_k, D, W,
                                HAS_BIAS, True)
    softplus = tl.where(b_a <= 20.0, tl.log(1.0 + tl.exp(b_a)), b_a)
    b_g = tl.where(m_t[None, :], -tl.exp(tl.load(A_log + i_hv).to(tl.float32))[:, None] * softplus, 0.0)
    b_beta = tl.where(m_t[None, :], tl.sigmoid(b_b), 0.0)
    b_Gs = tl.cumsum(b_g, 1)  # [HPG, BT], from the chunk's start
    b_G_request = b_Gs  # from the request's first token: the workspace's G
    for p in tl.static_range(CHUNKS - 1):  # + the sum of g over the earlier chunks' tokens
        m_p = (p * BT + o_l) < tl.where(p < i_c, seqlen, 0)  # chunk p's tokens, none unless it comes first
        b_ap = tl.load(a + (bos + p * BT + o_l)[None, :] * stride_a + i_hv[:, None], mask=m_p[None, :],
                       other=0.0).to(tl.float32) + tl.load(dt_bias + i_hv).to(tl.float32)[:, None]
        b_gp = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))[:, None] * tl.where(b_ap <= 20.0,
                                                                                   tl.log(1.0 + tl.exp(b_ap)), b_ap)
        b_G_request += tl.sum(tl.where(m_p[None, :], b_gp, 0.0), 1)[:, None]

    b_q, b_k, ws_row = _norm_qk_and_store(b_q, b_k, b_xq, b_xk, ws_k, ws_x, ws_rows, i_n, i_h, o_t, o_k, m_t, WS_LEN,
                                          H, K, D, HAS_WS_ROWS)
    if L2_PREFETCH:  # after the inputs are in: the prefetch stream would queue ahead of the prep's own loads
        _bulk_prefetch_l2(ssm_state + slot * stride_ssm_slot + i_h * HPG * V * K,
                          (i_n < prefetch_requests) & (i_c == 0),
                          HPG * V * K * (ssm_state.dtype.element_ty.primitive_bitwidth // 8))
    tl.store(ws_g + ws_row[None, :] * HV + i_hv[:, None], b_G_request, mask=m_t[None, :])
    i_nc = i_n * CHUNKS + i_c if CHUNKS > 1 else i_n  # the chunk's index in the scratch
    p_z = z_kq + ((i_nc * H + i_h) * 2 * BT + o_l[:, None]) * K + o_k[None, :]
    tl.store(p_z, b_k)  # padded rows are zeros
    tl.store(p_z + BT * K, b_q)
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=BIG_DOT)  # [BT, BT], symmetric
    b_kq = tl.dot(b_k, tl.trans(b_q), input_precision=BIG_DOT)  # [s, t] = k_s.q_t
    causal_t = o_l[:, None] <= o_l[None, :]  # s <= t
    eye = tl.where(o_l[:, None] == o_l[None, :], 1.0, 0.0)
    p_f = fac + ((i_nc * HV + i_h * HPG) * 3 * BT + o_l[:, None]) * 2 * BT + o_l[None, :]  # F^T, E^T rows
    for j in tl.static_range(HPG):
        b_G = tl.sum(tl.where(o_j[:, None] == j, b_Gs, 0.0), 0)
        b_bj = tl.sum(tl.where(o_j[:, None] == j, b_beta, 0.0), 0)
        b_gamma = tl.where(m_t, tl.exp(b_G), 0.0)
        decay = tl.where(causal_t, tl.exp(tl.where(causal_t, b_G[None, :] - b_G[:, None], 0.0)), 0.0)  # [s, t]
        b_A = tl.where(o_l[:, None] < o_l[None, :], b_bj[None, :] * decay * b_kk, 0.0)  # A^T
        b_inv = eye - b_A  # (I + A^T)^-1 = (I - A^T)(I + A^T^2)(I + A^T^4)...
        b_pow = b_A
        for _ in tl.static_range(NEUMANN_STEPS):
            b_pow = tl.dot(b_pow, b_pow, input_precision=SMALL_DOT)
            b_inv = tl.dot(b_inv, eye + b_pow, input_precision=SMALL_DOT)
        b_mb = b_inv * b_bj[:, None]  # Mb^T[s, t]
        b_am = tl.dot(b_mb, decay * b_kq, input_precision=SMALL_DOT) * scale  # (scale attn Mb)^T
        p_fj = p_f + j * 3 * BT * 2 * BT
        tl.store(p_fj, -b_mb * b_gamma[:, None])  # KS -> U
        tl.store(p_fj + BT, -b_am * b_gamma[:, None])  # KS -> O
        tl.store(p_fj + BT * 2 * BT, eye * 0.0)  # QS -> U
        tl.store(p_fj + BT * 2 * BT + BT, eye * (scale * b_gamma)[None, :])  # QS -> O
        tl.store(p_fj + 2 * BT * 2 * BT, b_mb)  # Vc -> U
        tl.store(p_fj + 2 * BT * 2 * BT + BT, b_am)  # Vc -> O


@triton.jit
def _conv_silu_t(x, stride_x, conv_window, conv_wT, conv_b, bos, o_t, m_t, o_c, D: tl.constexpr, W: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    """[C, BT] = silu(causal depth-W conv)^T over channels o_c (`_causal_conv_silu` with channels as rows, the
    layout the state pass's stores want); conv_wT is the [W, D] transposed weight."""
    acc = tl.zeros([o_c.shape[0], o_t.shape[0]], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(conv_b + o_c).to(tl.float32)[:, None]
    for j in tl.static_range(W):
        src = o_t + (j - (W - 1))  # token index; negative indices live in the committed window
        # one load a tap: each token's row from x, or from the committed window for negative token indices
        p_in = tl.where((src >= 0)[None, :], x + (bos + src)[None, :] * stride_x + o_c[:, None],
                        conv_window + (src + (W - 1))[None, :] * D + o_c[:, None])
        b_in = tl.load(p_in, mask=m_t[None, :], other=0.0)
        acc += b_in.to(tl.float32) * tl.load(conv_wT + j * D + o_c).to(tl.float32)[:, None]
    acc = acc * sigmoid(acc)
    return tl.where(m_t[None, :], acc, 0.0)


@triton.jit(do_not_specialize=["WS_LEN", "prefetch_ahead"])
def _stacked_state_kernel(
    x, conv_w, conv_b, conv_state, ssm_state, state_indices, cu_seqlens, o, ws_u, ws_x, ws_rows, z_kq, fac,
    stride_x, stride_conv_slot, stride_ssm_slot, WS_LEN, state_desc, z_desc, prefetch_ahead,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, V_PER_PROGRAM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr, LOOP_STAGES: tl.constexpr, HAS_WS_ROWS: tl.constexpr,
    WAIT_PREP: tl.constexpr, TMA_LOADS: tl.constexpr = 0, L2_AHEAD: tl.constexpr = False, ws_g=None,
    CHUNKS: tl.constexpr = 1,
):
    """Program (value span, v-head, request): V_PER_PROGRAM value columns in BV-wide blocks. WAIT_PREP (one block
    per program, launched with programmatic dependent launch after the prep): the program loads its state block
    and v inputs, then waits for the prep grid (griddepcontrol.wait) before reading Z and the factors. TMA_LOADS
    (2 or 3, the rank of the state descriptor's box; `_tma_descriptors`): the state block and Z, the first product's
    shared-memory operands, come through host tensor descriptors, one TMA copy each instead of per-thread loads staged
    through registers; the factors stay pointer loads (their tf32x3 split needs them in registers). L2_AHEAD: the
    program bulk-prefetches into L2 the state span of the program `prefetch_ahead` launch positions after it (about
    one wave later), after issuing its own state-block load, so the next wave's state reads hit L2. CHUNKS 2
    (`VerifyConfig.chunked`): tokens BT .. 2BT-1 of a request longer than BT are a second chunk, verified from the
    block's state after the first without forming it (`_stacked_second_chunk`)."""
    tl.static_assert(CHUNKS <= 2, "the state pass verifies at most two chunks")
    i_vs, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    o_c = tl.arange(0, 2 * BT)  # output column: U token c (c < BT) or O token c - BT
    o_t = tl.arange(0, BT)
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    t_c = tl.where(o_c < BT, o_c, o_c - BT)
    m_c = t_c < seqlen
    p_o_col = ((bos + t_c) * HV + i_hv) * V  # [2BT]
    if slot <= 0:  # vLLM's null block: a padding row of a CUDA-graph batch
        for i_vb in tl.static_range(V_PER_PROGRAM // BV):
            o_v = i_vs * V_PER_PROGRAM + i_vb * BV + tl.arange(0, BV)
            tl.store(o + p_o_col[None, :] + o_v[:, None], tl.zeros([BV, 2 * BT], dtype=o.dtype.element_ty),
                     mask=(m_c & (o_c >= BT))[None, :])
            if CHUNKS == 2:
                tl.store(o + p_o_col[None, :] + BT * HV * V + o_v[:, None],
                         tl.zeros([BV, 2 * BT], dtype=o.dtype.element_ty),
                         mask=((t_c + BT < seqlen) & (o_c >= BT))[None, :])
        return
    i_h = i_hv // (HV // H)
    if HAS_WS_ROWS:
        ws_base = tl.load(ws_rows + i_n).to(tl.int64) * WS_LEN
    else:
        ws_base = i_n.to(tl.int64) * WS_LEN
    ws_t = ws_base + o_t
    p_u_col = ((ws_base + t_c) * HV + i_hv) * V  # [2BT]
    conv_window = conv_state + slot * stride_conv_slot
    p_state = ssm_state + slot * stride_ssm_slot + i_hv * V * K
    i_nc = i_n * CHUNKS  # the request's first chunk in the scratch
    p_zt = z_kq + ((i_nc * H + i_h) * 2 * BT + o_c[None, :]) * K + o_k[:, None]  # Z^T [K, 2BT]
    p_fac = fac + ((i_nc * HV + i_hv) * 3 * BT + o_c[:, None]) * 2 * BT + o_c[None, :]  # F^T [2BT, 2BT]
    p_et = fac + ((i_nc * HV + i_hv) * 3 * BT + 2 * BT + o_t[:, None]) * 2 * BT + o_c[None, :]  # E^T [BT, 2BT]
    z_row = ((i_nc * H + i_h) * 2 * BT).to(tl.int32)  # the k-head's rows of Z in the descriptor's 2-D view
    AHEAD_BYTES: tl.constexpr = V_PER_PROGRAM * K * (ssm_state.dtype.element_ty.primitive_bitwidth // 8)
    if L2_AHEAD:  # the target's slot is read now: a prefetch that waited for it would hold back the program's loads
        p_ahead, ahead_on = _program_ahead(ssm_state, state_indices, stride_ssm_slot, i_vs, i_hv, i_n, prefetch_ahead,
                                           HV, V, K, V_PER_PROGRAM)
    if WAIT_PREP:  # one block: state and v loads issued before waiting for the prep grid (its results come after)
        o_v = i_vs * BV + tl.arange(0, BV)
        if not TMA_LOADS:
            b_h = _state_block_load(p_state, state_desc, slot, i_hv * V + i_vs * BV, o_v, o_k, HV, V, K, BV, 0)
        o_xv = 2 * H * K + i_hv * V + o_v
        b_xv = tl.load(x + (bos + o_t[None, :]) * stride_x + o_xv[:, None], mask=m_t[None, :], other=0.0)
        b_vc = _conv_silu_t(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, o_xv, D, W, HAS_BIAS)
        tl.store(ws_x + ws_t[None, :] * D + o_xv[:, None], b_xv, mask=m_t[None, :])
        if TMA_LOADS:  # after the v loads are issued: a descriptor load waits for its copy right away
            b_h = _state_block_load(p_state, state_desc, slot, i_hv * V + i_vs * BV, o_v, o_k, HV, V, K, BV,
                                    TMA_LOADS)
        if L2_AHEAD:  # after the program's own state block is on its way
            _bulk_prefetch_l2(p_ahead, ahead_on, AHEAD_BYTES)
        tl.extra.cuda.gdc_wait()
        if TMA_LOADS:  # the factors' loads first: a descriptor load waits for its copy right after issuing it
            b_ft = tl.load(p_fac)
            b_et = tl.load(p_et)
        if CHUNKS == 2:  # the second chunk's first product from the committed block as well: S_0 Z2^T
            b_pt2 = tl.dot(b_h, _chunk_z(z_kq, z_desc, i_nc + 1, i_h, o_c, o_k, H, K, BT, TMA_LOADS, True),
                           input_precision=BIG_DOT)
        if TMA_LOADS:
            b_y = _stacked_block(b_h, b_vc, tl.trans(z_desc.load([z_row, 0])), b_ft, b_et, o, ws_u, p_o_col, p_u_col,
                                 o_v, o_c, m_c, BT, BIG_DOT, SMALL_DOT)
        else:
            b_y = _stacked_block(b_h, b_vc, tl.load(p_zt), tl.load(p_fac), tl.load(p_et), o, ws_u, p_o_col, p_u_col,
                                 o_v, o_c, m_c, BT, BIG_DOT, SMALL_DOT)
        if CHUNKS == 2:
            if seqlen > BT:
                _stacked_second_chunk(b_pt2, b_y, x, stride_x, conv_window, conv_w, conv_b, o, ws_u, ws_x, ws_g, z_kq,
                                      fac, z_desc, bos, seqlen, ws_base, i_nc, i_h, i_hv, o_v, o_t, o_c, t_c, o_k, H,
                                      HV, K, V, D, W, BT, HAS_BIAS, BIG_DOT, SMALL_DOT, TMA_LOADS)
    else:
        if L2_AHEAD:
            _bulk_prefetch_l2(p_ahead, ahead_on, AHEAD_BYTES)
        if TMA_LOADS:
            b_ft = tl.load(p_fac)
            b_et = tl.load(p_et)
            b_zt = tl.trans(z_desc.load([z_row, 0]))
        else:
            b_zt = tl.load(p_zt)
            b_ft = tl.load(p_fac)
            b_et = tl.load(p_et)
        for i_vb in tl.range(0, V_PER_PROGRAM // BV, num_stages=LOOP_STAGES):
            o_v = i_vs * V_PER_PROGRAM + i_vb * BV + tl.arange(0, BV)
            b_h = _state_block_load(p_state, state_desc, slot, i_hv * V + i_vs * V_PER_PROGRAM + i_vb * BV, o_v, o_k,
                                    HV, V, K, BV, TMA_LOADS)
            o_xv = 2 * H * K + i_hv * V + o_v
            b_xv = tl.load(x + (bos + o_t[None, :]) * stride_x + o_xv[:, None], mask=m_t[None, :], other=0.0)
            b_vc = _conv_silu_t(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, o_xv, D, W, HAS_BIAS)
            if CHUNKS == 2:
                b_pt2 = tl.dot(b_h, _chunk_z(z_kq, z_desc, i_nc + 1, i_h, o_c, o_k, H, K, BT, TMA_LOADS, True),
                               input_precision=BIG_DOT)
            b_y = _stacked_block(b_h, b_vc, b_zt, b_ft, b_et, o, ws_u, p_o_col, p_u_col, o_v, o_c, m_c, BT, BIG_DOT,
                                 SMALL_DOT)
            tl.store(ws_x + ws_t[None, :] * D + o_xv[:, None], b_xv, mask=m_t[None, :])
            if CHUNKS == 2:
                if seqlen > BT:
                    _stacked_second_chunk(b_pt2, b_y, x, stride_x, conv_window, conv_w, conv_b, o, ws_u, ws_x, ws_g,
                                          z_kq, fac, z_desc, bos, seqlen, ws_base, i_nc, i_h, i_hv, o_v, o_t, o_c,
                                          t_c, o_k, H, HV, K, V, D, W, BT, HAS_BIAS, BIG_DOT, SMALL_DOT, TMA_LOADS)


@triton.jit
def _state_block_load(p_state, state_desc, slot, row, o_v, o_k, HV: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
                      BV: tl.constexpr, TMA_LOADS: tl.constexpr):
    """[BV, K] fp32 state block: rows `row` .. `row` + BV of the slot's [HV * V, K] state through a 2-D (all slots as
    one matrix) or 3-D (slot, row, k) descriptor (TMA_LOADS 2 / 3), or the same rows o_v of the v-head's block at
    p_state through pointers (0)."""
    if TMA_LOADS == 2:  # slots contiguous: one [slots * HV * V, K] matrix
        return state_desc.load([(slot * (HV * V) + row).to(tl.int32), 0]).to(tl.float32)
    if TMA_LOADS == 3:
        return state_desc.load([slot.to(tl.int32), row, 0]).reshape(BV, K).to(tl.float32)
    return tl.load(p_state + o_v[:, None] * K + o_k[None, :]).to(tl.float32)


@triton.jit
def _bulk_prefetch_l2(ptr, enabled, NBYTES: tl.constexpr):
    """Start bringing NBYTES contiguous bytes at ptr (16-byte aligned; NBYTES a power of two >= 16) into L2:
    threads 0 .. n-1 each issue one cp.async.bulk.prefetch.L2 of a <= 16 KiB chunk (the TMA unit fetches it; no
    register, barrier or later instruction waits for it); nothing when `enabled` is false."""
    NCHUNKS: tl.constexpr = (NBYTES + 16383) // 16384
    num_chunks = tl.where(enabled, NCHUNKS, 0).to(tl.int32)
    tl.inline_asm_elementwise(
        """{
        .reg .pred %pf_on;
        .reg .u32 %pf_tid;
        .reg .u64 %pf_at;
        mov.u32 %pf_tid, %tid.x;
        setp.lt.u32 %pf_on, %pf_tid, $2;
        mul.wide.u32 %pf_at, %pf_tid, $3;
        add.u64 %pf_at, %pf_at, $1;
        @%pf_on cp.async.bulk.prefetch.L2.global [%pf_at], $3;
        mov.u32 $0, 0;
        }""", "=r,l,r,r", [ptr.to(tl.int64, bitcast=True), num_chunks, num_chunks * 0 + NBYTES // NCHUNKS],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _program_ahead(ssm_state, state_indices, stride_ssm_slot, i_vs, i_hv, i_n, ahead, HV: tl.constexpr,
                   V: tl.constexpr, K: tl.constexpr, V_PER_PROGRAM: tl.constexpr):
    """(start of the state span, whether to prefetch it) of the program `ahead` launch positions after (i_vs, i_hv,
    i_n) in the grid's linear order: V_PER_PROGRAM rows of K; not past the grid, not for a null slot."""
    NVS: tl.constexpr = V // V_PER_PROGRAM
    target = (i_vs + NVS * (i_hv + HV * i_n)).to(tl.int64) + ahead
    t_n = target // (NVS * HV)
    in_grid = t_n < tl.num_programs(2)
    t_slot = tl.load(state_indices + tl.where(in_grid, t_n, 0)).to(tl.int64)
    t_row = (target % (NVS * HV)) // NVS * V + (target % NVS) * V_PER_PROGRAM
    return ssm_state + t_slot * stride_ssm_slot + t_row * K, in_grid & (t_slot > 0)


@triton.jit
def _stacked_block(b_h, b_vc, b_zt, b_ft, b_et, o, ws_u, p_o_col, p_u_col, o_v, o_c, m_c, BT: tl.constexpr,
                   BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr):
    """One value block: P^T = S Z^T, then `_stacked_factors`."""
    b_pt = tl.dot(b_h, b_zt, input_precision=BIG_DOT)  # [BV, 2BT]
    return _stacked_factors(b_pt, b_vc, b_ft, b_et, o, ws_u, p_o_col, p_u_col, o_v, o_c, m_c, BT, SMALL_DOT)


@triton.jit
def _stacked_factors(b_pt, b_vc, b_ft, b_et, o, ws_u, p_o_col, p_u_col, o_v, o_c, m_c, BT: tl.constexpr,
                     SMALL_DOT: tl.constexpr):
    """Y^T = P^T F^T + Vc^T E^T [BV, 2BT]; stores u (columns < BT) and O (the rest); returns Y^T."""
    b_y = tl.dot(b_vc, b_et, input_precision=SMALL_DOT)
    b_y = tl.dot(b_pt, b_ft, acc=b_y, input_precision=SMALL_DOT)
    tl.store(ws_u + p_u_col[None, :] + o_v[:, None], b_y, mask=(m_c & (o_c < BT))[None, :])
    tl.store(o + p_o_col[None, :] + o_v[:, None], b_y.to(o.dtype.element_ty), mask=(m_c & (o_c >= BT))[None, :])
    return b_y


@triton.jit
def _chunk_z(z_kq, z_desc, i_chunk, i_h, o_c, o_k, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
             TMA_LOADS: tl.constexpr, TRANS: tl.constexpr):
    """Z = [k; q] [2BT, K] of k-head i_h in scratch chunk i_chunk (TRANS: Z^T [K, 2BT])."""
    if TMA_LOADS:
        b_z = z_desc.load([((i_chunk * H + i_h) * 2 * BT).to(tl.int32), 0])
    else:
        b_z = tl.load(z_kq + ((i_chunk * H + i_h) * 2 * BT + o_c[:, None]) * K + o_k[None, :])
    if TRANS:
        b_z = tl.trans(b_z)
    return b_z


@triton.jit
def _stacked_second_chunk(b_pt2, b_y, x, stride_x, conv_window, conv_w, conv_b, o, ws_u, ws_x, ws_g, z_kq, fac,
                          z_desc, bos, seqlen, ws_base, i_nc, i_h, i_hv, o_v, o_t, o_c, t_c, o_k, H: tl.constexpr,
                          HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
                          BT: tl.constexpr, HAS_BIAS: tl.constexpr, BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr,
                          TMA_LOADS: tl.constexpr):
    """Tokens BT .. 2BT-1 of a request longer than BT (the first chunk full), verified from the block's state after
    the first chunk, S_BT = exp(G_{BT-1}) S_0 + U^T diag(d) K (d_s = exp(G_{BT-1} - G_s), the reconstruction's
    update), without forming it: its product with the second chunk's Z2 is
        S_BT Z2^T = exp(G_{BT-1}) S_0 Z2^T + [U^T | scale O^T] C,   C = [diag(d) K Z2^T; 0]   [2BT, 2BT],
    from b_pt2 = S_0 Z2^T (taken with the first chunk's product) and the first chunk's result b_y [BV, 2BT]. A
    [BV, K] state held from one chunk to the next (the first build) took twice the registers and ran the state pass
    at 3x the L 16 one. Then the first chunk's steps on the second chunk's factors (scratch chunk i_nc + 1)."""
    b_G = tl.load(ws_g + (ws_base + t_c) * HV + i_hv)  # G of the first chunk's token t_c (prep, from token 0)
    b_G_last = tl.load(ws_g + (ws_base + BT - 1) * HV + i_hv)
    b_decay = tl.where(o_c < BT, tl.exp(b_G_last - b_G), 0.0)  # [2BT]: k rows decayed, q rows out
    b_c = tl.dot(_chunk_z(z_kq, z_desc, i_nc, i_h, o_c, o_k, H, K, BT, TMA_LOADS, False) * b_decay[:, None],
                 _chunk_z(z_kq, z_desc, i_nc + 1, i_h, o_c, o_k, H, K, BT, TMA_LOADS, True),
                 input_precision=BIG_DOT)  # C [2BT, 2BT]
    b_pt2 = b_pt2 * tl.exp(b_G_last) + tl.dot(b_y, b_c, input_precision=SMALL_DOT)
    o_t2 = BT + o_t
    m_t2 = o_t2 < seqlen
    t_c2 = BT + t_c
    o_xv = 2 * H * K + i_hv * V + o_v
    b_xv = tl.load(x + (bos + o_t2[None, :]) * stride_x + o_xv[:, None], mask=m_t2[None, :], other=0.0)
    b_vc = _conv_silu_t(x, stride_x, conv_window, conv_w, conv_b, bos, o_t2, m_t2, o_xv, D, W, HAS_BIAS)
    tl.store(ws_x + (ws_base + o_t2[None, :]) * D + o_xv[:, None], b_xv, mask=m_t2[None, :])
    i_c2 = i_nc + 1
    b_ft = tl.load(fac + ((i_c2 * HV + i_hv) * 3 * BT + o_c[:, None]) * 2 * BT + o_c[None, :])
    b_et = tl.load(fac + ((i_c2 * HV + i_hv) * 3 * BT + 2 * BT + o_t[:, None]) * 2 * BT + o_c[None, :])
    _stacked_factors(b_pt2, b_vc, b_ft, b_et, o, ws_u, ((bos + t_c2) * HV + i_hv) * V,
                     ((ws_base + t_c2) * HV + i_hv) * V, o_v, o_c, t_c2 < seqlen, BT, SMALL_DOT)


def launch_stacked(mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices,
                   cu_seqlens, workspace, out, scale, config, num_k_heads, block_t, neumann_steps, big_dot, small_dot,
                   rows_and_fold, parts=("prep", "state"), scratch=None):
    """The two launches (shapes already checked by gdn_verify; conv_wT is the cached [W, D] transposed weight).
    Timing only: `parts` runs one of them alone, on a `scratch` = `stacked_scratch(...)` that persists between
    calls (the state pass then reads what an earlier prep wrote; with `chunked` at L > 16, made for num_requests *
    chunks requests of CHUNK_LEN tokens)."""
    num_requests = cu_seqlens.shape[0] - 1
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    width, conv_dim = conv_wT.shape
    heads_per_group = num_v_heads // num_k_heads
    if heads_per_group & (heads_per_group - 1):
        raise ValueError(f"stacked needs num_v_heads / num_k_heads to be a power of two, got {heads_per_group}")
    chunks, block_t, neumann_steps = chunk_plan(config, block_t, neumann_steps)
    z_kq, fac = scratch or stacked_scratch(out.device, num_requests * chunks, num_k_heads, num_v_heads, block_t,
                                           head_k_dim)
    has_rows = rows_and_fold["constexprs"]["HAS_WS_ROWS"]
    pdl = config.pdl and "prep" in parts and "state" in parts and pdl_available(out.device, _stacked_state_kernel)
    prep_opts = dict(maxnreg=config.prep_maxnreg) if config.prep_maxnreg and not _interpreting() else {}
    ws_rows = rows_and_fold["pointers"][0]
    prefetch_requests, prefetch_ahead = l2_prefetch_plan(config, ssm_state, num_requests)
    if "prep" in parts:
        _stacked_prep_kernel[(num_k_heads, num_requests, chunks)](
            mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, state_indices, cu_seqlens, workspace.k,
            workspace.g, workspace.x, ws_rows, z_kq, fac, scale, mixed_qkv.stride(0), a.stride(0), b.stride(0),
            conv_state.stride(0), workspace.max_len, ssm_state, ssm_state.stride(0), prefetch_requests,
            H=num_k_heads, HV=num_v_heads, K=head_k_dim, D=conv_dim, W=width, BT=block_t, HPG=heads_per_group,
            NEUMANN_STEPS=neumann_steps, HAS_BIAS=conv_bias is not None, BIG_DOT=big_dot, SMALL_DOT=small_dot,
            HAS_WS_ROWS=has_rows, LAUNCH_DEPENDENTS=pdl, V=head_v_dim, L2_PREFETCH=prefetch_requests > 0,
            CHUNKS=chunks, num_warps=config.prep_warps, **prep_opts, **pdl_first_launch(config, out.device),
        )
    if "state" in parts:
        block_v = min(config.block_v, head_v_dim)
        v_per_program = head_v_dim if config.whole_v else block_v
        descs = _tma_descriptors(ssm_state, z_kq, block_v, block_t) if config.tma_loads else (None, None)
        _stacked_state_kernel[(head_v_dim // v_per_program, num_v_heads, num_requests)](
            mixed_qkv, conv_wT, conv_bias, conv_state, ssm_state, state_indices, cu_seqlens, out, workspace.u,
            workspace.x, ws_rows, z_kq, fac, mixed_qkv.stride(0), conv_state.stride(0), ssm_state.stride(0),
            workspace.max_len, *descs, prefetch_ahead, H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim,
            D=conv_dim, W=width, BT=block_t, BV=block_v, V_PER_PROGRAM=v_per_program, HAS_BIAS=conv_bias is not None,
            # triton 3.6's software pipeliner fails on a rolled loop that holds the second chunk's branch: 1 stage
            BIG_DOT=big_dot, SMALL_DOT=config.stacked_dot, LOOP_STAGES=1 if chunks > 1 else max(config.loop_stages, 1),
            HAS_WS_ROWS=has_rows, WAIT_PREP=pdl, TMA_LOADS=len(descs[0].block_shape) if descs[0] is not None else 0,
            L2_AHEAD=prefetch_ahead > 0, ws_g=workspace.g, CHUNKS=chunks, num_warps=config.num_warps,
            **(dict(launch_pdl=True) if pdl else {}),
        )
    return out


def chunk_plan(config, block_t, neumann_steps):
    """(chunks, tokens a chunk, Neumann steps) of a stacked launch: with `chunked`, 17..32 tokens (block_t 32) run as
    two chunks of CHUNK_LEN (the L = 16 tiles); otherwise one chunk of block_t. A `stacked_scratch` for a launch holds
    num_requests * chunks rows of that chunk length."""
    if config.chunked and block_t > CHUNK_LEN:
        return block_t // CHUNK_LEN, CHUNK_LEN, math.ceil(math.log2(CHUNK_LEN)) - 1
    return 1, block_t, neumann_steps


def l2_prefetch_plan(config, ssm_state, num_requests):
    """(requests whose states the prep prefetches into L2, launch positions the state pass prefetches ahead) for
    `VerifyConfig.l2_prefetch_mib` / `l2_prefetch_ahead`: whole requests, the first in the state pass's visiting
    order, whose states fit in l2_prefetch_mib MiB; ahead = l2_prefetch_ahead programs per SM, i.e. about that many
    waves' worth of programs later when that many state-pass programs share an SM. (0, 0) under the interpreter (the
    bulk prefetch is inline PTX: results are the same without it) and where the states are not 16-byte aligned."""
    if not (config.l2_prefetch_mib or config.l2_prefetch_ahead) or _interpreting():
        return 0, 0
    if (ssm_state.stride(0) * ssm_state.element_size()) % 16 or ssm_state.data_ptr() % 16:
        log_once(logger, logging.WARNING, "l2_prefetch: ssm state slots are not 16-byte aligned; no L2 prefetch")
        return 0, 0
    request_bytes = ssm_state[0].numel() * ssm_state.element_size()
    requests = min(num_requests, (config.l2_prefetch_mib << 20) // request_bytes)
    return requests, config.l2_prefetch_ahead * _sm_count(ssm_state.device)


@functools.lru_cache(maxsize=None)
def _sm_count(device):
    # offline compiles (eval/offline_sass.py) capture launches with CPU tensors: the H200's count
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _tma_descriptors(ssm_state, z_kq, block_v, block_t):
    """Host TMA descriptors of the state pass: the states (all slots as one [slots * HV * V, K] matrix in [BV, K] boxes
    when slots are contiguous, else [slots, HV * V, K] in [1, BV, K] boxes) and Z ([B * H * 2BT, K] in [2BT, K] boxes);
    (None, None), with one log line, where TMA cannot address the states (slot stride or base not 16-byte aligned)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    num_slots, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    if (ssm_state.stride(0) * ssm_state.element_size()) % 16 or ssm_state.data_ptr() % 16:
        log_once(logger, logging.WARNING, "tma_loads: ssm state slots are not 16-byte aligned; loading state blocks "
                 "through pointers instead")
        return None, None
    if ssm_state.stride(0) == num_v_heads * head_v_dim * head_k_dim:  # a 2-D box feeds the product as loaded
        state = TensorDescriptor.from_tensor(ssm_state.view(-1, head_k_dim), [block_v, head_k_dim])
    else:  # padded slots (vLLM's interleaved pages): a 3-D box, reshaped
        state = TensorDescriptor(ssm_state, [num_slots, num_v_heads * head_v_dim, head_k_dim],
                                 [ssm_state.stride(0), head_k_dim, 1], [1, block_v, head_k_dim])
    return state, TensorDescriptor.from_tensor(z_kq.view(-1, head_k_dim), [2 * block_t, head_k_dim])


def _interpreting():
    return interpreted(_stacked_state_kernel)


def stacked_scratch(device, num_requests, num_k_heads, num_v_heads, block_t, head_k_dim):
    """Per-call scratch: Z [B, H, 2BT, K] and the factors [B, HV, 3BT, 2BT], fp32 (~6 MB at B = 32, read back
    from L2)."""
    return (torch.empty(num_requests, num_k_heads, 2 * block_t, head_k_dim, dtype=torch.float32, device=device),
            torch.empty(num_requests, num_v_heads, 3 * block_t, 2 * block_t, dtype=torch.float32, device=device))
