"""Gluon walk of SEVERAL batch rows (B = 2..32), greedy or sampled, Markov head, fully resident shards (V = 32k class: 256 rows
a program on 125 SMs): `head_walk_rows_kernel` (walk.py: `gluon="rows"`).

Same keys, tags and tie-break as kernel.py's batched walks (`_ordered_keys`, first of equal maxima; tagged slots
[2, P, KEY_STRIDE] of the Gluon walks' workspace, walk.py WORKSPACE_FAMILIES), so the tokens are the Triton walk's.
What changes is the exchange, which is most of the Triton walk's step from 8 rows on (b32: ~3.1 of 5.7 us a step,
probe; eval/notes/head_walk.md):

1. The inbox exchange (EXCHANGE 1, walk.py's ROWS_EXCHANGE default): program r < B reduces batch row r alone, waiting
   for the [P] tagged keys of column r (8 warps x P / 8 slots, warp shuffles, one CTA sync), and stores the winner,
   which keeps the step's tag, into row r of every program's inbox; every program then spins on its own B inbox
   slots (row b by the warp that gathers its W1 row into row b of the wgmma B operand). Polled slots a program and
   step: P + B for a reducer, B otherwise, against the P x B of every program reading every key (session 12's "all"
   exchange, measured 2.6x slower at b32 by its L2 requests and removed: code at 4d416ad).
2. The spins read one slot at a time (SPIN_STAGGER 0: every lane of a warp polls the same inbox slot, so two reads
   in flight double the requests on its line, +17 % at b32).
3. Both 128-row tiles of the shard stay in shared memory (TMA, once), and both products are in flight with one wait;
   the base logits of step k + 1 are loaded in the accumulator's layout right after step k's keys are published,
   behind the exchange.
4. Per step 2 CTA syncs of the kernel's own (B operand ready, the score's per-warp maxima), one more in a reducer.

Session 6's prototype of this walk (gluon_rows at eee43d2: one K-slot PTX poll per thread) proposed wrong tokens and
its waits gave up on the H200; this one is built from the one-row walk's exchange pieces, which are GPU-tested.

Compiles only for sm_90 (wgmma, TMA); walk.py falls back to the Triton walk (with a log line) where Gluon, the Triton
version or the case does not fit (why_not_gluon_rows). Not run under TRITON_INTERPRET.
"""
import triton.language as tl

from .gluon_b1 import HAVE_GLUON
from .kernel import ID_MASK, _load_noise_tile, _load_relaxed, _ordered_keys, _row_requests

# Batch rows a launch walks: wgmma N = the rows padded to a power of two >= 8 (the smallest N).
MAX_ROWS = 32
MIN_N = 8
# Shards of at most two tiles of 16 rows a warp (128 at NUM_WARPS = 8: the wgmma M of two warpgroups), all resident.
MAX_SHARD_ROWS = 256
NUM_WARPS = 8
# Programs padded to a power of two (PP): a reducer's warps poll PP / NUM_WARPS programs' keys each, and it pushes the
# winner to PP inbox slots (padding slots: its own).
MAX_PROGRAMS = 256


def rows_n(num_rows: int) -> int:
    """wgmma N (B operand rows) for num_rows batch rows."""
    return max(MIN_N, 1 << (num_rows - 1).bit_length())


