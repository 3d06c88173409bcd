"""Gluon prototype of the small-batch GDN verify (`VerifyConfig(gluon_b1=True)`), compile-checked only.

Computes what the Triton b1 pick (`_gdn_verify_kernel` with hoist, weight_tiles, early_stores) computes: outputs O,
workspace u / k / G / raw rows, one program per (value block BV, v-head, request), same tf32 Gram and state products.
The [L, L] factor products (Neumann steps, inv @ rhs, attn @ u) run as tf32x3 mma.sync (hi x hi + hi x lo + lo x hi,
~fp32) where the Triton pick runs fp32 FMA dots: results agree to fp32 rounding, not bit for bit.

Why Gluon (eval/notes/gdn_verify.md, v4's SASS and sessions 3-6): the b1 verify is one dependent chain per program at
~1 warp per scheduler, and Triton's layout choices put shared-memory round trips and CTA barriers on it (the state
block copied into shared memory as an MMA operand, the Gram's operands, every [L, L] product's operands and results
converted across warps). Here the layouts are chosen so that only one exchange crosses warps:

    QK     BlockedLayout [BT, K], rows across warps, a row's K inside one warp (norms: shuffles only): q / k conv taps
    Z      k_n, q_n [BT, K] written once to shared memory: the one CTA barrier of the chain (k must be seen both as
           rows and as columns of the Gram)
    MMA_S  mma.sync layout with warps along M = 64 > BT: every warp holds the whole [BT, BT] tile (replicated), so the
           Gram, gates, decay and Neumann steps and their operand conversions stay inside each warp (shuffles)
    MMA_V  mma.sync layout with warps along the value columns: warp w owns columns 8w..8w+7 of the block, all rows;
           the state block is loaded from global straight into its B-operand layout (S^T chunks, no shared memory),
           the v conv taps straight into its accumulator layout, and u = inv @ rhs, O = gamma qs + attn @ u are
           column-separable, so each warp finishes its own columns with no exchange.

Every global load (q / k / v taps and weight tiles, gates, state chunks) is issued before the first barrier. Compiles
only for sm_90 under the checked Triton versions (`gluon_b1_plan` says why not; the caller logs it and runs the
Triton verify). Not run under TRITON_INTERPRET.
"""
from .gluon_support import toolchain_refusal

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon or without its ampere mma_v2: gluon_b1_plan says so
    HAVE_GLUON = False

# Triton versions this kernel was compiled and read on (offline, sm_90): Gluon's API differs between them.
CHECKED_TRITON = ("3.6", "3.9")
BLOCK_V = 32  # value columns per program: 8 per warp (one n8 mma tile each; at 8 warps warps 4..7 repeat 0..3)
WARPS = (4, 8)  # 8: the q / k conv and norms split twice as fine (the [L, L] chain is per warp either way)
K_CHUNK = 32  # state / Z products walk K in chunks (registers: a chunk of S^T is 8 per thread)


def gluon_b1_plan(config, num_k_heads, num_v_heads, head_k_dim, head_v_dim, width, block_t, state_dtype, folded,
                  capability, interpreting=False, triton_version=None, have_gluon=None):
    """Why the Gluon b1 verify cannot run this call (a sentence), or None when it can. Pure host logic (CPU-tested);
    capability (major, minor) of the device, None off the GPU."""
    import torch
    if interpreting:
        return "the Triton interpreter does not run Gluon"
    why = toolchain_refusal("Gluon b1 verify", "with the ampere mma_v2", CHECKED_TRITON,
                            HAVE_GLUON if have_gluon is None else have_gluon, triton_version, capability)
    if why:
        return why
    if folded:
        return "the Gluon b1 verify has no fold path"
    if config.big_dot != "tf32" or config.state_dot != "fp32":
        return f"the Gluon b1 verify has tf32 state products only (big_dot {config.big_dot}, state_dot " \
               f"{config.state_dot})"
    if config.block_v != BLOCK_V or config.num_warps not in WARPS:
        return f"the Gluon b1 verify is built for block_v {BLOCK_V} at 4 or 8 warps (got {config.block_v}, " \
               f"{config.num_warps})"
    if block_t != 16:  # L <= 16: the [BT, BT] tiles are one m16 row of mma tiles, replicated per warp
        return f"the Gluon b1 verify is built for verify lengths <= 16 (BT 16), got BT {block_t}"
    if (head_k_dim, head_v_dim) != (128, 128):  # the shape compile-checked (Qwen3-Next, Qwen3.5 / 3.6)
        return f"the Gluon b1 verify is built for K = V = 128 (K {head_k_dim}, V {head_v_dim})"
    if not 2 <= width <= 4:
        return f"the Gluon b1 verify has conv widths 2..4, got {width}"
    if num_v_heads % num_k_heads:
        return f"num_v_heads {num_v_heads} is not a multiple of num_k_heads {num_k_heads}"
    if state_dtype not in (torch.float32, torch.bfloat16):
        return f"the Gluon b1 verify reads fp32 or bf16 states, got {state_dtype}"
    return None


