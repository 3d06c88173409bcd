"""Gluon prototype of the stacked state pass (`VerifyConfig(stacked=True, gluon_state=True)`), compile-checked only.

Computes what `stacked._stacked_state_kernel` computes (same inputs, outputs and workspace writes: u, O, raw v; tf32
state product, tf32x3 or tf32 small products), organised so that an SM keeps state reads in flight while items'
tails run (eval/notes/gdn_verify.md, "Session 6, PG"):

    grid (SMs,): persistent CTAs, CTA p walking work items (k-head, request) p, p + grid, ...; warp-specialised:
      producer   1 warp    TMA: per item, each consumer's [BV, K] state blocks into its ring of `gluon_stages` slots
                           and Z = [k; q] of the k-head into one of two buffers (mbarrier ready / empty pairs); it
                           runs ahead into the next item while the consumers finish this one
      consumer c 4 warps   (v-head c of the k-head: HV / H = 2 consumers) per value block: v conv (pointer loads,
                           before the ring wait), P^T = S Z^T (wgmma, state block and Z straight from the TMA'd shared
                           memory), release the ring slot, Y^T = P^T F^T + Vc^T E^T (tf32x3: 3 + 3 wgmmas, A from
                           registers, F^T / E^T split hi / lo once per item into shared memory), stores

Why this shape (the per-block pass's ncu profile, call 1 of GB6): ~1,350 instructions per 4-warp program at ~27 % of
issue slots, 4 CTAs per SM, each CTA waiting on its one state block before a tail with nothing in flight, and a new
CTA's first load exposed at every one of the ~16 program starts per SM. Here: (1) a ring slot is released as soon as
the first product has read it, so the producer's next TMA (the same item's next block or the next item's first)
overlaps the tail, across item boundaries too (persistent); (2) Z is read once per (k-head, request) instead of once
per (v-head, block), the factors' split once per (v-head, request) instead of once per block. The cost: Triton gives
a warp-specialised CTA the whole register file (12 warps x 168 registers, setmaxnreg: producer 40, consumers 232),
and it holds ~136 KB of shared memory, so one CTA per SM: 2 tails in flight instead of 4 (GB6's persistent Triton
pass lost on exactly this; here each tail has its next state block already in shared memory and fewer instructions).

Compiles only for sm_90 (wgmma, TMA); `gluon_state_plan` decides, and says why not (the launcher logs it once and runs
the Triton state pass). Not run under TRITON_INTERPRET.
"""
import triton.language as tl

from .gluon_support import toolchain_refusal

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    # triton 3.9 renamed the TMA load (3.6 has only the old name, 3.9 raises on it)
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon (or an older Gluon API): gluon_state_plan says so
    HAVE_GLUON = False

# Triton versions this kernel was compiled and read on (offline, sm_90): Gluon's API differs between them.
CHECKED_TRITON = ("3.6", "3.9")
NUM_CONSUMER_WARPS = 4  # one warpgroup: wgmma M = 64 = BV
BLOCK_V = 64
# setmaxnreg of the TMA warp and of the second consumer warpgroup (the first gets the rest of the 3 x 168; at 152 the
# consumers spilled 336 B, triton 3.6)
PRODUCER_REGS = tl.constexpr(40)
CONSUMER_REGS = tl.constexpr(232)


