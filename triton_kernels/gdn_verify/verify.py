"""Block-parallel GDN verification: every draft token's output from the committed state, no per-token state.

One program per (value block, value head, request). A request's <= 32 tokens form one chunk held in registers;
the delta rule is solved in WY form (derivation in eval/notes/gdn_verify.md). With G_t = g_0 + ... + g_t,
S_0 the committed state [V, K], and rows t of Q, K, V the L2-normalised q_t, k_t and v_t:

    A[t, s]  = beta_t exp(G_t - G_s) k_t.k_s                 for s < t  (else 0)
    U        = (I + A)^-1 diag(beta) (V - diag(exp G) K S_0^T)            [L, V]
    O        = scale (diag(exp G) Q S_0^T + (exp(G_t - G_s) q_t.k_s)_{s<=t} U)
    S_n      = exp(G_{n-1}) S_0 + sum_{s<n} exp(G_{n-1} - G_s) u_s k_s^T   (state after n tokens)

(I + A)^-1 is the product (I - A)(I + A^2)(I + A^4)... (A is nilpotent: A^BT = 0), a few [BT, BT] dots.
The conv (depth W, causal, SiLU) runs in the same program from the committed window and the raw inputs.
"""
import collections
import functools
import json
import math
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from .._fast_math import sigmoid
from .._pdl import pdl_available, wait_for_the_launch_before
from .workspace import MAX_VERIFY_LEN, GDNFold, GDNVerifyWorkspace, check_conv_state, check_ssm_state

# tl.dot input precision. The [L, K] x [K, BV] state products and the q/k Gram products run in tf32: fp32 "ieee"
# dots are emulated with FMAs and spill at K = 128 (measured 2x slower, eval/notes/gdn_verify.md); tf32 keeps
# ~5e-4 relative error per product, below the bf16 rounding vLLM's own prefill path applies to the state in its
# dots (FLA's chunk kernels cast the state to bf16). The [L, L] factor products stay fp32 exact.
BIG_DOT_PRECISION = "tf32"
SMALL_DOT_PRECISION = "ieee"


@triton.jit
def _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, o_c, D: tl.constexpr,
                      W: tl.constexpr, HAS_BIAS: tl.constexpr, WT: tl.constexpr = False):
    """[BT, C] = silu(causal depth-W conv) over channels o_c; tap W-1 is the current token.

    WT: conv_w is the transposed [W, D] copy and each tap's weights are loaded as a [BT, C] broadcast tile, in
    the inputs' own register layout. The default [D, W] weight vector (stride W, one scalar per thread) is
    redistributed through shared memory, and that conversion's barrier holds back every later load (triton 3.6
    SASS: 4 of 15 loads of a q conv issued before its first barrier, all 15 with WT)."""
    acc = tl.zeros([o_t.shape[0], o_c.shape[0]], dtype=tl.float32)
    if HAS_BIAS and WT:
        acc += tl.load(conv_b + o_c[None, :] + 0 * o_t[:, None]).to(tl.float32)
    elif HAS_BIAS:
        acc += tl.load(conv_b + o_c).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        src = o_t + (j - (W - 1))  # token index; negative indices live in the committed window
        b_x = tl.load(x + (bos + src)[:, None] * stride_x + o_c[None, :], mask=(m_t & (src >= 0))[:, None],
                      other=0.0)
        b_s = tl.load(conv_window + (src + (W - 1))[:, None] * D + o_c[None, :], mask=(m_t & (src < 0))[:, None],
                      other=0.0)
        if WT:
            b_w = tl.load(conv_w + j * D + o_c[None, :] + 0 * o_t[:, None]).to(tl.float32)
        else:
            b_w = tl.load(conv_w + o_c * W + j).to(tl.float32)[None, :]
        acc += (b_x.to(tl.float32) + b_s.to(tl.float32)) * b_w
    acc = acc * sigmoid(acc)
    return tl.where(m_t[:, None], acc, 0.0)


@triton.jit
def _conv_tap_load(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, j: tl.constexpr, D: tl.constexpr,
                   W: tl.constexpr):
    """Tap j (< 4) of a conv as two [BT, C] loads in the inputs' layout: input rows (x, or the committed window
    for negative token indices, one load through a per-row pointer choice) and the weight tile of the transposed
    [W, D] weights. Zero tiles for j >= W."""
    src = o_t + (j - (W - 1))
    p_in = tl.where((src >= 0)[:, None], x + (bos + src)[:, None] * stride_x + o_c[None, :],
                    conv_window + (src + (W - 1))[:, None] * D + o_c[None, :])
    b_in = tl.load(p_in, mask=(m_t & (j < W))[:, None], other=0.0)
    b_w = tl.load(conv_wT + j * D + o_c[None, :] + 0 * o_t[:, None], mask=(o_t >= 0)[:, None] & (j < W), other=0.0)
    return b_in, b_w


@triton.jit
def _conv4_loads(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, D: tl.constexpr, W: tl.constexpr):
    """Every load of a depth-W (<= 4) conv, issued before any of its math (`_conv4_math`)."""
    tl.static_assert(W <= 4, "the split conv supports W <= 4")
    i0, w0 = _conv_tap_load(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, 0, D, W)
    i1, w1 = _conv_tap_load(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, 1, D, W)
    i2, w2 = _conv_tap_load(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, 2, D, W)
    i3, w3 = _conv_tap_load(x, stride_x, conv_window, conv_wT, bos, o_t, m_t, o_c, 3, D, W)
    return i0, w0, i1, w1, i2, w2, i3, w3


@triton.jit
def _current_tap(i0, i1, i2, i3, W: tl.constexpr):
    """The input rows of tap W-1 of `_conv4_loads` (i_j = its j-th input tile): token t's own row, i.e. the raw
    inputs of this step."""
    if W == 4:
        return i3
    elif W == 3:
        return i2
    else:
        return i1


@triton.jit
def _conv4_math(i0, w0, i1, w1, i2, w2, i3, w3, conv_b, o_t, m_t, o_c, HAS_BIAS: tl.constexpr):
    """silu(sum_j input_j * weight_j + bias), zero past the request's length: `_causal_conv_silu` on loaded taps."""
    # one running sum: a product and three FMAs an element (two sums of pairs added took a fifth instruction)
    acc = i0.to(tl.float32) * w0.to(tl.float32)
    acc += i1.to(tl.float32) * w1.to(tl.float32)
    acc += i2.to(tl.float32) * w2.to(tl.float32)
    acc += i3.to(tl.float32) * w3.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(conv_b + o_c[None, :] + 0 * o_t[:, None]).to(tl.float32)
    acc = acc * sigmoid(acc)
    return tl.where(m_t[:, None], acc, 0.0)


