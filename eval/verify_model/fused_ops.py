"""Small fused elementwise kernels of the verify pass (norms, rotary, gates), one launch each.

A production stack fuses these (vLLM: custom CUDA ops + torch.compile); running them as chains of eager torch
ops would add ~5 launches per norm and inflate the constant part of T(L). Each op has a torch path with the
same math (`backend="torch"`), used on CPU and as the correctness reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, N, stride_x, stride_res, stride_y, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    i_row = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_x = tl.load(x_ptr + i_row * stride_x + o_n, mask=m_n, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        b_x += tl.load(res_ptr + i_row * stride_res + o_n, mask=m_n, other=0.0).to(tl.float32)
        tl.store(res_ptr + i_row * stride_res + o_n, b_x.to(res_ptr.dtype.element_ty), mask=m_n)
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, axis=0) / N + eps)
    b_w = tl.load(w_ptr + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + i_row * stride_y + o_n, (b_x * b_rstd * b_w).to(y_ptr.dtype.element_ty), mask=m_n)


@triton.jit
def _gated_rmsnorm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, stride_xt, stride_xh, stride_zt, stride_zh, stride_yt,
                          stride_yh, eps, D: tl.constexpr):
    # program (token, head); z is read in place from the projection output
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, D)
    b_x = tl.load(x_ptr + i_t * stride_xt + i_h * stride_xh + o_d).to(tl.float32)
    b_z = tl.load(z_ptr + i_t * stride_zt + i_h * stride_zh + o_d).to(tl.float32)
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, axis=0) / D + eps)
    b_y = b_x * b_rstd * tl.load(w_ptr + o_d).to(tl.float32) * (b_z / (1.0 + tl.exp(-b_z)))
    tl.store(y_ptr + i_t * stride_yt + i_h * stride_yh + o_d, b_y.to(y_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["T"])
def _split_columns_kernel(x_ptr, y_ptr, T, stride_x, S0, S1, S2, BLOCK: tl.constexpr):
    # y = cat(x[:, :S0].flatten(), x[:, S0:S0+S1].flatten(), x[:, S0+S1:S0+S1+S2].flatten())
    i_t, i_s = tl.program_id(0), tl.program_id(1)
    size = tl.where(i_s == 0, S0, tl.where(i_s == 1, S1, S2))
    col = tl.where(i_s == 0, 0, tl.where(i_s == 1, S0, S0 + S1))
    dst = tl.where(i_s == 0, 0, tl.where(i_s == 1, T * S0, T * (S0 + S1))) + i_t * size
    for start in range(0, size, BLOCK):
        o_c = start + tl.arange(0, BLOCK)
        m_c = o_c < size
        b_x = tl.load(x_ptr + i_t * stride_x + col + o_c, mask=m_c)
        tl.store(y_ptr + dst + o_c, b_x, mask=m_c)


@triton.jit(do_not_specialize=["L"])
def _head_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, L, stride_xt, stride_xh, stride_yb, stride_yh,
                           stride_yl, eps, D: tl.constexpr, ROT_HALF: tl.constexpr):
    # y[b, h, l] = rope(RMSNorm(x[t = b*L + l, h])) on the first 2*ROT_HALF dims (NeoX halves)
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    p_x = x_ptr + i_t * stride_xt + i_h * stride_xh
    p_y = y_ptr + (i_t // L) * stride_yb + i_h * stride_yh + (i_t % L) * stride_yl
    o_d = tl.arange(0, D)
    b_x = tl.load(p_x + o_d).to(tl.float32)
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, axis=0) / D + eps)
    # the rotated halves are re-read (L1 hits) rather than shuffled in registers
    o_r = tl.arange(0, ROT_HALF)
    b_x1 = tl.load(p_x + o_r).to(tl.float32) * b_rstd * tl.load(w_ptr + o_r).to(tl.float32)
    b_x2 = tl.load(p_x + ROT_HALF + o_r).to(tl.float32) * b_rstd * tl.load(w_ptr + ROT_HALF + o_r).to(tl.float32)
    b_cos = tl.load(cos_ptr + i_t * ROT_HALF + o_r)
    b_sin = tl.load(sin_ptr + i_t * ROT_HALF + o_r)
    b_y = b_x * b_rstd * tl.load(w_ptr + o_d).to(tl.float32)
    tl.store(p_y + o_d, b_y.to(y_ptr.dtype.element_ty), mask=o_d >= 2 * ROT_HALF)
    tl.store(p_y + o_r, (b_x1 * b_cos - b_x2 * b_sin).to(y_ptr.dtype.element_ty))
    tl.store(p_y + ROT_HALF + o_r, (b_x2 * b_cos + b_x1 * b_sin).to(y_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["L"])
def _sigmoid_gate_kernel(o_ptr, g_ptr, y_ptr, L, stride_ob, stride_oh, stride_ol, stride_gt, stride_gh, stride_y,
                         D: tl.constexpr):
    # y[t, h*D + d] = o[b, h, l, d] * sigmoid(g[t, h, d]),  t = b*L + l
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, D)
    b_o = tl.load(o_ptr + (i_t // L) * stride_ob + i_h * stride_oh + (i_t % L) * stride_ol + o_d).to(tl.float32)
    b_g = tl.load(g_ptr + i_t * stride_gt + i_h * stride_gh + o_d).to(tl.float32)
    tl.store(y_ptr + i_t * stride_y + i_h * D + o_d, (b_o / (1.0 + tl.exp(-b_g))).to(y_ptr.dtype.element_ty))


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, N, stride_x, stride_y, BLOCK_N: tl.constexpr):
    i_row = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_a = tl.load(x_ptr + i_row * stride_x + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_b = tl.load(x_ptr + i_row * stride_x + N + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + i_row * stride_y + o_n, (b_a / (1.0 + tl.exp(-b_a)) * b_b).to(y_ptr.dtype.element_ty), mask=m_n)


@triton.jit
def _moe_combine_kernel(routed_ptr, shared_ptr, gate_ptr, y_ptr, N, stride_r, stride_s, stride_g, stride_y,
                        BLOCK_N: tl.constexpr):
    # y = routed + sigmoid(gate) * shared  (Qwen's sigmoid-gated shared expert)
    i_row = tl.program_id(0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_r = tl.load(routed_ptr + i_row * stride_r + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_s = tl.load(shared_ptr + i_row * stride_s + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_g = tl.load(gate_ptr + i_row * stride_g).to(tl.float32)
    tl.store(y_ptr + i_row * stride_y + o_n, (b_r + b_s / (1.0 + tl.exp(-b_g))).to(y_ptr.dtype.element_ty), mask=m_n)


def _rows(x: torch.Tensor) -> int:
    return x.shape[0]


def rmsnorm(x, weight, eps, residual=None, backend="triton"):
    """y = RMSNorm(x [+ residual]) * weight; with `residual`, it is updated in place to x + residual.
    x, residual: [T, N] (last dim contiguous). Returns y [T, N]."""
    if backend == "torch":
        if residual is not None:
            residual.add_(x)
            x = residual
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    y = torch.empty_like(x)
    _rmsnorm_kernel[(_rows(x),)](x, residual if residual is not None else x, weight, y, x.shape[1], x.stride(0),
                                 residual.stride(0) if residual is not None else 0, y.stride(0), eps,
                                 HAS_RESIDUAL=residual is not None, BLOCK_N=triton.next_power_of_2(x.shape[1]),
                                 num_warps=4)
    return y


def gated_rmsnorm(x, z, weight, eps, backend="triton"):
    """RMSNorm(x) * weight * silu(z) per (token, head). x, z: [T, H, D] views (last dim contiguous).
    Returns [T, H * D] contiguous."""
    T, H, D = x.shape
    if backend == "torch":
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return (y * torch.nn.functional.silu(z.float())).to(x.dtype).reshape(T, H * D)
    y = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    _gated_rmsnorm_kernel[(T, H)](x, z, weight, y, x.stride(0), x.stride(1), z.stride(0), z.stride(1), y.stride(0),
                                  y.stride(1), eps, D=D, num_warps=1)
    return y.view(T, H * D)


def split_columns(x, sizes, backend="triton"):
    """x [T, >= sum(sizes)] -> contiguous parts [T, sizes[i]], stored back to back in one buffer (one launch)."""
    T = x.shape[0]
    sizes = list(sizes) + [0] * (3 - len(sizes))
    if len(sizes) != 3:
        raise ValueError("split_columns takes at most 3 parts")
    if backend == "torch":
        y = torch.cat([x[:, sum(sizes[:i]):sum(sizes[:i + 1])].reshape(-1) for i in range(3)])
    else:
        y = torch.empty(T * sum(sizes), dtype=x.dtype, device=x.device)
        _split_columns_kernel[(T, 3)](x, y, T, x.stride(0), *sizes, BLOCK=1024, num_warps=4)
    parts, off = [], 0
    for n in sizes:
        if n:
            parts.append(y[off:off + T * n].view(T, n))
        off += T * n
    return parts


def head_norm_rope(x, weight, cos, sin, eps, out, L, backend="triton"):
    """Per (token, head) RMSNorm over head_dim, then NeoX rotary on the first 2 * cos.shape[1] dims, written to
    out[b, h, l] for token t = b * L + l. x: [T, H, D] view, out: [B, H, L, D] view (last dims contiguous),
    cos/sin: [T, rot_dim / 2] fp32."""
    T, H, D = x.shape
    half = cos.shape[1]
    if backend == "torch":
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        x1, x2 = xf[..., :half].clone(), xf[..., half:2 * half].clone()
        c, s = cos[:, None, :], sin[:, None, :]
        xf[..., :half] = x1 * c - x2 * s
        xf[..., half:2 * half] = x2 * c + x1 * s
        out.copy_(xf.view(T // L, L, H, D).transpose(1, 2).to(out.dtype))
        return out
    if x.stride(2) != 1 or out.stride(3) != 1 or D & (D - 1) or half & (half - 1):
        raise ValueError("head_norm_rope needs contiguous last dims and power-of-two head / rotary dims")
    _head_norm_rope_kernel[(T, H)](x, weight, cos, sin, out, L, x.stride(0), x.stride(1), out.stride(0),
                                   out.stride(1), out.stride(2), eps, D=D, ROT_HALF=half, num_warps=2)
    return out


def sigmoid_gate(o, gate, backend="triton"):
    """o [B, H, L, D] (any strides, last contiguous) * sigmoid(gate [T, H, D] view), t = b*L + l.
    Returns [T, H*D] contiguous."""
    B, H, L, D = o.shape
    T = B * L
    if backend == "torch":
        of = o.float().transpose(1, 2).reshape(T, H, D)
        return (of * torch.sigmoid(gate.float())).reshape(T, H * D).to(o.dtype)
    y = torch.empty(T, H * D, dtype=o.dtype, device=o.device)
    _sigmoid_gate_kernel[(T, H)](o, gate, y, L, o.stride(0), o.stride(1), o.stride(2), gate.stride(0),
                                 gate.stride(1), y.stride(0), D=D, num_warps=2)
    return y


def silu_mul(x, backend="triton"):
    """x [T, 2N] -> silu(x[:, :N]) * x[:, N:]."""
    n = x.shape[1] // 2
    if backend == "torch":
        return (torch.nn.functional.silu(x[:, :n].float()) * x[:, n:].float()).to(x.dtype)
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    _silu_mul_kernel[(_rows(x),)](x, y, n, x.stride(0), y.stride(0), BLOCK_N=triton.next_power_of_2(n), num_warps=4)
    return y


def moe_combine(routed, shared, gate_logit, backend="triton"):
    """routed [T, N] + sigmoid(gate_logit [T, 1]) * shared [T, N]."""
    if backend == "torch":
        return (routed.float() + torch.sigmoid(gate_logit.float()) * shared.float()).to(routed.dtype)
    y = torch.empty_like(routed)
    _moe_combine_kernel[(_rows(routed),)](routed, shared, gate_logit, y, routed.shape[1], routed.stride(0),
                                          shared.stride(0), gate_logit.stride(0), y.stride(0),
                                          BLOCK_N=triton.next_power_of_2(routed.shape[1]), num_warps=4)
    return y