def gluon_state_plan(ssm_state, config, num_k_heads, block_t, capability, triton_version=None, have_gluon=None):
    """Why the Gluon state pass cannot run this call (a sentence), or None when it can. Pure host logic (CPU-tested):
    ssm_state [slots, HV, V, K] (only its shape, dtype, strides and alignment are read); capability (major, minor)
    of the device, None off the GPU."""
    num_slots, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    why = toolchain_refusal("Gluon state pass", "hopper TMA / wgmma / warp_specialize", CHECKED_TRITON,
                            HAVE_GLUON if have_gluon is None else have_gluon, triton_version, capability)
    if why:
        return why
    if config.stacked_dot not in ("tf32x3", "tf32") or config.big_dot != "tf32":
        return f"the Gluon state pass has tf32 / tf32x3 products only (big_dot {config.big_dot}, stacked_dot " \
               f"{config.stacked_dot})"
    heads_per_group = num_v_heads // num_k_heads
    if heads_per_group != 2:  # Qwen3-Next, Qwen3.5 / 3.6: 16 k-heads, 32 v-heads
        return f"the Gluon state pass has one consumer warpgroup per v-head of a k-head (2), got {heads_per_group}"
    if block_t > 16:  # triton 3.6, BT 32, fp32 states: 246 KB shared (over the 227 KB an SM has), 752 B spilled
        return f"the Gluon state pass is built for verify lengths <= 16 (BT 16), got BT {block_t}"
    if (head_k_dim, head_v_dim) != (128, 128):  # the shape compile-checked (Qwen3-Next, Qwen3.5 / 3.6)
        return f"the Gluon state pass is built for K = V = 128 (K {head_k_dim}, V {head_v_dim})"
    if ssm_state.dtype not in _STATE_DTYPES:
        return f"the Gluon state pass reads fp32 or bf16 states, got {ssm_state.dtype}"
    slot_bytes = ssm_state.stride(0) * ssm_state.element_size()
    if ssm_state.stride(0) % head_k_dim or slot_bytes % 16 or ssm_state.data_ptr() % 16 \
            or ssm_state.stride(1) != head_v_dim * head_k_dim or not ssm_state[0].is_contiguous():
        return "ssm state slots are not TMA-addressable as [BV, K] boxes of one 2-D view (slot stride " \
               f"{ssm_state.stride(0)} elements not a multiple of K = {head_k_dim} and 16 bytes, or base unaligned)"
    return None


def _state_dtypes():
    import torch
    return (torch.float32, torch.bfloat16)


_STATE_DTYPES = _state_dtypes()


def _state_rows_view(ssm_state):
    """The states as one [rows, K] matrix (row = slot * stride(0) / K + hv * V + v): a padded slot stride (vLLM's
    interleaved pages) is a whole number of K-wide rows, so one 2-D descriptor addresses every slot."""
    num_slots, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    slot_rows = ssm_state.stride(0) // head_k_dim
    rows = (num_slots - 1) * slot_rows + num_v_heads * head_v_dim
    return ssm_state.as_strided((rows, head_k_dim), (head_k_dim, 1)), slot_rows


def num_sms(device):
    """CTAs of the persistent grid: one per SM (the warp-specialised CTA holds the register file: 12 warps x 168)."""
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def launch_gluon_state(mixed_qkv, conv_wT, conv_bias, conv_state, ssm_state, state_indices, cu_seqlens, out,
                       workspace, ws_rows, has_ws_rows, z_kq, fac, config, num_k_heads, block_t, wait_prep):
    """Persistent CTAs over the (k-head, request) work items (shapes checked by gdn_verify and gluon_state_plan)."""
    import torch
    num_requests = cu_seqlens.shape[0] - 1
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    width, conv_dim = conv_wT.shape
    rows, slot_rows = _state_rows_view(ssm_state)
    gl_state_ty = gl.float32 if ssm_state.dtype == torch.float32 else gl.bfloat16
    state_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_V, head_k_dim], gl_state_ty)
    z_layout = gl.NVMMASharedLayout.get_default_for([2 * block_t, head_k_dim], gl.float32)
    state_desc = GluonTensorDescriptor.from_tensor(rows, [BLOCK_V, head_k_dim], state_layout)
    z_desc = GluonTensorDescriptor.from_tensor(z_kq.view(-1, head_k_dim), [2 * block_t, head_k_dim], z_layout)
    num_work = num_k_heads * num_requests
    _gluon_state_kernel[(min(num_work, num_sms(out.device)),)](
        mixed_qkv, conv_wT, conv_bias, conv_state, state_indices, cu_seqlens, out, workspace.u, workspace.x, ws_rows,
        fac, state_desc, z_desc, mixed_qkv.stride(0), conv_state.stride(0), slot_rows, workspace.max_len, num_work,
        H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=conv_dim, W=width, BT=block_t, BV=BLOCK_V,
        HAS_BIAS=conv_bias is not None, SMALL_X3=config.stacked_dot == "tf32x3", HAS_WS_ROWS=has_ws_rows,
        WAIT_PREP=wait_prep, STAGES=config.gluon_stages, num_warps=NUM_CONSUMER_WARPS,
        **(dict(launch_pdl=True) if wait_prep else {}),
    )
    return out