@triton.jit
def _conv_taps(x, stride_x, conv_window, conv_wT, conv_b, bos, o_t, m_t, o_c, D: tl.constexpr, W: tl.constexpr,
               BW: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Loads only, for `_conv_math`: taps [BW, BT, C] (tap j of token t is input row t + j - (W-1): an x row, or a
    committed-window row for negative rows, one load through a per-row pointer choice), weights [BW, BT, C] from
    the transposed [W, D] weights (contiguous along C like the inputs, so all three loads get one register layout
    and the tap sum stays inside each thread), bias [BT, C]. A load whose result needs a layout conversion is
    followed at once by a barrier, and every load after it in the program waits for that barrier:
    `_causal_conv_silu`'s per-tap weight vectors did that (one serial HBM round trip per tap)."""
    o_w = tl.arange(0, BW)
    src = o_w[:, None] + o_t[None, :] - (W - 1)  # [BW, BT]
    m_tap = (o_w[:, None] < W) & m_t[None, :]
    p_in = tl.where((src >= 0)[:, :, None], x + (bos + src)[:, :, None] * stride_x + o_c[None, None, :],
                    conv_window + (src + (W - 1))[:, :, None] * D + o_c[None, None, :])
    b_in = tl.load(p_in, mask=m_tap[:, :, None], other=0.0)
    b_w = tl.load(conv_wT + (o_w[:, None] * D + 0 * o_t[None, :])[:, :, None] + o_c[None, None, :],
                  mask=(o_w < W)[:, None, None], other=0.0)
    if HAS_BIAS:
        b_b = tl.load(conv_b + 0 * o_t[:, None] + o_c[None, :]).to(tl.float32)
    else:
        b_b = tl.zeros([o_t.shape[0], o_c.shape[0]], dtype=tl.float32)
    return b_in, b_w, b_b


@triton.jit
def _conv_math(b_in, b_w, b_b, m_t):
    """[BT, C] = silu(sum over taps of (x or window row) * weight + bias), zero past the request's length."""
    acc = tl.sum(b_in.to(tl.float32) * b_w.to(tl.float32), 0) + b_b
    acc = acc * sigmoid(acc)
    return tl.where(m_t[:, None], acc, 0.0)


@triton.jit
def _fold_head(fk, fg, f_base, f_n, i_hv, o_k, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
               BTF: tl.constexpr, FOLD: tl.constexpr):
    """What the fold of value head i_hv shares over its value blocks: the previous step's keys scaled by their
    decay to the last pending token, k[s] exp(G_{n-1} - G_s) for s < f_n (zero rows past it) [BTF, K], and
    exp(G_{n-1}) (1 when nothing is pending). (0.0, 1.0) without FOLD."""
    if FOLD:
        i_h = i_hv // (HV // H)
        o_t = tl.arange(0, BTF)
        m_t = o_t < f_n
        b_Gn = tl.load(fg + (f_base + tl.maximum(f_n - 1, 0)) * HV + i_hv)
        b_Gn = tl.where(f_n > 0, b_Gn, 0.0)
        b_G = tl.load(fg + (f_base + o_t) * HV + i_hv, mask=m_t, other=0.0)
        b_coef = tl.where(m_t, tl.exp(b_Gn - b_G), 0.0)
        b_kf = tl.load(fk + ((f_base + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        return b_kf * b_coef[:, None], tl.exp(b_Gn)
    else:
        return 0.0, 1.0


@triton.jit
def _state_block(ssm_state, slot, stride_ssm_slot, i_hv, o_v, o_k, V: tl.constexpr, K: tl.constexpr,
                 fu, f_kc, f_gamma, f_base, f_n, HV: tl.constexpr, BTF: tl.constexpr, FOLD: tl.constexpr):
    """[BV, K] fp32 block of the committed state S[v, k] of value head i_hv.

    FOLD: first advance the block by the f_n pending tokens of the previous step (workspace u from row f_base on,
    f_kc / f_gamma from `_fold_head`) exactly as gdn_reconstruct does,
    S <- exp(G_{n-1}) S + u[:n]^T (k[:n] exp(G_{n-1} - G[:n])), and store it back when f_n > 0. The block is
    returned rounded to the state dtype, as the next step would have read it after a separate reconstruction."""
    p_h = ssm_state + slot * stride_ssm_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_h).to(tl.float32)
    if FOLD:
        o_t = tl.arange(0, BTF)
        b_u = tl.load(fu + ((f_base + o_t[:, None]) * HV + i_hv) * V + o_v[None, :], mask=(o_t < f_n)[:, None],
                      other=0.0)
        b_h = b_h * f_gamma + tl.dot(tl.trans(b_u), f_kc, input_precision="tf32x3")
        b_h = b_h.to(ssm_state.dtype.element_ty)
        tl.store(p_h, b_h, mask=(o_v[:, None] * 0 + f_n) > 0)  # (scalar > 0) & tensor stays int in the interpreter
        b_h = b_h.to(tl.float32)
    return b_h


@triton.jit
def _value_block_loads(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, bos, o_t, m_t, o_k,
                       i_hv, v0, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
                       W: tl.constexpr, BV: tl.constexpr, H: tl.constexpr, HAS_BIAS: tl.constexpr,
                       SKIP: tl.constexpr, WT: tl.constexpr, WITH_STATE: tl.constexpr, fu, f_kc, f_gamma, f_base, f_n,
                       BTF: tl.constexpr, FOLD: tl.constexpr):
    """What value block v0 .. v0+BV of head i_hv reads: state block [BV, K], conv'd v [BT, BV], raw v [BT, BV].
    With WT (weight tiles) the state block comes last (its copy into shared memory ends in a barrier), or not at
    all (WITH_STATE=False: the caller loads it later; 0.0 in its place)."""
    o_v = v0 + tl.arange(0, BV)
    o_xv = 2 * H * K + i_hv * V + o_v
    if SKIP & 16:  # synthetic block: no load
        b_h = (o_v[:, None] * K + o_k[None, :]).to(tl.float32) * 1e-6
    elif not WT:
        b_h = _state_block(ssm_state, slot, stride_ssm_slot, i_hv, o_v, o_k, V, K,
                           fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)  # [BV, K]
    b_xv = tl.load(x + (bos + o_t[:, None]) * stride_x + o_xv[None, :], mask=m_t[:, None], other=0.0)
    if SKIP & 64:
        b_v = b_xv.to(tl.float32)
    else:
        b_v = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, o_xv, D, W, HAS_BIAS, WT)
    if WT and not (SKIP & 16):
        if WITH_STATE:
            b_h = _state_block(ssm_state, slot, stride_ssm_slot, i_hv, o_v, o_k, V, K, fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
        else:
            b_h = 0.0
    return b_h, b_v, b_xv


@triton.jit
def _value_block_taps(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, bos, o_t, m_t, o_k,
                      i_hv, v0, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
                      W: tl.constexpr, BW: tl.constexpr, BV: tl.constexpr, H: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The v side of `_value_block_loads` as raw taps (loads only; `_conv_math` finishes the conv). The state block
    is left to the caller, to be loaded last: its copy into shared memory (the MMA operand) is followed by a
    barrier that would hold back every load after it."""
    o_v = v0 + tl.arange(0, BV)
    o_xv = 2 * H * K + i_hv * V + o_v
    b_xv = tl.load(x + (bos + o_t[:, None]) * stride_x + o_xv[None, :], mask=m_t[:, None], other=0.0)
    b_vin, b_vw, b_vb = _conv_taps(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, o_xv, D, W, BW,
                                   HAS_BIAS)
    return b_xv, b_vin, b_vw, b_vb


@triton.jit
def _value_block_math(b_h, b_v, b_xv, o, ws_u, ws_x, ws_row, bos, o_t, m_t, i_hv, v0, b_k, b_q, b_inv, b_attn, b_beta,
                      b_gamma, scale, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
                      BV: tl.constexpr, H: tl.constexpr, BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr,
                      SKIP: tl.constexpr, STORE_X: tl.constexpr = True):
    """Outputs O and the workspace's u and raw v of one value block. b_k / b_q [BT, K] are the normalised k / q in
    the state product's operand dtype (fp32 for tf32 dots, or 16-bit). STORE_X False: the caller stored raw v."""
    o_v = v0 + tl.arange(0, BV)
    o_xv = 2 * H * K + i_hv * V + o_v
    if SKIP & 32:  # keep the load alive, no product
        b_row = tl.sum(b_h, 1)
        b_ks = b_gamma[:, None] * b_row[None, :]
        b_qs = b_beta[:, None] * b_row[None, :]
    elif b_k.dtype == tl.float32:
        b_ks = tl.dot(b_k, tl.trans(b_h), input_precision=BIG_DOT)  # [BT, BV]
        b_qs = tl.dot(b_q, tl.trans(b_h), input_precision=BIG_DOT)
    else:
        b_h16 = tl.trans(b_h.to(b_k.dtype))
        b_ks = tl.dot(b_k, b_h16)
        b_qs = tl.dot(b_q, b_h16)
    if SKIP & 128:
        b_u = tl.sum(b_inv, 1)[:, None] * b_beta[:, None] * (b_v - b_gamma[:, None] * b_ks)
        b_o = b_gamma[:, None] * b_qs + tl.sum(b_attn, 1)[:, None] * b_u
    else:
        b_u = tl.dot(b_inv, b_beta[:, None] * (b_v - b_gamma[:, None] * b_ks), input_precision=SMALL_DOT)
        b_o = b_gamma[:, None] * b_qs + tl.dot(b_attn, b_u, input_precision=SMALL_DOT)
    p_o = o + ((bos + o_t[:, None]) * HV + i_hv) * V + o_v[None, :]
    tl.store(p_o, (b_o * scale).to(o.dtype.element_ty), mask=m_t[:, None])
    if not (SKIP & 256):
        tl.store(ws_u + (ws_row[:, None] * HV + i_hv) * V + o_v[None, :], b_u, mask=m_t[:, None])
        if STORE_X:
            tl.store(ws_x + ws_row[:, None] * D + o_xv[None, :], b_xv, mask=m_t[:, None])


@triton.jit
def _value_block(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, o, ws_u, ws_x, ws_row,
                 bos, o_t, m_t, o_k, i_hv, v0, b_k, b_q, b_inv, b_attn, b_beta, b_gamma, scale, HV: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr, BV: tl.constexpr,
                 H: tl.constexpr, HAS_BIAS: tl.constexpr, BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr,
                 SKIP: tl.constexpr, BW: tl.constexpr, LOADS_FIRST: tl.constexpr, WT: tl.constexpr, fu, f_kc, f_gamma,
                 f_base, f_n, BTF: tl.constexpr, FOLD: tl.constexpr):
    """Value columns v0 .. v0+BV of head i_hv: loads, then products and stores."""
    if LOADS_FIRST:
        b_xv, b_vin, b_vw, b_vb = _value_block_taps(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot,
                                                    stride_ssm_slot, bos, o_t, m_t, o_k, i_hv, v0, HV, K, V, D,
                                                    W, BW, BV, H, HAS_BIAS)
        b_h = _state_block(ssm_state, slot, stride_ssm_slot, i_hv, v0 + tl.arange(0, BV), o_k, V, K,
                           fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
        b_v = _conv_math(b_vin, b_vw, b_vb, m_t)
    else:
        b_h, b_v, b_xv = _value_block_loads(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot,
                                            stride_ssm_slot, bos, o_t, m_t, o_k, i_hv, v0, HV, K, V, D, W, BV, H,
                                            HAS_BIAS, SKIP, WT, True, fu, f_kc, f_gamma, f_base, f_n, BTF, FOLD)
    _value_block_math(b_h, b_v, b_xv, o, ws_u, ws_x, ws_row, bos, o_t, m_t, i_hv, v0, b_k, b_q, b_inv, b_attn, b_beta,
                      b_gamma, scale, HV, K, V, D, BV, H, BIG_DOT, SMALL_DOT, SKIP)


@triton.jit
def _raw_qk(x, stride_x, bos, o_t, m_t, o_k, i_h, H: tl.constexpr, K: tl.constexpr):
    """The raw q and k rows [BT, K] of k-head i_h, fp32: what SKIP bit 1 (timing only) uses in place of their conv."""
    b_q = tl.load(x + (bos + o_t)[:, None] * stride_x + (i_h * K + o_k)[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    b_k = tl.load(x + (bos + o_t)[:, None] * stride_x + ((H + i_h) * K + o_k)[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    return b_q, b_k


@triton.jit
def _gram_products(b_q, b_k, BIG_DOT: tl.constexpr, SPLIT: tl.constexpr):
    """k k^T and q k^T [BT, BT] of the normalised q, k [BT, K]. Without SPLIT each is one product over K, a chain of
    K / 8 dependent tf32 MMAs. SPLIT: each is the sum of two independent half products over the even and odd
    columns (a register-local split of the load layout), so the half chains can overlap. The halves are summed
    through a join, not `+`: Triton folds `dot + x` into the dot's accumulator, which would chain them again."""
    if not SPLIT:
        return (tl.dot(b_k, tl.trans(b_k), input_precision=BIG_DOT),
                tl.dot(b_q, tl.trans(b_k), input_precision=BIG_DOT))
    BT: tl.constexpr = b_k.shape[0]
    K: tl.constexpr = b_k.shape[1]
    k_even, k_odd = tl.split(tl.reshape(b_k, [BT, K // 2, 2]))
    q_even, q_odd = tl.split(tl.reshape(b_q, [BT, K // 2, 2]))
    kk_even = tl.dot(k_even, tl.trans(k_even), input_precision=BIG_DOT)
    kk_odd = tl.dot(k_odd, tl.trans(k_odd), input_precision=BIG_DOT)
    qk_even = tl.dot(q_even, tl.trans(k_even), input_precision=BIG_DOT)
    qk_odd = tl.dot(q_odd, tl.trans(k_odd), input_precision=BIG_DOT)
    return tl.sum(tl.join(kk_even, kk_odd), 2), tl.sum(tl.join(qk_even, qk_odd), 2)


@triton.jit(do_not_specialize=["scale", "WS_LEN", "F_LEN"])
def _gdn_verify_kernel(
    x, a, b, conv_w, conv_b, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
    o, ws_u, ws_k, ws_g, ws_x, ws_rows, fu, fk, fg, f_rows, f_counts, scale, stride_x, stride_a, stride_b,
    stride_conv_slot, stride_ssm_slot, WS_LEN, F_LEN,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr, V_PER_PROGRAM: tl.constexpr,
    NEUMANN_STEPS: tl.constexpr, HAS_BIAS: tl.constexpr, BIG_DOT: tl.constexpr, SMALL_DOT: tl.constexpr,
    STATE_DOT: tl.constexpr, LOOP_STAGES: tl.constexpr, SKIP: tl.constexpr, HOIST: tl.constexpr,
    LOADS_FIRST: tl.constexpr, BW: tl.constexpr, WT: tl.constexpr, HAS_WS_ROWS: tl.constexpr, FOLD: tl.constexpr,
    BTF: tl.constexpr, EARLY_ST: tl.constexpr = False, SPLIT_GRAM: tl.constexpr = False,
    WAIT_BEFORE: tl.constexpr = False,
):
    """Program (value span, head group, request): HEADS_PER_PROGRAM v-heads of one k-head (sharing its q/k
    conv, norms and Gram products) x V_PER_PROGRAM value columns, walked in BV-wide blocks.

    STATE_DOT "bf16" / "fp16" rounds the state block and q/k to 16 bits for the two state products (fp32
    accumulation). LOOP_STAGES > 0 walks the value blocks in a rolled loop (tl.range, software-pipelined with that
    many stages) instead of unrolling it. HAS_WS_ROWS: request i_n writes workspace row ws_rows[i_n] (else i_n).
    FOLD: each state block is first advanced by the previous step's f_counts[i_n] tokens from fold workspace row
    f_rows[i_n] and stored back (`_state_block`); every state block is owned by exactly one program, so the
    in-place update needs no synchronisation.

    SKIP is a bit mask of stages to leave out, for timing only (outputs are wrong when nonzero): 1 q/k conv (one
    plain load instead), 2 q/k norms, 4 Gram products, 8 Neumann steps, 16 state load (a synthetic block), 32 state
    products (a row sum instead), 64 v conv (one plain load), 128 small [BT, BT] x [BT, BV] products, 256 workspace
    stores, 512 everything after reading the request's slot (launch floor).

    HOIST (one value block and one head per program): every global load of the program (state block, v conv
    inputs, gates, raw q/k) is issued at the start, before the first cross-thread step; otherwise loads placed
    after a barrier wait for the whole q/k / Neumann chain before they are even issued.

    EARLY_ST (HOIST, WT, W <= 4): the raw q / k / v rows come from the conv's current-token tap (no second load)
    and every workspace store is issued as soon as its data exists (raw rows after the loads, k after its norm,
    G after its cumsum), not at the end. SPLIT_GRAM: the Gram products as two independent half-K chains each
    (`_gram_products`). WAIT_BEFORE: launched by programmatic dependent launch after whatever launch comes before it
    (`VerifyConfig.pdl_first`): it waits for that launch to finish before touching memory."""
    wait_for_the_launch_before(WAIT_BEFORE)
    i_vs, i_hg, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = (i_hg * HEADS_PER_PROGRAM) // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_indices + i_n).to(tl.int64)
    o_t = tl.arange(0, BT)
    m_t = o_t < seqlen
    o_k = tl.arange(0, K)
    if SKIP & 512:
        return
    if slot <= 0:  # vLLM's null block: a padding row of a CUDA-graph batch
        for j in tl.static_range(HEADS_PER_PROGRAM):
            for i_vb in tl.static_range(V_PER_PROGRAM // BV):
                o_v = i_vs * V_PER_PROGRAM + i_vb * BV + tl.arange(0, BV)
                p_o = o + ((bos + o_t[:, None]) * HV + i_hg * HEADS_PER_PROGRAM + j) * V + o_v[None, :]
                tl.store(p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty), mask=m_t[:, None])
        return

    if FOLD:
        f_n = tl.maximum(tl.minimum(tl.load(f_counts + i_n), F_LEN), 0).to(tl.int64)
        f_base = tl.load(f_rows + i_n).to(tl.int64) * F_LEN
    else:
        f_n = 0
        f_base = 0
    f_kc, f_gamma = _fold_head(fk, fg, f_base, f_n, i_hg * HEADS_PER_PROGRAM, o_k, H, HV, K, BTF, FOLD)
    conv_window = conv_state + slot * stride_conv_slot
    writer = (i_vs == 0) & ((i_hg * HEADS_PER_PROGRAM) % (HV // H) == 0)  # one program per k-head writes its k
    m_w = o_t < tl.where(writer, seqlen, 0)  # m_t for that program, else nothing
    if HOIST and LOADS_FIRST:  # the state block is loaded after the q/k taps (see _value_block_taps)
        b_xv0, b_vin, b_vw, b_vb = _value_block_taps(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot,
                                                     stride_ssm_slot, bos, o_t, m_t, o_k, i_hg, i_vs * BV, HV, K,
                                                     V, D, W, BW, BV, H, HAS_BIAS)
    elif HOIST and WT and W <= 4:  # every load first (v, gates, raw q/k, q/k taps, state block), then the math
        o_xv0 = 2 * H * K + i_hg * V + i_vs * BV + tl.arange(0, BV)
        if not EARLY_ST:
            b_xv0 = tl.load(x + (bos + o_t[:, None]) * stride_x + o_xv0[None, :], mask=m_t[:, None], other=0.0)
        v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_ = _conv4_loads(x, stride_x, conv_window, conv_w, bos, o_t, m_t, o_xv0,
                                                              D, W)
        if EARLY_ST:
            b_xv0 = _current_tap(v0_, v2_, v4_, v6_, W)
    elif HOIST:  # with WT the state block is loaded after the q/k convs
        b_h0, b_v0, b_xv0 = _value_block_loads(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot,
                                               stride_ssm_slot, bos, o_t, m_t, o_k, i_hg, i_vs * BV, HV, K, V, D, W,
                                               BV, H, HAS_BIAS, SKIP, WT, not WT, fu, fk, fg, f_base,
                                               f_n, BTF, FOLD)
    if HOIST:
        b_a0 = tl.load(a + (bos + o_t) * stride_a + i_hg, mask=m_t, other=0.0).to(tl.float32)
        b_b0 = tl.load(b + (bos + o_t) * stride_b + i_hg, mask=m_t, other=0.0).to(tl.float32)
        b_dtb0 = tl.load(dt_bias + i_hg).to(tl.float32)
        b_alog0 = tl.load(A_log + i_hg).to(tl.float32)
        if not EARLY_ST:
            b_xq0 = tl.load(x + (bos + o_t)[:, None] * stride_x + (i_h * K + o_k)[None, :], mask=m_w[:, None],
                            other=0.0)
            b_xk0 = tl.load(x + (bos + o_t)[:, None] * stride_x + ((H + i_h) * K + o_k)[None, :],
                            mask=m_w[:, None], other=0.0)
    if EARLY_ST:
        if HAS_WS_ROWS:
            ws_row = tl.load(ws_rows + i_n).to(tl.int64) * WS_LEN + o_t
        else:
            ws_row = i_n.to(tl.int64) * WS_LEN + o_t
    causal = o_t[:, None] >= o_t[None, :]
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    if HOIST and WT and W <= 4:  # SKIP bits 1 / 16 / 64 honoured here too: the stage ladder of the b1 winner
        if SKIP & 1:
            b_q, b_k = _raw_qk(x, stride_x, bos, o_t, m_t, o_k, i_h, H, K)
        else:
            q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_ = _conv4_loads(x, stride_x, conv_window, conv_w, bos, o_t, m_t,
                                                                  i_h * K + o_k, D, W)
            k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_ = _conv4_loads(x, stride_x, conv_window, conv_w, bos, o_t, m_t,
                                                                  (H + i_h) * K + o_k, D, W)
        if SKIP & 16:  # synthetic block: no load
            b_h0 = ((i_vs * BV + tl.arange(0, BV))[:, None] * K + o_k[None, :]).to(tl.float32) * 1e-6
        else:
            b_h0 = _state_block(ssm_state, slot, stride_ssm_slot, i_hg, i_vs * BV + tl.arange(0, BV), o_k, V, K,
                                fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
        if EARLY_ST:  # the raw rows the reconstruction's conv windows need: stored now, not held to the end
            tl.store(ws_x + ws_row[:, None] * D + o_xv0[None, :], b_xv0, mask=m_t[:, None])
            tl.store(ws_x + ws_row[:, None] * D + (i_h * K + o_k)[None, :], _current_tap(q0_, q2_, q4_, q6_, W),
                     mask=m_w[:, None])
            tl.store(ws_x + ws_row[:, None] * D + ((H + i_h) * K + o_k)[None, :], _current_tap(k0_, k2_, k4_, k6_, W),
                     mask=m_w[:, None])
        if not (SKIP & 1):
            b_q = _conv4_math(q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_, conv_b, o_t, m_t, i_h * K + o_k, HAS_BIAS)
            b_k = _conv4_math(k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_, conv_b, o_t, m_t, (H + i_h) * K + o_k,
                              HAS_BIAS)
        if SKIP & 64:
            b_v0 = b_xv0.to(tl.float32)
        else:
            b_v0 = _conv4_math(v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_, conv_b, o_t, m_t, o_xv0, HAS_BIAS)
    elif LOADS_FIRST:
        b_qin, b_qw, b_qb = _conv_taps(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, i_h * K + o_k,
                                       D, W, BW, HAS_BIAS)
        b_kin, b_kw, b_kb = _conv_taps(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t,
                                       (H + i_h) * K + o_k, D, W, BW, HAS_BIAS)
        if HOIST:
            b_h0 = _state_block(ssm_state, slot, stride_ssm_slot, i_hg, i_vs * BV + tl.arange(0, BV), o_k, V, K,
                            fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
        b_q = _conv_math(b_qin, b_qw, b_qb, m_t)
        b_k = _conv_math(b_kin, b_kw, b_kb, m_t)
        if HOIST:
            b_v0 = _conv_math(b_vin, b_vw, b_vb, m_t)
    elif SKIP & 1:
        b_q, b_k = _raw_qk(x, stride_x, bos, o_t, m_t, o_k, i_h, H, K)
    else:
        b_q = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, i_h * K + o_k, D, W,
                                HAS_BIAS, WT)
        b_k = _causal_conv_silu(x, stride_x, conv_window, conv_w, conv_b, bos, o_t, m_t, (H + i_h) * K + o_k, D, W,
                                HAS_BIAS, WT)
        if HOIST and WT and not (SKIP & 16) and W > 4:
            b_h0 = _state_block(ssm_state, slot, stride_ssm_slot, i_hg, i_vs * BV + tl.arange(0, BV), o_k, V, K,
                            fu, f_kc, f_gamma, f_base, f_n, HV, BTF, FOLD)
    if not (SKIP & 2):
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
    if EARLY_ST:
        tl.store(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_w[:, None])
    if SKIP & 4:
        b_kk = eye * 0.5
        b_qk = eye * 0.25
    else:
        b_kk, b_qk = _gram_products(b_q, b_k, BIG_DOT, SPLIT_GRAM)  # [BT, BT] each
    if STATE_DOT == "bf16":  # 16-bit copies for the state products, made once per program
        b_k16 = b_k.to(tl.bfloat16)
        b_q16 = b_q.to(tl.bfloat16)
    elif STATE_DOT == "fp16":
        b_k16 = b_k.to(tl.float16)
        b_q16 = b_q.to(tl.float16)
    else:
        b_k16 = b_k
        b_q16 = b_q
    if EARLY_ST:
        pass
    elif HAS_WS_ROWS:
        ws_row = tl.load(ws_rows + i_n).to(tl.int64) * WS_LEN + o_t
    else:
        ws_row = i_n.to(tl.int64) * WS_LEN + o_t

    for j in tl.static_range(HEADS_PER_PROGRAM):
        i_hv = i_hg * HEADS_PER_PROGRAM + j
        if j > 0:
            f_kc, f_gamma = _fold_head(fk, fg, f_base, f_n, i_hv, o_k, H, HV, K, BTF, FOLD)
        if HOIST:
            gate = b_a0 + b_dtb0
            b_beta = b_b0
            b_alog = b_alog0
        else:
            gate = tl.load(a + (bos + o_t) * stride_a + i_hv, mask=m_t, other=0.0).to(tl.float32)
            b_beta = tl.load(b + (bos + o_t) * stride_b + i_hv, mask=m_t, other=0.0).to(tl.float32)
            gate += tl.load(dt_bias + i_hv).to(tl.float32)
            b_alog = tl.load(A_log + i_hv).to(tl.float32)
        softplus = tl.where(gate <= 20.0, tl.log(1.0 + tl.exp(gate)), gate)
        b_g = tl.where(m_t, -tl.exp(b_alog) * softplus, 0.0)
        b_beta = tl.where(m_t, tl.sigmoid(b_beta), 0.0)
        b_G = tl.cumsum(b_g, 0)
        if EARLY_ST and not (SKIP & 256):
            tl.store(ws_g + ws_row * HV + i_hv, b_G, mask=o_t < tl.where(i_vs == 0, seqlen, 0))
        b_gamma = tl.exp(b_G)
        decay = tl.where(causal, tl.exp(tl.where(causal, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
        b_A = tl.where(o_t[:, None] > o_t[None, :], b_beta[:, None] * decay * b_kk, 0.0)
        # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...: A^L = 0 for L tokens, so ceil(log2 L) - 1 steps suffice
        b_inv = eye - b_A
        b_pow = b_A
        b_attn = decay * b_qk
        for _ in tl.static_range(0 if SKIP & 8 else NEUMANN_STEPS):
            b_pow = tl.dot(b_pow, b_pow, input_precision=SMALL_DOT)
            b_inv = tl.dot(b_inv, eye + b_pow, input_precision=SMALL_DOT)
        if not (SKIP & 256) and not EARLY_ST:
            if i_vs == 0:
                tl.store(ws_g + ws_row * HV + i_hv, b_G, mask=m_t)

        if HOIST:
            _value_block_math(b_h0, b_v0, b_xv0, o, ws_u, ws_x, ws_row, bos, o_t, m_t, i_hv, i_vs * BV, b_k16, b_q16,
                              b_inv, b_attn, b_beta, b_gamma, scale, HV, K, V, D, BV, H, BIG_DOT, SMALL_DOT, SKIP,
                              not EARLY_ST)
        elif LOOP_STAGES > 0:
            for i_vb in tl.range(0, V_PER_PROGRAM // BV, num_stages=LOOP_STAGES):
                _value_block(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, o, ws_u, ws_x,
                             ws_row, bos, o_t, m_t, o_k, i_hv, i_vs * V_PER_PROGRAM + i_vb * BV, b_k16, b_q16,
                             b_inv, b_attn, b_beta, b_gamma, scale, HV, K, V, D, W, BV, H, HAS_BIAS, BIG_DOT,
                             SMALL_DOT, SKIP, BW, LOADS_FIRST, WT, fu, f_kc, f_gamma, f_base, f_n, BTF, FOLD)
        else:
            for i_vb in tl.static_range(V_PER_PROGRAM // BV):
                _value_block(x, stride_x, conv_window, conv_w, conv_b, ssm_state, slot, stride_ssm_slot, o, ws_u, ws_x,
                             ws_row, bos, o_t, m_t, o_k, i_hv, i_vs * V_PER_PROGRAM + i_vb * BV, b_k16, b_q16,
                             b_inv, b_attn, b_beta, b_gamma, scale, HV, K, V, D, W, BV, H, HAS_BIAS, BIG_DOT,
                             SMALL_DOT, SKIP, BW, LOADS_FIRST, WT, fu, f_kc, f_gamma, f_base, f_n, BTF, FOLD)

    if (SKIP & 256) or EARLY_ST:
        pass
    elif HOIST:
        tl.store(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_w[:, None])
        tl.store(ws_x + ws_row[:, None] * D + (i_h * K + o_k)[None, :], b_xq0, mask=m_w[:, None])
        tl.store(ws_x + ws_row[:, None] * D + ((H + i_h) * K + o_k)[None, :], b_xk0, mask=m_w[:, None])
    else:
        if writer:
            tl.store(ws_k + (ws_row[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_t[:, None])
            for i_part in tl.static_range(2):  # raw q and k channels of this k-head
                o_xqk = (i_part * H + i_h) * K + o_k
                b_xqk = tl.load(x + (bos + o_t[:, None]) * stride_x + o_xqk[None, :], mask=m_t[:, None], other=0.0)
                tl.store(ws_x + ws_row[:, None] * D + o_xqk[None, :], b_xqk, mask=m_t[:, None])


_CONV_WT_CACHE = collections.OrderedDict()  # (ptr, shape, stride, dtype, device) -> [source, version, [W, D] copy]


def transposed_conv_weight(conv_weight):
    """[W, D] contiguous copy of conv_weight [D, W] for the loads-first conv, cached per weight: the entry pins its
    source (so the address cannot be reused by another tensor while cached). A weight modified in place through
    itself or a view (its version counter moves) has its copy refreshed in place, never replaced: CUDA graphs
    captured with the copy keep reading live memory, and now the new weights. Writes that bypass the version
    counter (through `.data`, as vLLM's weight loaders and in-place reloads write) need
    `refresh_transposed_conv_weights(everything=True)`. A first call inside CUDA-graph capture is not cached (the
    copy is part of that graph); vLLM's eager warm-up runs fill the cache before capture."""
    key = (conv_weight.data_ptr(), tuple(conv_weight.shape), conv_weight.stride(), conv_weight.dtype,
           conv_weight.device)
    entry = _CONV_WT_CACHE.get(key)
    if entry is not None:
        _CONV_WT_CACHE.move_to_end(key)
        if entry[1] != conv_weight._version and not _capturing(conv_weight):
            _refresh_conv_copy(entry)
        return entry[2]
    copy = conv_weight.t().contiguous()
    if _capturing(conv_weight):
        return copy  # recorded into the graph, filled at replay: a cached copy would be empty for other graphs
    _CONV_WT_CACHE[key] = [conv_weight, conv_weight._version, copy]
    while len(_CONV_WT_CACHE) > 256:
        _CONV_WT_CACHE.popitem(last=False)
    return copy


def refresh_transposed_conv_weights(everything: bool = False) -> int:
    """Brings the cached transposed conv weights up to date in place (outside CUDA-graph capture; eager copies, so
    call it before the forward that reads them, e.g. graph replays): those whose weight's version moved, or every
    one (everything=True, after writes the version counter does not see: `param.data[...] = ...`). Returns how
    many were refreshed."""
    refreshed = 0
    for entry in _CONV_WT_CACHE.values():
        if (everything or entry[1] != entry[0]._version) and not _capturing(entry[0]):
            _refresh_conv_copy(entry)
            refreshed += 1
    return refreshed


def _refresh_conv_copy(entry) -> None:
    source, _, copy = entry
    copy.copy_(source.t())
    entry[1] = source._version


def _capturing(t) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_contiguous(name, t, ndim):
    if t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {t.stride()} for shape {tuple(t.shape)})")


def _check_rows(name, t):
    """2-D with contiguous rows; the row stride is free (vLLM's mixed_qkv is a column slice of the projection)."""
    if t.ndim != 2:
        raise ValueError(f"{name} must have 2 dims, got shape {tuple(t.shape)}")
    if t.stride(1) != 1 and t.shape[1] > 1:
        raise ValueError(f"{name} must be contiguous along its last dim (got strides {t.stride()} for shape "
                         f"{tuple(t.shape)})")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise ValueError(f"{name} rows overlap (row stride {t.stride(0)} < width {t.shape[1]})")


def _check_float(name, t):
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name} dtype must be float32, bfloat16 or float16, got {t.dtype}")


def _check_index(name, t, length):
    if t.ndim != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must have shape [{length}], got {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@dataclass(frozen=True)
class VerifyConfig:
    """Launch shape of gdn_verify. Small batches want many small programs (latency); large batches want each
    program to reuse its q/k conv, norms and Gram products over more heads and value columns (throughput)."""
    block_v: int = 32  # value columns per state block held in registers
    whole_v: bool = False  # one program walks all value blocks of its heads
    group_heads: bool = False  # one program covers the HV/H v-heads of its k-head
    num_warps: int = 4
    big_dot: str = BIG_DOT_PRECISION
    # v4: operand dtype of the two state products: "fp32" (big_dot precision) or 16-bit ("bf16" as vLLM's prefill
    # path rounds the state in its dots, "fp16" as the interpreter-testable twin); fp32 accumulation either way
    state_dot: str = "fp32"
    # v4: conv inputs as [BT, W, C] taps + a [W, C] weight tile, every load of a conv issued before its math
    loads_first: bool = False
    # v5: the 2-D conv with each tap's weights loaded as a [BT, C] tile of the cached [W, D] transposed weights: no
    # layout conversion, so no barrier between a conv's loads (H200, L=16: with hoist at 8 warps the batch-1
    # winner, 8.0 vs v2's 9.35 us)
    weight_tiles: bool = False
    hoist: bool = False  # one value block and head per program: issue all its loads first (see the kernel)
    loop_stages: int = 0  # > 0: value blocks walked in a rolled tl.range loop pipelined with this many stages
    skip_stages: int = 0  # timing experiments only (wrong outputs): stage bit mask, see _gdn_verify_kernel
    # two launches: a per-(k-head, request) prep pass (conv, norms, Gram, gates, Neumann) and a state pass per
    # value block that reads its results from a scratch buffer (two_pass.py); prep_warps = the prep's num_warps
    two_pass: bool = False
    prep_warps: int = 4
    # session 4 (hoisted forms): raw rows from the conv's own taps + workspace stores as early as their data exist.
    # See _gdn_verify_kernel
    early_stores: bool = False
    # session 4, G2: the q/k Gram products as two half-K products each, summed after (two MMA chains of K/16 steps
    # instead of one of K/8; the b1 ladder's largest stage). Not in the two-pass form (its own Gram).
    # H200 (final7): 8-17 % slower at batch 1 (the split / join's layout conversions), within 1 % in whole-V forms
    split_gram: bool = False
    # session 5, GB (two_pass): the state pass takes k and q stacked as one [2BT, K] operand against the state block
    # and applies the U / O factors as two products on that result (stacked.py); stacked_dot = their precision
    # (tf32x3: three tensor-core products, ~fp32; "tf32": one)
    stacked: bool = False
    stacked_dot: str = "tf32x3"
    # stacked, one value block per program: the state pass is launched with programmatic dependent launch and
    # loads its state block before waiting for the prep grid (its loads overlap the prep's tail)
    pdl: bool = False
    # two_pass: the prep launch's register cap (maxnreg; 0 = none): 128 lets 4 prep programs of 4 warps share an SM,
    # i.e. the 512 (k-head, request) programs of batch 32 run in one wave instead of two
    prep_maxnreg: int = 0
    # session 6, GB6 (stacked): the state pass's state block and Z come through host TMA descriptors (one copy each
    # into shared memory, where the first product reads them) instead of per-thread loads staged in registers. H200
    # (final9, 901b3f2): with PDL 3.5-3.8 % faster at batch 64, ~1 % at 8 / 32, slower without PDL
    tma_loads: bool = False
    # session 8, GD9 (stacked): L2 bulk prefetch of the states. l2_prefetch_mib: the prep brings the first requests'
    # states (whole requests, in the state pass's order, up to this many MiB) into L2 while its chain runs (HBM
    # idles then); l2_prefetch_ahead: each state-pass program prefetches the state block of the program this many
    # programs per SM after it (one wave ahead at that many programs per SM). Inline PTX: ignored by the interpreter
    l2_prefetch_mib: int = 0
    l2_prefetch_ahead: int = 0
    # session 23: the verify's first launch (the single kernel, or the stacked prep) by programmatic dependent launch
    # after whatever launch comes before it (in a model, the layer's input projection): its first statement waits
    # for that launch to finish (griddepcontrol.wait), so only its start overlaps that launch's end
    pdl_first: bool = False
    # session 26 (stacked): a verify of 17..32 tokens as two 16-token chunks (the L = 16 tiles) instead of one 32-token
    # chunk: the prep builds each chunk's factors in its own program, the state pass carries its state block from the
    # first chunk to the second. No effect at L <= 16
    chunked: bool = False

    def __post_init__(self):
        if self.block_v < 16 or self.block_v & (self.block_v - 1):
            raise ValueError(f"block_v must be a power of two >= 16, got {self.block_v}")
        if self.big_dot not in ("tf32", "tf32x3", "ieee"):
            raise ValueError(f"big_dot must be tf32, tf32x3 or ieee, got {self.big_dot}")
        if self.state_dot not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"state_dot must be fp32, bf16 or fp16, got {self.state_dot}")
        if self.hoist and (self.whole_v or self.group_heads or self.two_pass):
            raise ValueError("hoist needs one value block and one head per program (no whole_v, group_heads or "
                             "two_pass)")
        if self.loads_first and self.skip_stages:
            raise ValueError("loads_first cannot be combined with skip_stages")
        if self.weight_tiles and (self.loads_first or (self.skip_stages and not self.hoist)):
            raise ValueError("weight_tiles cannot be combined with loads_first, nor with skip_stages unless hoisted")
        if self.two_pass and (self.group_heads or self.skip_stages):
            raise ValueError("two_pass cannot be combined with group_heads or skip_stages")
        if self.early_stores and not (self.hoist and self.weight_tiles and self.skip_stages in (0, 512)):
            # skip 512 (return after the slot read: the launch floor) is the one stage skip its store path allows
            raise ValueError("early_stores needs hoist and weight_tiles (and no skip_stages but 512)")
        if self.split_gram and self.two_pass:
            raise ValueError("split_gram cannot be combined with two_pass (its Gram products are its own)")
        if (self.stacked or self.prep_maxnreg) and not self.two_pass:
            raise ValueError("stacked and prep_maxnreg need two_pass")
        if self.stacked and (self.loads_first or self.state_dot != "fp32" or self.prep_warps < 4):
            # prep_warps 2: the H200 run of session 5 gave wrong outputs in CUDA-graph replays (eager right)
            raise ValueError("stacked cannot be combined with loads_first, a 16-bit state_dot or prep_warps < 4")
        if self.prep_maxnreg and not 32 <= self.prep_maxnreg <= 255:
            raise ValueError(f"prep_maxnreg must be 0 or 32..255, got {self.prep_maxnreg}")
        if self.pdl and not self.stacked:
            raise ValueError("pdl needs stacked")
        if self.pdl and self.whole_v:
            raise ValueError("pdl needs one value block per program (no whole_v)")
        if self.stacked_dot not in ("tf32", "tf32x3", "ieee"):
            raise ValueError(f"stacked_dot must be tf32, tf32x3 or ieee, got {self.stacked_dot}")
        if self.tma_loads and not self.stacked:
            raise ValueError("tma_loads needs stacked")
        if (self.l2_prefetch_mib or self.l2_prefetch_ahead) and not self.stacked:
            raise ValueError("l2_prefetch_mib and l2_prefetch_ahead need stacked")
        if self.l2_prefetch_mib < 0 or self.l2_prefetch_ahead < 0:
            raise ValueError("l2_prefetch_mib and l2_prefetch_ahead must be >= 0")
        if self.l2_prefetch_ahead and self.whole_v:
            raise ValueError("l2_prefetch_ahead needs one value block per program (no whole_v)")
        if self.chunked and not self.stacked:
            raise ValueError("chunked needs stacked")
        if self.pdl_first and self.two_pass and not self.stacked:
            raise ValueError("pdl_first needs a single-kernel form or stacked")
        if not 0 <= self.loop_stages <= 4:
            raise ValueError(f"loop_stages must be 0..4, got {self.loop_stages}")


# Written by eval/bench_gdn_verify.py --write-tuned from its sweep on one GPU: {"device": name, "verify": {batch:
# config} (timed at L = 16), "verify_by_len": {L: {batch: config}}, "verify_fold": {batch: config},
# "reconstruct_by_len": {L: {batch: {block_v, num_warps}}}, "reconstruct_short_by_len": {L <= 4: {batch: {short,
# block_v, num_warps[, early]}}}}, all timed with fp32 ssm states; "verify_by_len_bf16",
# "reconstruct_by_len_bf16" and "reconstruct_short_by_len_bf16" (same formats) were timed with bf16 states
# (--ssm-dtype bfloat16) and serve them. "provenance": {table or "table/L": {run, commit, command}}, the run that
# measured each table (each length of a per-length table).
TUNED_CONFIGS_FILE = Path(__file__).with_name("tuned_verify_configs.json")


@functools.lru_cache(maxsize=None)
def _tuned_doc():
    """The tuned file when it was measured on this process's GPU, else {} (no file, other device, no GPU)."""
    if not TUNED_CONFIGS_FILE.exists() or not torch.cuda.is_available():
        return {}
    doc = json.loads(TUNED_CONFIGS_FILE.read_text())
    return doc if doc.get("device") == torch.cuda.get_device_name() else {}


def _tuned_verify_configs(key="verify"):
    """{batch: VerifyConfig} measured on this process's GPU, or {} (no file, other device, no GPU, no such key).
    key "verify": timed without a fold at L = 16; "verify_fold": timed with a `GDNFold` (the folded step)."""
    return {int(batch): VerifyConfig(**cfg) for batch, cfg in _tuned_doc().get(key, {}).items()}



def _tuned_by_len(key, state_dtype=None):
    """{L: {batch: entry}} of a per-length table of the tuned file ({} if absent). bf16 states (vLLM's default
    mamba_ssm_cache_dtype for a bf16 model) read the table swept with bf16 states, `key + "_bf16"`, where the file
    has one: half the state bytes move, and other forms win (PDL loses there)."""
    doc = _tuned_doc()
    if state_dtype == torch.bfloat16 and f"{key}_bf16" in doc:
        key = f"{key}_bf16"
    return {int(L): {int(batch): entry for batch, entry in table.items()} for L, table in doc.get(key, {}).items()}


# The tuned file's sweeps ran Qwen3-Next's GDN shape, 32 value heads (unsharded). A rank of a tensor-parallel engine
# holds num_v_heads / tp of them, so its batch of B requests is the work of B * num_v_heads / 32 requests there
# (work_batch), which is what the tables are looked up by.
TUNED_NUM_V_HEADS = 32


def work_batch(num_requests, num_v_heads=None):
    """The tuned tables' batch that does the work of `num_requests` requests over `num_v_heads` value heads
    (None: the tuned shape's)."""
    return num_requests if num_v_heads is None else num_requests * num_v_heads / TUNED_NUM_V_HEADS


def nearest_tuned(table, num_requests, max_seqlen=None):
    """The entry of the nearest measured verify length (ties: the longer; None: nearest to 16, the length of the
    file's "verify" table, not the longest: L 17..32 have their own BT = 32 entries), then of the measured batch
    nearest in log scale (ties: the smaller); num_requests may be a fractional work_batch. table: {L: {batch:
    entry}}; None if empty.

    Log scale (session 19, eval/results/gdn_verify_tp.md): with the tables' batches 1 / 8 / 32 / 64, 4 requests took
    the batch-1 config by linear distance, 36 % slower than batch 8's at L 4 (13.65 vs 21.31 us a layer) and 11 % at
    L 16; a TP 4 rank's batch 8 (work 2) is 23 % faster at L 16 with batch 1's than with batch 8's."""
    if not table:
        return None
    target = 16 if max_seqlen is None else max_seqlen
    length = min(table, key=lambda m: (abs(m - target), -m))
    by_batch = table[length]
    if not by_batch:
        return None
    scale = math.log2(max(num_requests, 1e-6))
    return by_batch[min(by_batch, key=lambda batch: (abs(math.log2(batch) - scale), batch))]


def write_tuned_verify_configs(path, device_name, best_by_batch, source, best_folded_by_batch=None,
                               best_by_len=None, best_recon_by_len=None, best_recon_short_by_len=None):
    """Store the sweep's fastest config per batch (`best_by_batch`, timed at L = 16), per (L, batch)
    (`best_by_len`), per batch with a fold, the fastest reconstruction launch {block_v, num_warps} per (L, batch),
    and per (L <= 4, batch) the short reconstruction's fastest launch with whether it beat the general kernel
    {short, block_v, num_warps}, in the format `default_verify_config` / `default_reconstruct_config` /
    `reconstruct_short` read."""
    doc = {"device": device_name, "source": source,
           "verify": {str(batch): asdict(cfg) for batch, cfg in sorted(best_by_batch.items())}}
    if best_by_len:
        doc["verify_by_len"] = {str(L): {str(batch): asdict(cfg) for batch, cfg in sorted(table.items())}
                                for L, table in sorted(best_by_len.items())}
    if best_folded_by_batch:
        doc["verify_fold"] = {str(batch): asdict(cfg) for batch, cfg in sorted(best_folded_by_batch.items())}
    if best_recon_by_len:
        doc["reconstruct_by_len"] = {str(L): {str(batch): dict(recon) for batch, recon in sorted(table.items())}
                                     for L, table in sorted(best_recon_by_len.items())}
    if best_recon_short_by_len:
        doc["reconstruct_short_by_len"] = {str(L): {str(batch): dict(entry) for batch, entry in sorted(table.items())}
                                           for L, table in sorted(best_recon_short_by_len.items())}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def default_verify_config(num_requests, folded=False, max_seqlen=None, state_dtype=None, num_v_heads=None):
    """The sweep's fastest config for the nearest measured (verify length, batch) when `tuned_verify_configs.json`
    was measured on this GPU (folded: the configs timed with a fold, when the file has them; max_seqlen None: the
    L = 16 table; state_dtype bf16: the table swept with bf16 states, when the file has one; num_v_heads: the layer's
    value heads on this rank, the batch looked up being `work_batch`); otherwise the v2 H200 sweep's winners
    (Qwen3-Next shape): one program per (request, head, 32 value columns) at batch 1 (latency), one per (request,
    head) walking all value blocks from batch 8 on (throughput), by the request count (not measured per rank)."""
    if folded and _tuned_verify_configs("verify_fold"):
        tables = {16: _tuned_verify_configs("verify_fold")}
    else:
        tables = {L: {batch: VerifyConfig(**cfg) for batch, cfg in table.items()}
                  for L, table in _tuned_by_len("verify_by_len", state_dtype).items()} or \
            ({16: _tuned_verify_configs("verify")} if _tuned_verify_configs("verify") else {})
    tuned = nearest_tuned(tables, work_batch(num_requests, num_v_heads), max_seqlen)
    if tuned is not None:
        return tuned
    return VerifyConfig() if num_requests < 8 else VerifyConfig(whole_v=True)


def gdn_verify(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    workspace: GDNVerifyWorkspace,
    max_seqlen: int | None = None,
    out: torch.Tensor | None = None,
    scale: float | None = None,
    config: "VerifyConfig | None" = None,
    workspace_rows: torch.Tensor | None = None,
    fold: GDNFold | None = None,
) -> torch.Tensor:
    """Core attention output of every verified token of one GDN layer, from each request's committed state.

    Computes what vLLM's GDN layer computes between the input projection and the gated RMSNorm
    (`causal_conv1d_update` + `fused_sigmoid_gating_delta_rule_update` in spec-decode mode), but writes no
    conv state, and no ssm state unless `fold` is given. It fills `workspace` for `gdn_reconstruct` (or for the
    next step's fold).

    Shapes (T = total tokens, B = requests, H k-heads, HV v-heads, D = 2*H*K + HV*V, W = conv width):
        mixed_qkv     [T, D]     raw conv inputs, channels [q (H*K) | k (H*K) | v (HV*V)] (vLLM's `mixed_qkv`);
                                 rows contiguous, any row stride (a column slice of the fused projection works)
        a, b          [T, HV]    gate inputs (rows contiguous, any row stride): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
        conv_weight   [D, W]     vLLM's `conv1d.weight.view(D, W)`; conv_bias [D] or None
        A_log, dt_bias [HV]
        conv_state    [num_slots, state_len >= W-1, D]  committed window = rows 0..W-2, oldest first
                      (vLLM's SD layout `kv_cache[0]`; the slot stride may be anything, rows contiguous)
        ssm_state     [num_slots, HV, V, K]  committed state S[v, k] (vLLM's `kv_cache[1]`), fp32/bf16/fp16
        state_indices [B] int    slot of each request; 0 = vLLM's null block: outputs zeros, touches nothing
        cu_seqlens    [B+1] int  token offsets; request i owns tokens cu_seqlens[i]:cu_seqlens[i+1]
                      (L_i = 0 allowed; L_i <= max_seqlen <= 32 is the caller's promise, tokens past it are ignored)
        workspace     `GDNVerifyWorkspace.layer(l)`: rows 0..B-1 (or workspace_rows) get this step's data
        max_seqlen    host int, max L_i (vLLM: 1 + num_speculative_tokens); None reads it from cu_seqlens (syncs)
        out           [T, HV, V] (vLLM's `core_attn_out`), default new in mixed_qkv's dtype
        scale         default head_k_dim ** -0.5
        config        launch tuning (`VerifyConfig`); default `default_verify_config(B, folded=fold is not None,
                                 max_seqlen=max_seqlen, state_dtype=ssm_state.dtype)`: the tuned config of the
                                 nearest measured (L, batch), from the bf16-state sweep for bf16 states
        workspace_rows [B] int   workspace row request i writes (default i); values < workspace.max_requests
        fold          `GDNFold`: the previous step's pending ssm update, applied first. Each request's committed
                      ssm state is advanced by fold.counts[i] tokens of fold.workspace row fold.rows[i] (as
                      gdn_reconstruct(parts="ssm") would), stored back where counts[i] > 0, and verified from;
                      null-slot requests are skipped. fold.rows and workspace_rows must not overlap.
    Returns `out`.
    """
    _check_rows("mixed_qkv", mixed_qkv)
    _check_float("mixed_qkv", mixed_qkv)
    check_ssm_state(ssm_state)
    check_conv_state(conv_state)
    num_tokens, conv_dim = mixed_qkv.shape
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    key_dims = conv_dim - num_v_heads * head_v_dim
    if key_dims <= 0 or key_dims % (2 * head_k_dim):
        raise ValueError(f"mixed_qkv width {conv_dim} does not split into 2*H*{head_k_dim} + {num_v_heads}*{head_v_dim}")
    num_k_heads = key_dims // (2 * head_k_dim)
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads {num_v_heads} must be a multiple of num_k_heads {num_k_heads}")
    for name, t in (("a", a), ("b", b)):
        _check_rows(name, t)
        _check_float(name, t)
        if t.shape != (num_tokens, num_v_heads):
            raise ValueError(f"{name} must have shape [{num_tokens}, {num_v_heads}], got {tuple(t.shape)}")
    _check_contiguous("conv_weight", conv_weight, 2)
    width = conv_weight.shape[1]
    if conv_weight.shape[0] != conv_dim or not 2 <= width <= 5:
        raise ValueError(f"conv_weight must be [{conv_dim}, W] with W in 2..5, got {tuple(conv_weight.shape)}")
    if conv_state.shape[2] != conv_dim or conv_state.shape[1] < width - 1:
        raise ValueError(f"conv_state must be [num_slots, >= {width - 1}, {conv_dim}], got {tuple(conv_state.shape)}")
    if conv_bias is not None:
        _check_contiguous("conv_bias", conv_bias, 1)
        if conv_bias.shape[0] != conv_dim:
            raise ValueError(f"conv_bias must have shape [{conv_dim}], got {tuple(conv_bias.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check_contiguous(name, t, 1)
        if t.shape[0] != num_v_heads:
            raise ValueError(f"{name} must have shape [{num_v_heads}], got {tuple(t.shape)}")
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be [B+1], got shape {tuple(cu_seqlens.shape)}")
    num_requests = cu_seqlens.shape[0] - 1
    _check_index("cu_seqlens", cu_seqlens, num_requests + 1)
    _check_index("state_indices", state_indices, num_requests)
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if num_requests > 0 else 0
    if not 0 <= max_seqlen <= MAX_VERIFY_LEN:
        raise ValueError(f"max_seqlen {max_seqlen} is above the supported maximum of {MAX_VERIFY_LEN} tokens")
    if workspace_rows is not None:
        _check_index("workspace_rows", workspace_rows, num_requests)
        _check_device("workspace_rows", workspace_rows, mixed_qkv.device)
    _check_workspace(workspace, 0 if workspace_rows is not None else num_requests, max_seqlen, num_k_heads,
                     num_v_heads, head_k_dim, head_v_dim, conv_dim, mixed_qkv.dtype, layered=False)
    if config is None:
        config = default_verify_config(num_requests, folded=fold is not None, max_seqlen=max_seqlen,
                                       state_dtype=ssm_state.dtype, num_v_heads=num_v_heads)
        if fold is not None and config.stacked:  # a tuned unfolded pick; the stacked form has no fold path
            config = dataclasses.replace(config, stacked=False, pdl=False, pdl_first=False)
    if fold is not None:
        _check_fold(fold, num_requests, num_k_heads, num_v_heads, head_k_dim, head_v_dim, mixed_qkv.device)
        if config.skip_stages:
            raise ValueError("fold cannot be combined with skip_stages (timing-only configs)")
    if out is None:
        out = mixed_qkv.new_empty(num_tokens, num_v_heads, head_v_dim)
    elif out.shape != (num_tokens, num_v_heads, head_v_dim) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{num_tokens}, {num_v_heads}, {head_v_dim}] tensor")
    scale = head_k_dim**-0.5 if scale is None else scale
    if num_requests == 0 or (max_seqlen == 0 and fold is None):
        return out

    block_t = max(16, triton.next_power_of_2(max_seqlen))
    block_v = min(config.block_v, head_v_dim)
    v_per_program = head_v_dim if config.whole_v else block_v
    neumann_steps = max(0, math.ceil(math.log2(max(max_seqlen, 1))) - 1)
    conv_w = transposed_conv_weight(conv_weight) if config.loads_first or config.weight_tiles or config.stacked \
        else conv_weight
    rows_and_fold = _rows_and_fold_args(workspace, workspace_rows, fold, state_indices)
    if config.stacked:
        if fold is not None:
            raise ValueError("VerifyConfig(stacked=True) has no fold path")
        from .stacked import launch_stacked
        return launch_stacked(mixed_qkv, a, b, conv_w, conv_bias, A_log, dt_bias, conv_state, ssm_state,
                              state_indices, cu_seqlens, workspace, out, scale, config, num_k_heads, block_t,
                              neumann_steps, config.big_dot, SMALL_DOT_PRECISION, rows_and_fold)
    if config.two_pass:
        from .two_pass import launch_two_pass
        return launch_two_pass(mixed_qkv, a, b, conv_w, conv_bias, A_log, dt_bias, conv_state, ssm_state,
                               state_indices, cu_seqlens, workspace, out, scale, config, num_k_heads, block_t,
                               neumann_steps, config.big_dot, SMALL_DOT_PRECISION, rows_and_fold)
    heads_per_program = num_v_heads // num_k_heads if config.group_heads else 1
    grid = (head_v_dim // v_per_program, num_v_heads // heads_per_program, num_requests)
    _gdn_verify_kernel[grid](
        mixed_qkv, a, b, conv_w, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
        out, workspace.u, workspace.k, workspace.g, workspace.x, *rows_and_fold["pointers"], scale, mixed_qkv.stride(0),
        a.stride(0), b.stride(0), conv_state.stride(0), ssm_state.stride(0), workspace.max_len,
        rows_and_fold["fold_len"], H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=conv_dim, W=width,
        BT=block_t, BV=block_v, HEADS_PER_PROGRAM=heads_per_program, V_PER_PROGRAM=v_per_program,
        NEUMANN_STEPS=neumann_steps, HAS_BIAS=conv_bias is not None,
        BIG_DOT=config.big_dot, SMALL_DOT=SMALL_DOT_PRECISION, STATE_DOT=config.state_dot, LOOP_STAGES=config.loop_stages, SKIP=config.skip_stages, HOIST=config.hoist,
        LOADS_FIRST=config.loads_first, BW=triton.next_power_of_2(width), WT=config.weight_tiles,
        EARLY_ST=config.early_stores and width <= 4, SPLIT_GRAM=config.split_gram,
        **rows_and_fold["constexprs"], **pdl_first_launch(config, out.device), num_warps=config.num_warps,
    )
    return out


def pdl_first_launch(config: "VerifyConfig", device: torch.device) -> dict:
    """Launch options of a verify's first launch: with `pdl_first` on sm_90 (not the interpreter), programmatic
    dependent launch and the kernel's WAIT_BEFORE."""
    if not config.pdl_first or not pdl_available(device, _gdn_verify_kernel):
        return {}
    return dict(WAIT_BEFORE=True, launch_pdl=True)


def _rows_and_fold_args(workspace, workspace_rows, fold, state_indices):
    """Kernel arguments for workspace_rows and fold; unused pointers point at state_indices / the workspace (never
    dereferenced: the constexprs switch their code off)."""
    fold_ws = fold.workspace if fold is not None else workspace
    fold_len = fold_ws.max_len if fold is not None else 1
    return dict(
        pointers=(state_indices if workspace_rows is None else workspace_rows, fold_ws.u, fold_ws.k, fold_ws.g,
                  state_indices if fold is None else fold.rows, state_indices if fold is None else fold.counts),
        fold_len=fold_len,
        constexprs=dict(HAS_WS_ROWS=workspace_rows is not None, FOLD=fold is not None,
                        BTF=max(16, triton.next_power_of_2(fold_len))),
    )


def _check_fold(fold, num_requests, num_k_heads, num_v_heads, head_k_dim, head_v_dim, device):
    if not isinstance(fold, GDNFold):
        raise ValueError(f"fold must be a GDNFold, got {type(fold).__name__}")
    if fold.rows.shape[0] != num_requests:
        raise ValueError(f"fold.rows and fold.counts must have shape [{num_requests}] (one per request), got "
                         f"{tuple(fold.rows.shape)}")
    for name, t in (("fold.rows", fold.rows), ("fold.workspace", fold.workspace.u)):
        _check_device(name, t, device)
    ws = fold.workspace
    for name, inner in (("u", (num_v_heads, head_v_dim)), ("k", (num_k_heads, head_k_dim)), ("g", (num_v_heads,))):
        t = getattr(ws, name)
        if t.ndim != 2 + len(inner) or tuple(t.shape[2:]) != inner or t.dtype != torch.float32:
            raise ValueError(f"fold.workspace.{name} must be [rows, max_len, {', '.join(map(str, inner))}] "
                             f"float32, got {tuple(t.shape)} {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"fold.workspace.{name} must be contiguous")
        if t.shape[:2] != ws.u.shape[:2]:
            raise ValueError("fold.workspace tensors disagree on their leading (rows, max_len) dims")


def _check_device(name, t, device):
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the inputs on {device}")


def _check_workspace(ws, num_requests, max_seqlen, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_dim,
                     input_dtype, layered):
    lead = 2 if layered else 1
    expected = {
        "u": ((num_v_heads, head_v_dim), torch.float32),
        "k": ((num_k_heads, head_k_dim), torch.float32),
        "g": ((num_v_heads,), torch.float32),
        "x": ((conv_dim,), input_dtype),
    }
    for name, (inner, dtype) in expected.items():
        t = getattr(ws, name)
        if t.ndim != lead + 1 + len(inner) or tuple(t.shape[lead + 1 :]) != inner or t.dtype != dtype:
            raise ValueError(
                f"workspace.{name} must be [{'layers, ' if layered else ''}requests, max_len, "
                f"{', '.join(map(str, inner))}] {dtype}, got {tuple(t.shape)} {t.dtype}"
            )
        if not t.is_contiguous():
            raise ValueError(f"workspace.{name} must be contiguous")
        if t.shape[lead - 1] < num_requests or t.shape[lead] < max_seqlen:
            raise ValueError(
                f"workspace holds {t.shape[lead - 1]} requests x {t.shape[lead]} tokens, "
                f"need {num_requests} x {max_seqlen}"
            )
    if len({getattr(ws, n).shape[: lead + 1] for n in expected}) != 1:
        raise ValueError("workspace tensors disagree on their leading (layers, requests, max_len) dims")