if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    from .gluon_b1 import _cta_sync, _tma_load, _wait_slots

    @gluon.jit
    def _publish_rows(ptrs, keys, BN: gl.constexpr):
        """st.relaxed.gpu of the [BN] keys by threads 0 .. BN - 1 (the layout gives thread t element t % BN, so each
        slot has one writer; also the reducer's push of one key to [BN = PP] inboxes)."""
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
    def _reduce_and_push(keys_half, inbox_half, pid, tag, err_ptr, red_smem, NUM_PROGS: gl.constexpr,
                         KEY_STRIDE: gl.constexpr, PP: gl.constexpr, SPIN_LIMIT: gl.constexpr,
                         SPIN_STAGGER: gl.constexpr, SPIN_READS: gl.constexpr):
        """The inbox exchange's reducer of batch row r = pid: waits for the [P] tagged keys of column r (warp w polls
        programs [w * PP / NW, (w + 1) * PP / NW), padding slots this program's own key), takes their max (warp
        shuffles, one CTA sync) and stores it (it carries the step's tag) into row r of every program's inbox."""
        NW: gl.constexpr = gl.num_warps()
        POLL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        ALL: gl.constexpr = gl.BlockedLayout([NW], [32], [NW], [0])
        PUSH: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        o_w = gl.arange(0, NW, gl.SliceLayout(1, POLL))
        o_j = gl.arange(0, PP // NW, gl.SliceLayout(0, POLL))
        prog = o_w[:, None] * (PP // NW) + o_j[None, :]
        ptrs = keys_half + gl.where(prog < NUM_PROGS, prog, pid) * KEY_STRIDE + pid
        zero = gl.zeros([NW, PP // NW], gl.int32, POLL)
        slots = _wait_slots(ptrs, _load_relaxed(ptrs), zero + tag.to(gl.int32),
                            err_ptr.to(gl.int64) + zero.to(gl.int64), SPIN_LIMIT, SPIN_STAGGER, SPIN_READS)
        red_smem.store(gl.max(slots, axis=1))
        winner = gl.max(red_smem.load(ALL), axis=0)
        o_q = gl.arange(0, PP, PUSH)
        _publish_rows(inbox_half + gl.where(o_q < NUM_PROGS, o_q, pid) * KEY_STRIDE + pid,
                      gl.full([PP], 0, gl.int64, PUSH) + winner, PP)

    @gluon.jit
    def _inbox_winners(keys_half, inbox_half, pid, num_rows, tag, err_ptr, o_cb, SPIN_LIMIT: gl.constexpr,
                       SPIN_STAGGER: gl.constexpr, SPIN_READS: gl.constexpr):
        """[BN] winners of this step from this program's inbox (row b read by the warp that gathers its W1 row;
        padding rows b >= num_rows have no reducer: this program's own key of the row, already published)."""
        ptrs = gl.where(o_cb < num_rows, inbox_half + o_cb, keys_half + o_cb)
        zero = o_cb * 0
        return _wait_slots(ptrs, _load_relaxed(ptrs), zero + tag.to(gl.int32),
                           err_ptr.to(gl.int64) + zero.to(gl.int64), SPIN_LIMIT, SPIN_STAGGER, SPIN_READS)

    @gluon.jit
    def _load_u_tile(u_ptr, stride_ub, stride_uk, step, rows, shard_end, o_n, num_rows):
        """[ST, BN] base logits U[b, step, rows] in the accumulator's layout (0 outside the shard / live rows)."""
        ok = (rows < shard_end)[:, None] & (o_n < num_rows)[None, :]
        return gl.load(u_ptr + o_n[None, :] * stride_ub + step * stride_uk + rows[:, None], mask=ok, other=0.0)

    @gluon.jit
    def _score_tile(acc, u, rows, ids, shard_end, logit_scale, SCALED: gl.constexpr, noise=0, temp=0, hot=0,
                    dl_cols=0, valid=0, SAMPLED: gl.constexpr = False, STORE_LOGITS: gl.constexpr = False):
        """[ST, BN] keys of one tile, rounded as vLLM (kernel.py's _score_row): bias to U's dtype, (scale, round),
        + U, round; -inf past the shard; keyed by ids (the rows, or their target ids where d2t increases).
        STORE_LOGITS: the logits into each valid row's cache row (dl_cols [BN]: its request's row of this step) at
        their ids, from the accumulator's layout (a blocked layout of 32 rows of one column a warp store measured
        slower but at 8 d2t rows, ladder v69: code at a47b7dd). SAMPLED: a row of temperature temp != 0 (hot) scores
        logits / temp + noise, the operations of kernel.py's _score_tile."""
        out_ty = u.dtype
        bias = acc.to(out_ty).to(gl.float32)
        if SCALED:
            bias = (bias * logit_scale).to(out_ty).to(gl.float32)
        logits = (u.to(gl.float32) + bias).to(out_ty).to(gl.float32)
        if STORE_LOGITS:
            gl.store(dl_cols[None, :] + ids[:, None], logits.to(dl_cols.dtype.element_ty),
                     mask=(rows < shard_end)[:, None] & valid[None, :])
        scored = logits
        if SAMPLED:
            scored = gl.where(hot[None, :], logits / gl.where(hot, temp, 1.0)[None, :] + noise, logits)
        scored = gl.where((rows < shard_end)[:, None], scored, float("-inf"))
        return _ordered_keys(scored, ids[:, None])

    # A block of 1 step (and its token stride of 1) would be specialized to constants, which triton 3.6's LLVM
    # lowering of this kernel rejects: both stay runtime values.
    @gluon.jit(do_not_specialize=["num_steps", "stride_tb"])
    def head_walk_rows_kernel(
        u_ptr, stride_ub, stride_uk,
        w1_ptr, stride_w1,
        w2_desc,
        first_ptr, tok_ptr, stride_tb,
        keys_ptr, inbox_ptr, gen_ptr, err_ptr,
        num_rows, num_steps, vocab, logit_scale, d2t_ptr,
        req_ptr, temp_ptr, nt_ptr, stride_ntk, stride_ntb, dl_ptr, stride_dlr, stride_dlk,
        R: gl.constexpr, RES_T: gl.constexpr, CHUNK_ROWS: gl.constexpr, NUM_PROGS: gl.constexpr,
        KEY_STRIDE: gl.constexpr, BN: gl.constexpr, PP: gl.constexpr, SCALED: gl.constexpr,
        SPIN_LIMIT: gl.constexpr, EXCHANGE: gl.constexpr = 1,
        SPIN_STAGGER: gl.constexpr = 0, SPIN_READS: gl.constexpr = 2, HAS_D2T: gl.constexpr = False,
        SAMPLED: gl.constexpr = False, STORE_LOGITS: gl.constexpr = False, HAS_REQ: gl.constexpr = False,
    ):
        # Program p owns vocabulary rows [p * CHUNK_ROWS, p * CHUNK_ROWS + CHUNK_ROWS), RES_T tiles of ST rows in
        # shared memory for the whole walk (w2_desc: W2 rows [V, R] in [ST, R] boxes; rows past the shard arrive
        # too and are scored -inf). keys_ptr: the workspace's [2, NUM_PROGS, KEY_STRIDE] tagged keys (columns
        # 0 .. BN - 1), inbox_ptr: [2, NUM_PROGS, KEY_STRIDE] each program's rows' winners (EXCHANGE 1); gen_ptr:
        # per-program tag generation; err_ptr: set when a wait gives up. Batch rows b >= num_rows are padding:
        # published (every polled slot arrives) and walked on zero base logits, never stored.
        # EXCHANGE: 1 "inbox" (program r < num_rows reduces row r's [P] keys and stores the winner into every
        # program's inbox; each program then polls its BN inbox slots: P + BN polled slots a program instead of
        # P x BN);
        # 2 "local" (the bench's diagnostic: each program walks its own shard's best, no exchange; wrong tokens).
        # HAS_D2T: a reduced draft vocabulary whose d2t the caller promises increasing (walk.head_walk's
        # draft_to_target_increasing): rows keyed by target id (row + d2t[row], read once a walk), which orders them
        # as draft ids do, so every key carries the target id the token store and the next W1 gather need.
        # SAMPLED: each row draws with its request's temperature (req_ptr[b] with HAS_REQ, else b; -1 = padding,
        # greedy, stores nothing; temperature 0 = greedy) and the Gumbel noise of the table nt_ptr ([N, B, V],
        # noise_table_kernel's, made before the walk), loaded beside the base logits. STORE_LOGITS: each step's
        # logits into the draft-logits cache dl_ptr[req, k, target id].
        NW: gl.constexpr = gl.num_warps()
        ST: gl.constexpr = 16 * NW
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, BN, 16])
        ROW_OF_ACC: gl.constexpr = gl.SliceLayout(1, ACC)
        COL_OF_ACC: gl.constexpr = gl.SliceLayout(0, ACC)
        # [BN] winners' keys as the token stores read them (row b by warp b % NW).
        SPIN: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        # [BN, R] W1 rows: row b gathered by the warp that polled it.
        CAND: gl.constexpr = gl.BlockedLayout([1, R // 32], [1, 32], [NW, 1], [1, 0])
        # [NW, BN] per-warp score maxima read back by column: thread t holds column t % BN (_publish_rows).
        PARTS: gl.constexpr = gl.BlockedLayout([NW, 1], [1, 32], [1, NW], [0, 1])
        W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ST, R], w1_ptr.dtype.element_ty)
        B_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, R], w1_ptr.dtype.element_ty)
        PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        TILE_BYTES: gl.constexpr = ST * R * 2

        pid = gl.program_id(0)
        shard_begin = pid * CHUNK_ROWS
        shard_end = gl.minimum(shard_begin + CHUNK_ROWS, vocab)

        # The resident tiles by TMA first: the anchors' rows and step 0's base logits load while they travel.
        res_smem = gl.allocate_shared_memory(w1_ptr.dtype.element_ty, [RES_T, ST, R], W_SMEM)
        res_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(res_ready, count=1)
        fence_async_shared()
        _cta_sync()
        mbarrier.expect(res_ready, RES_T * TILE_BYTES)
        for t in gl.static_range(RES_T):
            _tma_load(w2_desc, [shard_begin + t * ST, 0], res_ready, res_smem.index(t))
        b_smem = gl.allocate_shared_memory(w1_ptr.dtype.element_ty, [BN, R], B_SMEM)
        parts_smem = gl.allocate_shared_memory(gl.int64, [NW, BN], PLAIN)
        red_smem = gl.allocate_shared_memory(gl.int64, [NW], gl.SwizzledSharedLayout(1, 1, 1, [0]))

        o_cr = gl.arange(0, R, gl.SliceLayout(0, CAND))
        o_cb = gl.arange(0, BN, gl.SliceLayout(1, CAND))
        live_c = o_cb < num_rows
        o_pub = gl.arange(0, BN, gl.SliceLayout(0, PARTS))

        # Step 0's candidates: the anchors' W1 rows (padding rows: row 0 of W1, walked and never stored).
        x0 = gl.load(first_ptr + o_cb, mask=live_c, other=0).to(gl.int64)
        cand = gl.load(w1_ptr + x0[:, None] * stride_w1 + o_cr[None, :])
        cand_key = gl.full([BN], 0, gl.int64, gl.SliceLayout(1, SPIN))
        o_t = gl.arange(0, ST, ROW_OF_ACC)
        o_n = gl.arange(0, BN, COL_OF_ACC)
        rows0 = shard_begin + o_t
        u0 = _load_u_tile(u_ptr, stride_ub, stride_uk, 0, rows0, shard_end, o_n, num_rows)
        if RES_T == 2:
            u1 = _load_u_tile(u_ptr, stride_ub, stride_uk, 0, rows0 + ST, shard_end, o_n, num_rows)
        else:
            u1 = u0  # unused
        if HAS_D2T:
            ids0 = rows0 + gl.load(d2t_ptr + rows0, mask=rows0 < shard_end, other=0).to(gl.int32)
            ids1 = rows0 + ST + gl.load(d2t_ptr + rows0 + ST, mask=rows0 + ST < shard_end, other=0).to(gl.int32)
        else:
            ids0 = rows0
            ids1 = rows0 + ST
        # The rows' draws: requests, temperatures and step 0's noise (placeholders where not used).
        live_n = o_n < num_rows
        valid, req_safe = _row_requests(req_ptr, o_n, live_n, HAS_REQ)
        temp = 0.0
        hot = live_n
        n0 = 0.0
        n1 = 0.0
        if SAMPLED:
            temp = gl.load(temp_ptr + req_safe, mask=valid, other=0.0).to(gl.float32)
            hot = live_n & (temp != 0.0)
            # (kernel.py's multi-row load, in the layout of rows0 / o_n: the accumulator's)
            n0 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, 0, rows0, shard_end, o_n, hot, False)
            if RES_T == 2:
                n1 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, 0, rows0 + ST, shard_end, o_n, hot, False)
        dl_req = 0
        if STORE_LOGITS:
            dl_req = dl_ptr + req_safe * stride_dlr
        zero_acc = gl.zeros([ST, BN], gl.float32, ACC)
        gen = gl.load(gen_ptr + pid)
        mbarrier.wait(res_ready, 0)
        for k in range(num_steps):
            # The rows' W1 rows into B (generic stores, fenced for the wgmma's async proxy before the sync).
            b_smem.store(cand)
            fence_async_shared()
            _cta_sync()
            if k > 0:
                if pid == 0:
                    o_sb = gl.arange(0, BN, gl.SliceLayout(1, SPIN))
                    gl.store(tok_ptr + o_sb * stride_tb + (k - 1), ID_MASK - (cand_key & ID_MASK),
                             mask=o_sb < num_rows)
            b_view = b_smem.permute((1, 0))
            dl_cols = 0
            if STORE_LOGITS:
                dl_cols = dl_req + k * stride_dlk
            acc0 = warpgroup_mma(res_smem.index(0), b_view, zero_acc, use_acc=False, is_async=True)
            if RES_T == 2:
                acc1 = warpgroup_mma(res_smem.index(1), b_view, zero_acc, use_acc=False, is_async=True)
                acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
                keys = gl.maximum(_score_tile(acc0, u0, rows0, ids0, shard_end, logit_scale, SCALED, n0, temp, hot,
                                              dl_cols, valid, SAMPLED, STORE_LOGITS),
                                  _score_tile(acc1, u1, rows0 + ST, ids1, shard_end, logit_scale, SCALED, n1, temp,
                                              hot, dl_cols, valid, SAMPLED, STORE_LOGITS))
            else:
                acc0 = warpgroup_mma_wait(0, deps=[acc0])
                keys = _score_tile(acc0, u0, rows0, ids0, shard_end, logit_scale, SCALED, n0, temp, hot, dl_cols,
                                   valid, SAMPLED, STORE_LOGITS)
            # Warp w holds tile rows [16 w, 16 w + 16): shuffles within each warp, then one sync before the
            # publishing threads reduce the NW maxima of their column.
            parts_smem.store(gl.max(gl.reshape(keys, [NW, ST // NW, BN]), axis=1))
            best = gl.max(parts_smem.load(PARTS), axis=0)
            tag = ((gen + k) % 16383) + 1
            half = keys_ptr + (k % 2) * NUM_PROGS * KEY_STRIDE
            _publish_rows(half + pid * KEY_STRIDE + o_pub, best | (tag << 18), BN)
            # The next step's base logits travel while the programs meet.
            k_next = gl.minimum(k + 1, num_steps - 1)
            u0 = _load_u_tile(u_ptr, stride_ub, stride_uk, k_next, rows0, shard_end, o_n, num_rows)
            if RES_T == 2:
                u1 = _load_u_tile(u_ptr, stride_ub, stride_uk, k_next, rows0 + ST, shard_end, o_n, num_rows)
            if SAMPLED:
                n0 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k_next, rows0, shard_end, o_n, hot, False)
                if RES_T == 2:
                    n1 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k_next, rows0 + ST, shard_end, o_n, hot,
                                          False)
            if EXCHANGE == 1:
                inbox_half = inbox_ptr + (k % 2) * NUM_PROGS * KEY_STRIDE
                if pid < num_rows:
                    _reduce_and_push(half, inbox_half, pid, tag, err_ptr, red_smem, NUM_PROGS, KEY_STRIDE, PP,
                                     SPIN_LIMIT, SPIN_STAGGER, SPIN_READS)
                if (k + 1 < num_steps) | (pid == 0):
                    # (the last step: only program 0, which stores the tokens, reads its inbox)
                    won = _inbox_winners(half + pid * KEY_STRIDE, inbox_half + pid * KEY_STRIDE, pid, num_rows, tag,
                                         err_ptr, o_cb, SPIN_LIMIT, SPIN_STAGGER, SPIN_READS)
                    cand_key = gl.convert_layout(won, gl.SliceLayout(1, SPIN))
                    if k + 1 < num_steps:
                        cand = gl.load(w1_ptr + (ID_MASK - (won & ID_MASK))[:, None] * stride_w1 + o_cr[None, :])
            else:
                own = gl.convert_layout(best, gl.SliceLayout(1, CAND))
                cand = gl.load(w1_ptr + (ID_MASK - (own & ID_MASK))[:, None] * stride_w1 + o_cr[None, :])
                cand_key = gl.convert_layout(own, gl.SliceLayout(1, SPIN))
        if pid == 0:
            o_sb = gl.arange(0, BN, gl.SliceLayout(1, SPIN))
            gl.store(tok_ptr + o_sb * stride_tb + (num_steps - 1), ID_MASK - (cand_key & ID_MASK),
                     mask=o_sb < num_rows)
        gl.store(gen_ptr + pid, gen + num_steps)
        mbarrier.invalidate(res_ready)