if HAVE_GLUON:

    @gluon.jit
    def _grid_dependency_wait(token):
        """griddepcontrol.wait (PDL: the prep grid's writes are visible after it) for the threads that run it."""
        return gl.inline_asm_elementwise("griddepcontrol.wait;\nmov.u32 $0, $1;", "=r,r", [token], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _tf32_split(a):
        """(hi, lo) with hi = a's top 19 bits (exact in tf32) and lo = a - hi (exact in fp32): hi x hi + hi x lo +
        lo x hi on tf32 tensor cores is the tf32x3 product."""
        hi = (a.to(gl.int32, bitcast=True) & -8192).to(gl.float32, bitcast=True)
        return hi, a - hi

    @gluon.jit
    def _store_factor_split(dst_hi, dst_lo, p_rows, ROWS: gl.constexpr, COLS: gl.constexpr, row_stride,
                            LOAD: gl.constexpr, SMALL_X3: gl.constexpr):
        """A [ROWS (k), COLS (n)] factor tile (F^T or E^T rows) into shared memory as the wgmma B operand, stored
        [n, k] (K-major: what tf32 wgmma reads), split hi / lo for tf32x3."""
        o_r = gl.arange(0, ROWS, gl.SliceLayout(1, LOAD))
        o_c = gl.arange(0, COLS, gl.SliceLayout(0, LOAD))
        tile = gl.load(p_rows + o_r[:, None] * row_stride + o_c[None, :])
        if SMALL_X3:
            hi, lo = _tf32_split(tile)
            dst_hi.store(gl.permute(hi, (1, 0)))
            dst_lo.store(gl.permute(lo, (1, 0)))
        else:
            dst_hi.store(gl.permute(tile, (1, 0)))

    @gluon.jit
    def _conv_silu_vt(x, stride_x, conv_window, conv_wT, conv_b, bos, o_t, m_t, o_c, D: gl.constexpr,
                      W: gl.constexpr, HAS_BIAS: gl.constexpr, LAYOUT: gl.constexpr):
        """[C, BT] silu(causal depth-W conv) over channels o_c, tokens along columns (stacked._conv_silu_t)."""
        acc = gl.zeros([o_c.shape[0], o_t.shape[0]], gl.float32, LAYOUT)
        if HAS_BIAS:
            acc += gl.load(conv_b + o_c).to(gl.float32)[:, None]
        for j in gl.static_range(W):
            src = o_t + (j - (W - 1))
            b_x = gl.load(x + (bos + src)[None, :] * stride_x + o_c[:, None], mask=(m_t & (src >= 0))[None, :],
                          other=0.0)
            b_s = gl.load(conv_window + (src + (W - 1))[None, :] * D + o_c[:, None],
                          mask=(m_t & (src < 0))[None, :], other=0.0)
            acc += (b_x.to(gl.float32) + b_s.to(gl.float32)) * gl.load(conv_wT + j * D + o_c).to(gl.float32)[:, None]
        acc = acc * (1.0 / (1.0 + gl.exp(-acc)))
        return gl.where(m_t[None, :], acc, 0.0)

    @gluon.jit
    def _state_producer(state_indices, state_desc, z_desc, ring, ready, empty, z_smem, z_ready, z_empty, slot_rows,
                        num_work, H: gl.constexpr, HPG: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                        BV: gl.constexpr, STAGES: gl.constexpr, WAIT_PREP: gl.constexpr):
        """The TMA warp: for each work item (k-head, request) of this CTA, each consumer's state blocks into its ring
        (a slot reused once its consumer's first product has read it) and Z into one of two buffers (reused once both
        consumers' last products of the item before last have read it). It runs ahead into the next item while the
        consumers finish this one. A null slot's item reads slot 0 (vLLM's null block: real memory) so that both
        sides count ring phases alike; its results are never stored."""
        NVB: gl.constexpr = V // BV
        pid, num_programs = gl.program_id(0), gl.num_programs(0)
        for w in range(pid, num_work, num_programs):
            j = (w - pid) // num_programs  # this CTA's item count so far: the ring phases follow from it
            i_n, i_h = w // H, w % H
            slot = gl.maximum(gl.load(state_indices + i_n).to(gl.int32), 0)
            z_row = ((i_n * H + i_h) * 2 * BT).to(gl.int32)
            for it in gl.static_range(NVB):
                for c in gl.static_range(HPG):
                    g = j * NVB + it
                    stage = c * STAGES + g % STAGES
                    mbarrier.wait(empty.index(stage), (g // STAGES + 1) % 2, pred=g >= STAGES)
                    mbarrier.expect(ready.index(stage), state_desc.block_type.nbytes)
                    _tma_load(state_desc, [slot * slot_rows + (i_h * HPG + c) * V + it * BV, 0], ready.index(stage),
                              ring.index(stage))
                if it == 0:  # this item's first blocks are in flight: its Z (the first item's after the prep grid)
                    if WAIT_PREP:
                        if j == 0:
                            _grid_dependency_wait(z_row)
                    zs = j % 2
                    mbarrier.wait(z_empty.index(zs), (j // 2 + 1) % 2, pred=j >= 2)
                    mbarrier.expect(z_ready.index(zs), z_desc.block_type.nbytes)
                    _tma_load(z_desc, [z_row, 0], z_ready.index(zs), z_smem.index(zs))

    @gluon.jit
    def _state_consumer(x, conv_wT, conv_b, conv_state, state_indices, cu_seqlens, o, ws_u, ws_x, ws_rows, fac,
                        ring, ready, empty, z_smem, z_ready, z_empty, f_hi, f_lo, e_hi, e_lo, stride_x,
                        stride_conv_slot, WS_LEN, num_work, C: gl.constexpr, H: gl.constexpr, HV: gl.constexpr,
                        K: gl.constexpr, V: gl.constexpr, D: gl.constexpr, W: gl.constexpr, BT: gl.constexpr,
                        BV: gl.constexpr, HAS_BIAS: gl.constexpr, SMALL_X3: gl.constexpr,
                        HAS_WS_ROWS: gl.constexpr, STAGES: gl.constexpr, WAIT_PREP: gl.constexpr):
        """Consumer C: v-head C of each work item's k-head, its value blocks one after another: conv, first product
        from the ring, factors (its own f / e buffers: index C), stores (stacked._stacked_block). A null slot's item
        stores O zeros only."""
        NVB: gl.constexpr = V // BV
        HPG: gl.constexpr = HV // H
        NW: gl.constexpr = gl.num_warps()
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, 2 * BT, 8])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=1)
        # value columns (contiguous in memory) along threads: every load / store of v, u, O is coalesced along them
        COLS: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, NW], [0, 1])
        FAC: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        pid, num_programs = gl.program_id(0), gl.num_programs(0)
        o_t = gl.arange(0, BT, gl.SliceLayout(0, COLS))
        o_c = gl.arange(0, 2 * BT, gl.SliceLayout(0, COLS))
        t_c = gl.where(o_c < BT, o_c, o_c - BT)
        if WAIT_PREP:  # the factors and Z come from the prep grid
            _grid_dependency_wait(pid)
        for w in range(pid, num_work, num_programs):
            j = (w - pid) // num_programs
            i_n, i_h = w // H, w % H
            i_hv = i_h * HPG + C
            bos = gl.load(cu_seqlens + i_n).to(gl.int64)
            seqlen = gl.load(cu_seqlens + i_n + 1).to(gl.int64) - bos
            slot = gl.load(state_indices + i_n).to(gl.int64)
            live_len = gl.where(slot > 0, seqlen, 0)  # a null slot writes no u / raw v
            if HAS_WS_ROWS:
                ws_base = gl.load(ws_rows + i_n).to(gl.int64) * WS_LEN
            else:
                ws_base = i_n.to(gl.int64) * WS_LEN
            conv_window = conv_state + gl.maximum(slot, 0) * stride_conv_slot
            m_t = o_t < live_len
            m_u = (t_c < live_len) & (o_c < BT)
            m_o = (t_c < seqlen) & (o_c >= BT)
            p_o_col = ((bos + t_c) * HV + i_hv) * V
            p_u_col = ((ws_base + t_c) * HV + i_hv) * V
            ws_t = ws_base + o_t
            zs = j % 2
            for it in gl.static_range(NVB):
                g = j * NVB + it
                stage = C * STAGES + g % STAGES
                o_v = it * BV + gl.arange(0, BV, gl.SliceLayout(1, COLS))
                o_xv = 2 * H * K + i_hv * V + o_v
                b_xv = gl.load(x + (bos + o_t[None, :]) * stride_x + o_xv[:, None], mask=m_t[None, :], other=0.0)
                b_vc = _conv_silu_vt(x, stride_x, conv_window, conv_wT, conv_b, bos, o_t, m_t, o_xv, D, W, HAS_BIAS,
                                     COLS)
                gl.store(ws_x + ws_t[None, :] * D + o_xv[:, None], b_xv, mask=m_t[None, :])
                if it == 0:  # this v-head's factors, once per item (the previous item's products are complete)
                    p_f = fac + ((i_n * HV + i_hv) * 3 * BT) * 2 * BT
                    _store_factor_split(f_hi.index(C), f_lo.index(C), p_f, 2 * BT, 2 * BT, 2 * BT, FAC, SMALL_X3)
                    _store_factor_split(e_hi.index(C), e_lo.index(C), p_f + 2 * BT * 2 * BT, BT, 2 * BT, 2 * BT, FAC,
                                        SMALL_X3)
                    fence_async_shared()
                    mbarrier.wait(z_ready.index(zs), (j // 2) % 2)
                mbarrier.wait(ready.index(stage), (g // STAGES) % 2)
                zero = gl.zeros([BV, 2 * BT], gl.float32, ACC)
                if ring.dtype == gl.float32:
                    b_pt = warpgroup_mma(ring.index(stage), z_smem.index(zs).permute((1, 0)), zero, use_acc=False)
                else:  # 16-bit states: widened in registers (the A operand), Z stays fp32 in shared memory
                    b_s = ring.index(stage).load(A_OP).to(gl.float32)
                    b_pt = warpgroup_mma(b_s, z_smem.index(zs).permute((1, 0)), zero, use_acc=False)
                mbarrier.arrive(empty.index(stage), count=1)  # the slot is free: the producer's next copy overlaps
                if it == NVB - 1:
                    mbarrier.arrive(z_empty.index(zs), count=1)
                vc = gl.convert_layout(b_vc, A_OP)
                pt = gl.convert_layout(b_pt, A_OP)
                if SMALL_X3:
                    vc_hi, vc_lo = _tf32_split(vc)
                    pt_hi, pt_lo = _tf32_split(pt)
                    y = warpgroup_mma(vc_lo, e_hi.index(C).permute((1, 0)), zero, use_acc=False)
                    y = warpgroup_mma(vc_hi, e_lo.index(C).permute((1, 0)), y)
                    y = warpgroup_mma(pt_lo, f_hi.index(C).permute((1, 0)), y)
                    y = warpgroup_mma(pt_hi, f_lo.index(C).permute((1, 0)), y)
                    y = warpgroup_mma(vc_hi, e_hi.index(C).permute((1, 0)), y)
                    y = warpgroup_mma(pt_hi, f_hi.index(C).permute((1, 0)), y)
                else:
                    y = warpgroup_mma(vc, e_hi.index(C).permute((1, 0)), zero, use_acc=False)
                    y = warpgroup_mma(pt, f_hi.index(C).permute((1, 0)), y)
                y = gl.where(slot > 0, gl.convert_layout(y, COLS), 0.0)  # a null slot's factors are garbage
                gl.store(ws_u + p_u_col[None, :] + o_v[:, None], y, mask=m_u[None, :])
                gl.store(o + p_o_col[None, :] + o_v[:, None], y.to(o.dtype.element_ty), mask=m_o[None, :])

    @gluon.jit(do_not_specialize=["WS_LEN", "num_work"])
    def _gluon_state_kernel(
        x, conv_wT, conv_b, conv_state, state_indices, cu_seqlens, o, ws_u, ws_x, ws_rows, fac, state_desc, z_desc,
        stride_x, stride_conv_slot, slot_rows, WS_LEN, num_work,
        H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, D: gl.constexpr, W: gl.constexpr,
        BT: gl.constexpr, BV: gl.constexpr, HAS_BIAS: gl.constexpr, SMALL_X3: gl.constexpr,
        HAS_WS_ROWS: gl.constexpr, WAIT_PREP: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Persistent CTAs walking work items (k-head, request) = w, w + grid, ... (see the module docstring)."""
        HPG: gl.constexpr = HV // H
        NW: gl.constexpr = gl.num_warps()
        ring = gl.allocate_shared_memory(state_desc.dtype, [HPG * STAGES, BV, K], state_desc.layout)
        z_smem = gl.allocate_shared_memory(gl.float32, [2, 2 * BT, K], z_desc.layout)
        F_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, 2 * BT], gl.float32)
        E_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BT, BT], gl.float32)
        f_hi = gl.allocate_shared_memory(gl.float32, [HPG, 2 * BT, 2 * BT], F_SMEM)
        e_hi = gl.allocate_shared_memory(gl.float32, [HPG, 2 * BT, BT], E_SMEM)
        if SMALL_X3:
            f_lo = gl.allocate_shared_memory(gl.float32, [HPG, 2 * BT, 2 * BT], F_SMEM)
            e_lo = gl.allocate_shared_memory(gl.float32, [HPG, 2 * BT, BT], E_SMEM)
        else:
            f_lo = f_hi
            e_lo = e_hi
        ready = gl.allocate_shared_memory(gl.int64, [HPG * STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [HPG * STAGES, 1], mbarrier.MBarrierLayout())
        z_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        z_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(HPG * STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        for s in gl.static_range(2):
            mbarrier.init(z_ready.index(s), count=1)
            mbarrier.init(z_empty.index(s), count=HPG)  # every consumer's last product of the item has read Z
        fence_async_shared()
        # argument tuples written inline: a tuple assigned to a name turns its constexprs into tensors
        gl.warp_specialize([
            (_state_consumer, (x, conv_wT, conv_b, conv_state, state_indices, cu_seqlens, o, ws_u, ws_x, ws_rows,
                               fac, ring, ready, empty, z_smem, z_ready, z_empty, f_hi, f_lo, e_hi, e_lo, stride_x,
                               stride_conv_slot, WS_LEN, num_work, 0, H, HV, K, V, D, W, BT, BV, HAS_BIAS,
                               SMALL_X3, HAS_WS_ROWS, STAGES, WAIT_PREP)),
            (_state_consumer, (x, conv_wT, conv_b, conv_state, state_indices, cu_seqlens, o, ws_u, ws_x, ws_rows,
                               fac, ring, ready, empty, z_smem, z_ready, z_empty, f_hi, f_lo, e_hi, e_lo, stride_x,
                               stride_conv_slot, WS_LEN, num_work, 1, H, HV, K, V, D, W, BT, BV, HAS_BIAS,
                               SMALL_X3, HAS_WS_ROWS, STAGES, WAIT_PREP)),
            (_state_producer, (state_indices, state_desc, z_desc, ring, ready, empty, z_smem, z_ready, z_empty,
                               slot_rows, num_work, H, HPG, V, BT, BV, STAGES, WAIT_PREP)),
        ], [NW, 1], [CONSUMER_REGS, PRODUCER_REGS])
        for s in gl.static_range(HPG * STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))
        for s in gl.static_range(2):
            mbarrier.invalidate(z_ready.index(s))
            mbarrier.invalidate(z_empty.index(s))