def gluon_b1_fallback(config):
    """The Triton verify a refused gluon_b1 config runs: the b1 pick's form at the same block / warps."""
    import dataclasses
    return dataclasses.replace(config, gluon_b1=False, hoist=True, weight_tiles=True, early_stores=True)


def launch_gluon_b1(mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices,
                    cu_seqlens, workspace, out, scale, ws_rows, has_ws_rows, num_k_heads, block_t, neumann_steps,
                    num_warps=4):
    """Grid (V / BV, HV, B); shapes checked by gdn_verify and gluon_b1_plan."""
    num_requests = cu_seqlens.shape[0] - 1
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    width, conv_dim = conv_wT.shape
    _gluon_b1_kernel[(head_v_dim // BLOCK_V, num_v_heads, num_requests)](
        mixed_qkv, a, b, conv_wT, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens, out,
        workspace.u, workspace.k, workspace.g, workspace.x, ws_rows, scale, mixed_qkv.stride(0), a.stride(0),
        b.stride(0), conv_state.stride(0), ssm_state.stride(0), workspace.max_len,
        H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=conv_dim, W=width, BT=block_t, BV=BLOCK_V,
        KC=K_CHUNK, NEUMANN_STEPS=neumann_steps, HAS_BIAS=conv_bias is not None, HAS_WS_ROWS=has_ws_rows,
        num_warps=num_warps,
    )
    return out


if HAVE_GLUON:

    @gluon.jit
    def _tap_loads(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, j: gl.constexpr, D: gl.constexpr,
                   W: gl.constexpr):
        """Tap j of 4 of a depth-W conv, taps aligned to the right (tap 3 is the current token for any W <= 4, so the
        raw rows the workspace keeps are always tap 3's inputs; taps j < 4 - W are zeros): input rows [BT, C] in
        o_t / o_c's parent layout (x, or the committed window for negative token indices) and the tap's weights [C]
        in o_c's layout, a slice of the same parent (broadcast over rows in registers: no conversion, where Triton's
        [BT, C] weight tiles load every row again)."""
        src = o_t + (j - 3)
        p_in = gl.where((src >= 0)[:, None], x_req + src[:, None] * stride_x + o_c[None, :],
                        conv_window + (src + (W - 1))[:, None] * D + o_c[None, :])
        b_in = gl.load(p_in, mask=(m_t & (j >= 4 - W))[:, None], other=0.0)
        b_w = gl.load(conv_wT + (j - (4 - W)) * D + o_c, mask=(o_c >= 0) & (j >= 4 - W), other=0.0)
        return b_in, b_w

    @gluon.jit
    def _conv_silu(i0, w0, i1, w1, i2, w2, i3, w3, conv_b, o_t, m_t, o_c, HAS_BIAS: gl.constexpr):
        """silu(sum_j input_j * weight_j + bias), zero past the request's length (verify._conv4_math)."""
        acc = i0.to(gl.float32) * w0.to(gl.float32)[None, :] + i1.to(gl.float32) * w1.to(gl.float32)[None, :]
        acc += i2.to(gl.float32) * w2.to(gl.float32)[None, :] + i3.to(gl.float32) * w3.to(gl.float32)[None, :]
        if HAS_BIAS:
            acc += gl.load(conv_b + o_c).to(gl.float32)[None, :]
        acc = acc * (1.0 / (1.0 + gl.exp(-acc)))
        return gl.where(m_t[:, None], acc, 0.0)

    @gluon.jit
    def _tf32_split(v):
        """(hi, lo): hi = v's top 19 bits (exact in tf32), lo = v - hi (exact in fp32)."""
        hi = (v.to(gl.int32, bitcast=True) & -8192).to(gl.float32, bitcast=True)
        return hi, v - hi

    @gluon.jit
    def _dot_x3(a, b, acc_layout: gl.constexpr):
        """a @ b ([M, N] fp32, ~fp32 exact) as three tf32 mma.sync products into acc_layout; a and b in any layouts
        whose conversions to acc_layout's operand layouts stay inside a warp."""
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_layout, k_width=1)
        a_hi, a_lo = _tf32_split(gl.convert_layout(a, A_OP))
        b_hi, b_lo = _tf32_split(gl.convert_layout(b, B_OP))
        acc = gl.zeros([a.shape[0], b.shape[1]], gl.float32, acc_layout)
        acc = mma_v2(a_lo, b_hi, acc, input_precision="tf32")
        acc = mma_v2(a_hi, b_lo, acc, input_precision="tf32")
        return mma_v2(a_hi, b_hi, acc, input_precision="tf32")

    @gluon.jit(do_not_specialize=["scale", "WS_LEN"])
    def _gluon_b1_kernel(
        x, a, b, conv_wT, conv_b, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens, o, ws_u, ws_k,
        ws_g, ws_x, ws_rows, scale, stride_x, stride_a, stride_b, stride_conv_slot, stride_ssm_slot, WS_LEN,
        H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, D: gl.constexpr, W: gl.constexpr,
        BT: gl.constexpr, BV: gl.constexpr, KC: gl.constexpr, NEUMANN_STEPS: gl.constexpr, HAS_BIAS: gl.constexpr,
        HAS_WS_ROWS: gl.constexpr,
    ):
        """Program (value block, v-head, request); see the module docstring for the layouts."""
        NW: gl.constexpr = gl.num_warps()
        QK: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])
        MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
        MMA_V: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
        A_S: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_S, k_width=1)
        B_S: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA_S, k_width=1)
        A_V: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_V, k_width=1)
        B_V: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA_V, k_width=1)
        # 16-byte chunks XOR-swizzled by row: an mma.sync operand read (8 rows x 4 columns per warp) hits 8 banks sets
        Z_SMEM: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])

        i_vs, i_hv, i_n = gl.program_id(0), gl.program_id(1), gl.program_id(2)
        i_h = i_hv // (HV // H)
        bos = gl.load(cu_seqlens + i_n).to(gl.int64)
        seqlen = gl.load(cu_seqlens + i_n + 1).to(gl.int64) - bos
        slot = gl.load(state_indices + i_n).to(gl.int64)
        v0 = i_vs * BV
        # 64-bit request bases, 32-bit per-element offsets (one IMAD per address instead of a 64-bit product)
        x_req = x + bos * stride_x
        o_req = o + bos * (HV * V)

        t_v = gl.arange(0, BT, gl.SliceLayout(1, MMA_V))  # rows of the value-side tiles
        m_tv = t_v < seqlen
        o_v = v0 + gl.arange(0, BV, gl.SliceLayout(0, MMA_V))
        p_o = o_req + (t_v[:, None] * HV + i_hv) * V + o_v[None, :]
        if slot <= 0:  # vLLM's null block: a padding row of a CUDA-graph batch
            gl.store(p_o, gl.zeros([BT, BV], o.dtype.element_ty, MMA_V), mask=m_tv[:, None])
            return
        conv_window = conv_state + slot * stride_conv_slot
        writer = (i_vs == 0) & (i_hv % (HV // H) == 0)  # one program per k-head writes its k and raw q / k rows

        # ---- every global load first: v taps (MMA_V accumulator layout), q / k taps (QK), gates, state chunks
        o_xv = 2 * H * K + i_hv * V + o_v
        v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_ = _conv4_loads_gl(x_req, stride_x, conv_window, conv_wT, t_v, m_tv,
                                                                 o_xv, D, W)
        t_q = gl.arange(0, BT, gl.SliceLayout(1, QK))
        m_tq = t_q < seqlen
        o_k = gl.arange(0, K, gl.SliceLayout(0, QK))
        o_xq = i_h * K + o_k
        o_xk = (H + i_h) * K + o_k
        q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_ = _conv4_loads_gl(x_req, stride_x, conv_window, conv_wT, t_q, m_tq,
                                                                 o_xq, D, W)
        k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_ = _conv4_loads_gl(x_req, stride_x, conv_window, conv_wT, t_q, m_tq,
                                                                 o_xk, D, W)
        t_r = gl.arange(0, BT, gl.SliceLayout(1, MMA_S))  # token as row (t) / as column (s) of the [BT, BT] tiles
        t_c = gl.arange(0, BT, gl.SliceLayout(0, MMA_S))
        m_tr = t_r < seqlen
        m_tc = t_c < seqlen
        a_req = a + bos * stride_a + i_hv
        b_b_r = gl.load(b + bos * stride_b + i_hv + t_r * stride_b, mask=m_tr, other=0.0).to(gl.float32)
        b_a_r = gl.load(a_req + t_r * stride_a, mask=m_tr, other=0.0).to(gl.float32)
        b_a_c = gl.load(a_req + t_c * stride_a, mask=m_tc, other=0.0).to(gl.float32)
        b_dtb = gl.load(dt_bias + i_hv).to(gl.float32)
        b_alog = gl.load(A_log + i_hv).to(gl.float32)
        # S^T [K, BV] in K chunks, each straight into the state products' B-operand layout
        k_c = gl.arange(0, KC, gl.SliceLayout(1, B_V))
        v_c = v0 + gl.arange(0, BV, gl.SliceLayout(0, B_V))
        p_s = ssm_state + slot * stride_ssm_slot + i_hv * (V * K) + (v_c[None, :] * K + k_c[:, None])
        s0 = gl.load(p_s).to(gl.float32)
        s1 = gl.load(p_s + KC).to(gl.float32)
        s2 = gl.load(p_s + 2 * KC).to(gl.float32)
        s3 = gl.load(p_s + 3 * KC).to(gl.float32)

        if HAS_WS_ROWS:
            ws_base = gl.load(ws_rows + i_n).to(gl.int64) * WS_LEN
        else:
            ws_base = i_n.to(gl.int64) * WS_LEN
        ws_x_req = ws_x + ws_base * D
        # raw rows for the reconstruction's conv windows, stored as soon as loaded
        gl.store(ws_x_req + t_v[:, None] * D + o_xv[None, :], v6_,
                 mask=m_tv[:, None])
        m_w = t_q < gl.where(writer, seqlen, 0)
        gl.store(ws_x_req + t_q[:, None] * D + o_xq[None, :], q6_,
                 mask=m_w[:, None])
        gl.store(ws_x_req + t_q[:, None] * D + o_xk[None, :], k6_,
                 mask=m_w[:, None])

        # ---- q / k: conv, L2 norm (row reductions inside a warp), one trip through shared memory
        b_q = _conv_silu(q0_, q1_, q2_, q3_, q4_, q5_, q6_, q7_, conv_b, t_q, m_tq, o_xq, HAS_BIAS)
        b_k = _conv_silu(k0_, k1_, k2_, k3_, k4_, k5_, k6_, k7_, conv_b, t_q, m_tq, o_xk, HAS_BIAS)
        b_q = b_q * gl.rsqrt(gl.sum(b_q * b_q, 1) + 1e-6)[:, None]
        b_k = b_k * gl.rsqrt(gl.sum(b_k * b_k, 1) + 1e-6)[:, None]
        gl.store(ws_k + ws_base * (H * K) + (t_q[:, None] * H + i_h) * K + o_k[None, :], b_k, mask=m_w[:, None])
        z_k = gl.allocate_shared_memory(gl.float32, [BT, K], Z_SMEM, b_k)
        z_q = gl.allocate_shared_memory(gl.float32, [BT, K], Z_SMEM, b_q)

        # ---- gates (every warp, replicated): g, beta, G = cumsum(g) as masked row / column sums
        causal = t_r[:, None] >= t_c[None, :]
        g_r = gl.where(m_tr, -gl.exp(b_alog) * _softplus(b_a_r + b_dtb), 0.0)
        g_c = gl.where(m_tc, -gl.exp(b_alog) * _softplus(b_a_c + b_dtb), 0.0)
        b_G_r = gl.sum(gl.where(causal, g_c[None, :], 0.0), 1)  # G_t = sum_{s <= t} g_s
        b_G_c = gl.sum(gl.where(t_r[:, None] <= t_c[None, :], g_r[:, None], 0.0), 0)  # G_s, by column token s
        b_beta_r = gl.where(m_tr, 1.0 / (1.0 + gl.exp(-b_b_r)), 0.0)
        gl.store(ws_g + ws_base * HV + t_r * HV + i_hv, b_G_r, mask=t_r < gl.where(i_vs == 0, seqlen, 0))

        # ---- Gram products (tf32), every warp the whole [BT, BT]
        b_kk = gl.zeros([BT, BT], gl.float32, MMA_S)
        b_qk = gl.zeros([BT, BT], gl.float32, MMA_S)
        b_ks = gl.zeros([BT, BV], gl.float32, MMA_V)
        b_qs = gl.zeros([BT, BV], gl.float32, MMA_V)
        for c in gl.static_range(K // KC):
            kt = z_k.slice(c * KC, KC, dim=1).permute((1, 0)).load(B_S)
            b_kk = mma_v2(z_k.slice(c * KC, KC, dim=1).load(A_S), kt, b_kk, input_precision="tf32")
            b_qk = mma_v2(z_q.slice(c * KC, KC, dim=1).load(A_S), kt, b_qk, input_precision="tf32")
        # ---- state products k S^T, q S^T (tf32), warp w on its 8 value columns
        b_ks = mma_v2(z_k.slice(0, KC, dim=1).load(A_V), s0, b_ks, input_precision="tf32")
        b_qs = mma_v2(z_q.slice(0, KC, dim=1).load(A_V), s0, b_qs, input_precision="tf32")
        b_ks = mma_v2(z_k.slice(KC, KC, dim=1).load(A_V), s1, b_ks, input_precision="tf32")
        b_qs = mma_v2(z_q.slice(KC, KC, dim=1).load(A_V), s1, b_qs, input_precision="tf32")
        b_ks = mma_v2(z_k.slice(2 * KC, KC, dim=1).load(A_V), s2, b_ks, input_precision="tf32")
        b_qs = mma_v2(z_q.slice(2 * KC, KC, dim=1).load(A_V), s2, b_qs, input_precision="tf32")
        b_ks = mma_v2(z_k.slice(3 * KC, KC, dim=1).load(A_V), s3, b_ks, input_precision="tf32")
        b_qs = mma_v2(z_q.slice(3 * KC, KC, dim=1).load(A_V), s3, b_qs, input_precision="tf32")

        # ---- (I + A)^-1 by Neumann squarings, inside each warp
        eye = gl.where(t_r[:, None] == t_c[None, :], 1.0, 0.0)
        decay = gl.where(causal, gl.exp(gl.where(causal, b_G_r[:, None] - b_G_c[None, :], 0.0)), 0.0)
        b_A = gl.where(t_r[:, None] > t_c[None, :], b_beta_r[:, None] * decay * b_kk, 0.0)
        b_inv = eye - b_A
        b_pow = b_A
        b_attn = decay * b_qk
        for _ in gl.static_range(NEUMANN_STEPS):
            b_pow = _dot_x3(b_pow, b_pow, MMA_S)
            b_inv = _dot_x3(b_inv, eye + b_pow, MMA_S)

        # ---- value side: u = inv @ (beta (v - gamma ks)), O = gamma qs + attn @ u, warp w on its own columns
        b_v = _conv_silu(v0_, v1_, v2_, v3_, v4_, v5_, v6_, v7_, conv_b, t_v, m_tv, o_xv, HAS_BIAS)
        b_gamma_v = gl.convert_layout(gl.exp(b_G_r), gl.SliceLayout(1, MMA_V))
        b_beta_v = gl.convert_layout(b_beta_r, gl.SliceLayout(1, MMA_V))
        b_rhs = b_beta_v[:, None] * (b_v - b_gamma_v[:, None] * b_ks)
        b_u = _dot_x3(b_inv, b_rhs, MMA_V)  # the factor goes from MMA_S to MMA_V's A operand: both whole per warp
        b_out = b_gamma_v[:, None] * b_qs + _dot_x3(b_attn, b_u, MMA_V)
        gl.store(p_o, (b_out * scale).to(o.dtype.element_ty), mask=m_tv[:, None])
        gl.store(ws_u + ws_base * (HV * V) + (t_v[:, None] * HV + i_hv) * V + o_v[None, :], b_u, mask=m_tv[:, None])

    @gluon.jit
    def _softplus(v):
        return gl.where(v <= 20.0, gl.log(1.0 + gl.exp(v)), v)

    @gluon.jit
    def _conv4_loads_gl(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, D: gl.constexpr, W: gl.constexpr):
        """Every load of a depth-W (<= 4) conv in o_t / o_c's parent layout, issued before any of its math."""
        i0, w0 = _tap_loads(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, 0, D, W)
        i1, w1 = _tap_loads(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, 1, D, W)
        i2, w2 = _tap_loads(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, 2, D, W)
        i3, w3 = _tap_loads(x_req, stride_x, conv_window, conv_wT, o_t, m_t, o_c, 3, D, W)
        return i0, w0, i1, w1, i2, w2, i3, w3
