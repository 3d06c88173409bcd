"""Gluon prototype of the persistent head walk for SEVERAL batch rows (B = 2..32), greedy, Markov head (walk.py:
`gluon=True` with B > 1).

Same keys and tie-break as kernel.py (`_ordered_keys`: fp32 value, then the lowest id; tagged slots [2, P, KEY_STRIDE]
of the workspace, tag = (gen + k) % 16383 + 1 in bits 18-31), so the tokens are those of the Triton walk. What
changes is the exchange, which at b32 is ~3.1 of the Triton walk's 5.8 us a step (eval/notes/head_walk.md, HX):

1. Each warp owns PP / NUM_WARPS programs' key columns, all BN rows: lane = batch row (b32: 32 lanes = 32 rows; b8:
   4 programs x 8 rows a warp instruction), each thread K = PP * BN / 256 slots of ONE row (16 at b32). Every thread
   polls its K slots in one inline-PTX loop (`_poll_slots`: all K first reads issued back to back, then rounds of
   predicated re-reads of the missing ones, each round one round trip for all of them): no CTA sync per poll
   round, no probe of column 0 first, no serial per-slot spin (the v4 "tagged" exchange's 218 us).
2. The K keys of a thread reduce in registers (b32: no shuffle at all; b8: 2 shuffle rounds), one [NUM_WARPS, BN]
   smem tile of per-warp bests, ONE CTA sync, then each warp takes the [NUM_WARPS] max of the BN / NUM_WARPS rows it
   gathers (the probe exchange: two CTA-wide [128, 32] int64 reductions and a layout change of the winners).
3. The warp that owns row b's winner gathers W1[x_b] (512 B) straight into row b of the wgmma B operand ([BN, r]
   in shared memory); a fence and one CTA sync later the next step's wgmma reads it.
4. Base logits of step k + 1 are loaded in the accumulator's layout right after step k's publish: their latency hides
   behind the exchange and no conversion sits on the chain.

Per step: 3 CTA syncs of the kernel's own (B operand ready, the score's cross-warp max, the warp bests) against the
Triton probe build's 26 (offline SASS, notes). Compiles only for sm_90 (wgmma); walk.py falls back to the Triton walk
(with a log line) where Gluon, the Triton version or the case does not fit (why_not_gluon_rows). Not run under
TRITON_INTERPRET.
"""
import triton
import triton.language as tl

from .gluon_b1 import CHECKED_TRITON, HAVE_GLUON  # noqa: F401  (walk.py reads both from here too)
from .kernel import ID_MASK, _ordered_keys

# Plain Python run at compile time on constexpr arguments (the PTX text of a K-slot poll); a plain function where the
# installed Triton has none (walk.py then never selects this kernel).
constexpr_function = getattr(triton.runtime.jit, "constexpr_function", lambda fn: fn)

NUM_WARPS = 8
# wgmma M of 8 warps (two warpgroups): the shard is walked in halves of 128 rows, like gluon_b1.
HALF_ROWS = 128
HALF = tl.constexpr(HALF_ROWS)
MAX_SHARD_ROWS = 256
# Batch rows: wgmma N = BN = max(8, next power of two of B); 32 keeps the poll at 16 slots a thread and lane = row.
MAX_ROWS = 32
MIN_N = 8
# The padded program count PP (power of two >= P) times BN, over 256 threads: at most this many slots a thread
# (one inline-PTX block of that many loads; 125 programs x 32 rows = 16, the bench's 132-program floors 32).
MAX_SLOTS_PER_THREAD = 32


@constexpr_function
def poll_ptx(slots: int, predicated: bool = True) -> str:
    """PTX of one thread's poll of `slots` tagged keys (operands, as inline_asm_elementwise packs them: outputs
    $0..$(n-1), slot addresses $n..$(2n-1), the tag (first copy used), the poll limit, the int32 error flag's
    address): every first read issued back to back, then while any key lacks the tag, one round of relaxed
    re-reads (all in flight together) of exactly the missing ones, or with predicated=False of all of them (an
    arrived key cannot change during the poll: its slot is rewritten two steps later, after this program has
    published the next step); after `limit` rounds the flag is set and the stale keys returned (the walk then
    reports the error, as kernel.py's spins do)."""
    n = slots
    tag, limit, err = f"${2 * n}", f"${3 * n}", f"${4 * n}"
    lines = ["{", f".reg .pred %pq, %pm<{n}>;", ".reg .b64 %pt;", ".reg .b32 %pg, %pn;", "mov.u32 %pn, 0;"]
    lines += [f"ld.relaxed.gpu.global.b64 ${i}, [${n + i}];" for i in range(n)]
    lines.append("PR_CHECK:")
    for i in range(n):
        lines += [f"shr.u64 %pt, ${i}, 18;", "cvt.u32.u64 %pg, %pt;", "and.b32 %pg, %pg, 16383;",
                  f"setp.ne.u32 %pm{i}, %pg, {tag};"]
    lines.append("mov.pred %pq, %pm0;")
    lines += [f"or.pred %pq, %pq, %pm{i};" for i in range(1, n)]
    lines += ["@!%pq bra PR_DONE;", f"setp.ge.u32 %pq, %pn, {limit};", "@%pq bra PR_FAIL;", "add.u32 %pn, %pn, 1;"]
    lines += [f"{f'@%pm{i} ' if predicated else ''}ld.relaxed.gpu.global.b64 ${i}, [${n + i}];" for i in range(n)]
    lines += ["bra PR_CHECK;", "PR_FAIL:", "mov.u32 %pg, 1;", f"st.relaxed.gpu.global.b32 [{err}], %pg;", "PR_DONE:",
              "}"]
    return "\n".join(lines)


@constexpr_function
def poll_constraints(slots: int) -> str:
    return ",".join(["=l"] * slots + ["l"] * slots + ["r"] * slots + ["r"] * slots + ["l"] * slots)


# triton 3.9's ptxas (CUDA 13.4) aborts (C7907, internal error) on the predicated re-reads inside the loop, whatever
# form the predicate takes (predicated load, branch around it, load into a temporary): it re-reads every slot.
PREDICATED_RELOADS = tl.constexpr(triton.__version__.startswith("3.6"))


def poll_geometry(programs: int, rows: int) -> tuple[int, int, int, int]:
    """(BN, PP, K, lanes along the rows) of the poll tile [NUM_WARPS, PP / NUM_WARPS, BN]: BN = wgmma N for `rows`
    batch rows, PP = programs padded to a power of two, K = slots a thread (one row, K programs)."""
    bn = max(MIN_N, 1 << (rows - 1).bit_length())
    pp = max(NUM_WARPS, 1 << (programs - 1).bit_length())
    lanes_b = min(bn, 32)
    per_warp = pp // NUM_WARPS
    k = per_warp * lanes_b // 32
    return bn, pp, k, lanes_b


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

    from .gluon_b1 import _cta_sync, _resident_shard, _wgmma_halves

    @gluon.jit
    def _poll_slots(ptrs, tags, limits, err_addr, K: gl.constexpr):
        """Each thread's K slots (consecutive registers of `ptrs`) until all carry `tags` (poll_ptx)."""
        return gl.inline_asm_elementwise(poll_ptx(K, PREDICATED_RELOADS), poll_constraints(K),
                                         [ptrs, tags, limits, err_addr], dtype=gl.int64, is_pure=False, pack=K)

    @gluon.jit
    def _publish_rows(ptrs, keys, BN: gl.constexpr):
        """st.relaxed.gpu of the [BN] keys by threads 0 .. BN - 1 (the layout holds element i in lane i % BN of
        every warp: one owner each, no duplicate stores on the line)."""
        gl.inline_asm_elementwise(
            """{
            .reg .pred %prp;
            .reg .u32 %prt;
            mov.u32 %prt, %tid.x;
            setp.lt.u32 %prp, %prt, $3;
            @%prp st.relaxed.gpu.global.b64 [$1], $2;
            mov.u32 $0, 0;
            }""", "=r,l,l,r", [ptrs, keys, gl.full(keys.shape, BN, gl.int32, keys.type.layout)], dtype=gl.int32,
            is_pure=False, pack=1)

    @gluon.jit
    def _score_half(acc, u, rows, shard_end, logit_scale, SCALED: gl.constexpr, ACC_LAYOUT: gl.constexpr):
        """[HALF, BN] keys of one half-shard, rounded as vLLM (kernel.py's _score_tile, greedy): bias to U's dtype,
        (scale, round), + U, round; -inf past the shard."""
        out_ty = u.dtype
        bias = acc.to(out_ty).to(gl.float32)
        if SCALED:
            bias = (bias * logit_scale).to(out_ty).to(gl.float32)
        logits = (u.to(gl.float32) + bias).to(out_ty).to(gl.float32)
        inside = rows < shard_end
        scored = gl.where(inside[:, None], logits, float("-inf"))
        return _ordered_keys(scored, rows[:, None] + gl.zeros(acc.shape, gl.int32, ACC_LAYOUT))

    @gluon.jit
    def _load_u_half(u_ptr, stride_ub, stride_uk, step, rows, shard_end, o_n, num_rows):
        """[HALF, BN] base logits U[b, step, rows] in the accumulator's layout (0 outside the shard / live rows)."""
        ok = (rows < shard_end)[:, None] & (o_n < num_rows)[None, :]
        return gl.load(u_ptr + o_n[None, :] * stride_ub + step * stride_uk + rows[:, None], mask=ok, other=0.0)

    @gluon.jit
    def head_walk_rows_kernel(
        u_ptr, stride_ub, stride_uk,
        w1_ptr, stride_w1,
        w2_ptr, stride_w2r, stride_w2v,
        first_ptr, tok_ptr, stride_tb,
        keys_ptr, gen_ptr, err_ptr,
        num_rows, num_steps, vocab, logit_scale,
        R: gl.constexpr, ROWS: gl.constexpr, CHUNK_ROWS: gl.constexpr, NUM_PROGS: gl.constexpr,
        KEY_STRIDE: gl.constexpr, BN: gl.constexpr, PP: gl.constexpr, K: gl.constexpr, LANES_B: gl.constexpr,
        SCALED: gl.constexpr, SPIN_LIMIT: gl.constexpr,
    ):
        # Program p owns vocabulary rows [p * CHUNK_ROWS, ...), all resident in shared memory (ROWS >= CHUNK_ROWS,
        # padded rows zero). keys_ptr: walk.py's [2, NUM_PROGS, KEY_STRIDE] tagged keys (columns 0 .. BN - 1);
        # gen_ptr: per-program tag generation; err_ptr: set when a poll gives up. Rows b >= num_rows are padding:
        # published (so every polled slot arrives), never gathered nor stored.
        NW: gl.constexpr = gl.num_warps()
        HALVES: gl.constexpr = ROWS // HALF
        TB: gl.constexpr = BN // NW  # batch rows whose W1 row a warp gathers
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BN, 16])
        ROW_OF_ACC: gl.constexpr = gl.SliceLayout(1, ACC)
        COL_OF_ACC: gl.constexpr = gl.SliceLayout(0, ACC)
        # [NW, PP / NW, BN] slots: warp w polls programs [w * PP / NW, (w + 1) * PP / NW); lane = batch row (K
        # programs a thread, consecutive registers: one inline-PTX block polls them all).
        POLL: gl.constexpr = gl.BlockedLayout([1, K, 1], [1, 32 // LANES_B, LANES_B], [NW, 1, 1], [2, 1, 0])
        # [BN, R] W1 rows: warp w gathers rows [w * TB, (w + 1) * TB).
        GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [TB, 32 // TB], [NW, 1], [1, 0])
        # [BN, NW] per-warp bests read back with the rows laid out as GATHER's (the max over NW stays in a thread).
        BESTS: gl.constexpr = gl.BlockedLayout([1, NW], [TB, 32 // TB], [NW, 1], [1, 0])
        # [NW, BN] per-warp score maxima read back by column: element b of the max sits in lane b % 32 of every
        # warp, so threads 0 .. BN - 1 own one key each (_publish_rows).
        PARTS: gl.constexpr = gl.BlockedLayout([NW, 1], [1, 32], [1, NW], [0, 1])
        PUB: gl.constexpr = gl.SliceLayout(0, PARTS)
        LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, R], w2_ptr.dtype.element_ty)
        B_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, R], w1_ptr.dtype.element_ty)
        PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        ROW_OF_GATHER: gl.constexpr = gl.SliceLayout(1, GATHER)

        pid = gl.program_id(0)
        shard_begin = pid * CHUNK_ROWS
        shard_end = gl.minimum(shard_begin + CHUNK_ROWS, vocab)

        w2_smem = _resident_shard(w2_ptr, stride_w2r, stride_w2v, shard_begin, shard_end, ROWS, R, W_SMEM, LOAD)
        b_smem = gl.allocate_shared_memory(w1_ptr.dtype.element_ty, [BN, R], B_SMEM)
        bests_smem = gl.allocate_shared_memory(gl.int64, [NW, BN], PLAIN)
        # Its own buffer: a warp whose poll slice lacks this program can finish the poll (and write bests_smem)
        # before this program's publishing threads have read the score maxima.
        parts_smem = gl.allocate_shared_memory(gl.int64, [NW, BN], PLAIN)

        # Poll addresses: padding programs and padding rows poll this program's own slot of that row (published
        # before every poll, so it arrives; its key is a real key of the row, or a padding row's, never used).
        o_w = gl.arange(0, NW, gl.SliceLayout(1, gl.SliceLayout(2, POLL)))
        o_j = gl.arange(0, PP // NW, gl.SliceLayout(0, gl.SliceLayout(2, POLL)))
        o_pb = gl.arange(0, BN, gl.SliceLayout(0, gl.SliceLayout(1, POLL)))
        prog = o_w[:, None, None] * (PP // NW) + o_j[None, :, None]
        live = (prog < NUM_PROGS) & (o_pb[None, None, :] < num_rows)
        slot_off = gl.where(live, prog, pid) * KEY_STRIDE + o_pb[None, None, :]
        zero_i = gl.zeros([NW, PP // NW, BN], gl.int32, POLL)
        err_addr = err_ptr.to(gl.int64) + zero_i.to(gl.int64)
        limits = zero_i + SPIN_LIMIT
        o_pub = gl.arange(0, BN, PUB)

        # Step 0's B operand: W1 rows of the anchors.
        o_gb = gl.arange(0, BN, ROW_OF_GATHER)
        o_gr = gl.arange(0, R, gl.SliceLayout(0, GATHER))
        m_gb = o_gb < num_rows
        x = gl.load(first_ptr + o_gb, mask=m_gb, other=0).to(gl.int64)
        b_smem.store(gl.load(w1_ptr + x[:, None] * stride_w1 + o_gr[None, :], mask=m_gb[:, None], other=0.0))

        gen = gl.load(gen_ptr + pid)
        o_half = gl.arange(0, HALF, ROW_OF_ACC)
        o_n = gl.arange(0, BN, COL_OF_ACC)
        rows0 = shard_begin + o_half
        u0 = _load_u_half(u_ptr, stride_ub, stride_uk, 0, rows0, shard_end, o_n, num_rows)
        if HALVES == 2:
            u1 = _load_u_half(u_ptr, stride_ub, stride_uk, 0, rows0 + HALF, shard_end, o_n, num_rows)
        zero_acc = gl.zeros([HALF, BN], gl.float32, ACC)
        for k in range(num_steps):
            # The B operand (generic stores by the gathering warps) visible to every warp's wgmma.
            fence_async_shared()
            _cta_sync()
            b_view = b_smem.permute((1, 0))
            acc0, acc1 = _wgmma_halves(w2_smem.slice(0, HALF, dim=0), w2_smem, b_view, zero_acc, HALVES)
            keys = _score_half(acc0, u0, rows0, shard_end, logit_scale, SCALED, ACC)
            if HALVES == 2:
                keys = gl.maximum(keys, _score_half(acc1, u1, rows0 + HALF, shard_end, logit_scale, SCALED, ACC))
            # Rows of the accumulator by warp (16 a warp): shuffles within each warp, then ONE sync before the
            # publishing threads reduce the NW maxima of their column (gl.max over the CTA takes 4 syncs with the
            # layout change of its result, triton 3.6 SASS).
            parts_smem.store(gl.max(gl.reshape(keys, [NW, HALF // NW, BN]), axis=1))
            best = gl.max(parts_smem.load(PARTS), axis=0)
            tag = ((gen + k) % 16383) + 1
            slot_base = keys_ptr + (k % 2) * NUM_PROGS * KEY_STRIDE
            _publish_rows(slot_base + pid * KEY_STRIDE + o_pub, best | (tag << 18), BN)
            # The next step's base logits travel while the programs meet.
            k_next = gl.minimum(k + 1, num_steps - 1)
            u0 = _load_u_half(u_ptr, stride_ub, stride_uk, k_next, rows0, shard_end, o_n, num_rows)
            if HALVES == 2:
                u1 = _load_u_half(u_ptr, stride_ub, stride_uk, k_next, rows0 + HALF, shard_end, o_n, num_rows)
            slots = _poll_slots(slot_base + slot_off, zero_i + tag.to(gl.int32), limits, err_addr, K)
            # Per (warp, row) best in registers (+ shuffles across the lanes of one row when BN < 32).
            bests_smem.store(gl.max(slots, axis=1))
            # The one CTA sync of the exchange (Triton's membar pass puts it between the store and the load).
            warp_bests = bests_smem.permute((1, 0)).load(BESTS)
            winners = gl.convert_layout(gl.max(warp_bests, axis=1), ROW_OF_GATHER, assert_trivial=True)
            x = ID_MASK - (winners & ID_MASK)
            if pid == 0:
                gl.store(tok_ptr + o_gb * stride_tb + k, x, mask=m_gb)
            b_smem.store(gl.load(w1_ptr + x[:, None] * stride_w1 + o_gr[None, :], mask=m_gb[:, None], other=0.0))
        gl.store(gen_ptr + pid, gen + num_steps)
