"""Gluon walk of ONE batch row, greedy, Markov head, for shards too large to keep on chip (V = 152k: 1,152 rows a
program on 132 SMs): `head_walk_b1_stream_kernel` (walk.py: `gluon="auto"`, the default, takes it where it was
measured faster; `gluon=True` / "rs" ask for it).

Same walk, keys and tie-break as kernel.py's batch-1 path (tagged exchange, `_ordered_keys`, first of equal maxima),
so the tokens are identical; what Gluon changes is who waits for what inside a program:

1. The W2 rows a program does not keep on chip stream through a TMA ring whose mbarrier phases run across the steps:
   W2 does not depend on the token, so the next step's first tiles are copied while the programs exchange keys (the
   Triton ring is set up and drained inside every step).
2. Per-warp candidates. Each warp polls its own programs' tagged keys, takes its best with shuffles (no CTA sync)
   and loads that candidate's W1 row into its column of the wgmma B operand in shared memory, guessed from the slots
   already there (GUESS_ROUNDS reads) while it still waits, so the W1 round trip leaves the step chain unless the
   last-arriving slot is the best. B holds 8 candidate columns (the smallest wgmma N); one CTA sync agrees on the
   winner, whose column is picked from the accumulator by a select + quad shuffle.
3. "rs": the first resident tile's W2 rows are held in registers as the wgmma A operand (no shared memory), which
   pays for another ring stage or resident tile. With 8 warps (two warpgroups) a tile is 128 rows: 128 rows in
   registers, and half the streamed iterations a step (gluon="auto"'s geometry, measured session 7).
4. STREAM_FIRST ("rs_sf", gluon="auto"'s form in session 8 until HW11): each step scores the ring's STAGES tiles
   that landed during the exchange before the resident tiles, so their slots' refills leave before the resident
   work instead of after it (ladder v23: 235.6 / 236.2 vs 247.7 / 251.9 us a 152k walk).
5. LEAN_ENDS ("rs_sf_lean" = rs_sf with it, gluon="auto"'s form since HW11: -2.1 % a 152k walk, median of 7 pairs):
   the shared-memory resident tile by TMA, and step 0's base logits and anchor W1 row issued before the register
   tile (step 0 waits behind no load -> store round trip); in the last step only program 0 waits, for the winner's
   key (no W1 gather), and the others leave after publishing.
   Measured no faster and removed (session 8): a producer warp refilling the ring (code at 89ba734), a once-a-step
   L2 bulk prefetch of the next step's W2 tiles beyond the ring (+0.3 .. 9 % for 1 .. 4 tiles, code at bff8a73), and
   of each program's best token's W1 row as it publishes its key (code at b4da3f0); eval/notes/head_walk.md.
   "rs2_sf_lean" (session 10, gluon="auto"'s form since ladder v35: -6 % a 152k walk, 7 of 7 pairs): the second
   resident tile in registers too (RS_ROWS = 2 * ST, 128 registers a thread of W2), one more resident tile in the same
   shared memory: 6 streamed tiles a step instead of 7.
6. Fully resident shards (V = 32k, HW12): the same kernel with no streamed tile (STREAM_TILES = 0, a 1-stage ring
   never filled) in form "ss_lean_pair": the lean start (both 128-row tiles by TMA, the copies issued before the
   anchor's loads) and PAIRED (both tiles' products in flight with one wait): under the Triton walk by 6 % (median of
   7 pairs, ladder v32), gluon="auto"'s form for 256-row resident shards since ladder v33 (session 9: 44.4 vs
   47.3 us on the same allocations). Measured slower and removed (ladders v31 / v32, code
   at ee2fd3a / 8a7cc6a): "ss_lean" (unpaired), "rs_lean", the "..._late" forms (no candidate guess). PAIRED
   beside streamed tiles (item 5's form, "rs_sf_lean_pair", HW13) measured 0.6 % slower (ladder v34): code at f8823db.

   "rs2_lean_pair" (session 10, gluon="auto"'s resident form since ladder v36: -4..-6 % a 32k walk, 7 of 7 pairs):
   both tiles in registers (RS_ROWS = 2 * ST), brought there by TMA through a shared-memory staging buffer (RS_TMA),
   so no step reads W2 from shared memory (the SS wgmma of 128 KiB was bound by shared-memory bandwidth).

7. SPIN_STAGGER > 0 (the "..._pp" forms, gluon="auto"'s at both sizes since ladder v39, session 10: 32k -1.2..-3.4 %
   in 7 of 7 pairs, 152k -2.5 %): the slot spin keeps SPIN_READS (2; 3 / 4 measured no faster, ladder v40) reads of a
   slot in flight, SPIN_STAGGER clock cycles apart, each re-issued as it returns without the tag, so a key that lands
   between two reads is seen up to half an L2 round trip sooner (the b1 step is the exchange's latency).

8. HAS_D2T (session 10, ladder v42: -19 % against the Triton walk a d2t used to take): a reduced draft vocabulary in
   the fully resident paired forms; rows keyed by target id (draft + d2t[draft], loaded once a walk), which orders
   them as draft ids do where d2t increases (the caller's promise, walk.head_walk's draft_to_target_increasing), so
   the winner's key carries the target id the token store and the next W1 gather need.

Session 6 also built a Gluon form of the fully resident walk (32k) and one of 2..32 rows; measured on the H200 in
session 7, neither was kept (no gain / wrong tokens): code at eee43d2, eval/notes/head_walk.md (item 6 walks resident
shards in this kernel instead).

Compiles only for sm_90 (wgmma, TMA); walk.py falls back to the Triton walk (with a log line) where Gluon, the Triton
version (3.6 / 3.9 checked) or the case does not fit. Not run under TRITON_INTERPRET.
"""
import triton.language as tl

# The Triton helpers called here create no tensor (no layout to give): Gluon compiles them as they are.
from .kernel import ID_MASK, WAIT_TAGGED_PTX, _load_relaxed, _ordered_keys

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    # Names that differ between the checked versions (3.6 / 3.9), resolved once here.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cta_sync = getattr(gl, "barrier", None) or gl.thread_barrier
    # shared_memory_descriptor._reinterpret (3.6) became reinterpret (3.9).
    _PUBLIC_REINTERPRET = tl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon: walk.py never selects this path
    HAVE_GLUON = False


def _pipelined_spin_ptx(reads: int) -> str:
    """The slot spin with `reads` reads of a slot in flight (SPIN_STAGGER > 0, the "..._pp" forms): the reads leave
    SPIN_STAGGER clock cycles apart, and each is re-issued as soon as it returns without the tag, so a key that lands
    between two reads is seen sooner than by one read at a time (by up to (reads - 1) / reads of an L2 round trip).
    Operands: $0 the slot's value, $1 its address, $2 the tag, $3 the spin limit, $4 the error flag, $5 the value
    read before, $6 the stagger (cycles). Each read keeps its own register (no copy makes one wait for another)."""
    regs = [f"%ppr{i}" for i in range(reads)]

    def tag_of(reg: str) -> str:  # %ppp: the slot value in reg carries the tag $2
        return (f"shr.u64 %ppt, {reg}, 18;\n cvt.u32.u64 %ppg, %ppt;\n and.b32 %ppg, %ppg, 16383;\n"
                f" setp.eq.u32 %ppp, %ppg, $2;\n")

    stagger = [f"mov.u32 %ppc, %clock;\n PP_STAGGER{i}:\n mov.u32 %ppd, %clock;\n sub.u32 %ppd, %ppd, %ppc;\n"
               f" setp.lt.u32 %ppp, %ppd, $6;\n @%ppp bra PP_STAGGER{i};\n ld.relaxed.gpu.global.b64 {reg}, [$1];\n"
               for i, reg in enumerate(regs[1:])]
    loop = "".join(tag_of(reg) + f" @%ppp bra PP_TAKE{i};\n ld.relaxed.gpu.global.b64 {reg}, [$1];\n"
                   for i, reg in enumerate(regs))
    takes = "".join(f"PP_TAKE{i}:\n mov.b64 $0, {reg};\n bra PP_DONE;\n" for i, reg in enumerate(regs))
    return ("{\n .reg .pred %ppp;\n .reg .b64 %ppt, " + ", ".join(regs) + ";\n .reg .b32 %ppg, %ppn, %ppc, %ppd;\n"
            " mov.b64 $0, $5;\n" + tag_of("$0") + " @%ppp bra PP_DONE;\n"
            f" ld.relaxed.gpu.global.b64 {regs[0]}, [$1];\n" + "".join(stagger) +
            " mov.u32 %ppn, 0;\n PP_LOOP:\n" + loop +
            " setp.ge.u32 %ppp, %ppn, $3;\n @%ppp bra PP_FAIL;\n add.u32 %ppn, %ppn, 1;\n bra PP_LOOP;\n" + takes +
            "PP_FAIL:\n mov.u32 %ppg, 1;\n st.relaxed.gpu.global.b32 [$4], %ppg;\n PP_DONE:\n }")


# The pipelined spins a kernel may take, by SPIN_READS - 2 (2, 3 or 4 reads in flight).
WAIT_PIPELINED_PTX = tl.constexpr(tuple(_pipelined_spin_ptx(reads) for reads in (2, 3, 4)))

# Triton versions this kernel was compiled and read on (offline, sm_90): Gluon's API differs between them.
CHECKED_TRITON = ("3.6", "3.9")
# ... and the ones it was measured faster on (H200, session 7): where gluon="auto" takes it.
MEASURED_TRITON = ("3.6",)
# Shards of more rows than this are partly streamed (the only shards the Gluon walk takes).
MAX_SHARD_ROWS = 256
# Partly streamed shards (head_walk_b1_stream_kernel): wgmma N = the candidate columns (8 is the smallest N). Tiles
# (streamed, resident and the "rs" register tile alike) are the wgmma's M: 64 rows for one warpgroup (4 warps), 128
# for two (8 warps, gluon="auto"'s: each warpgroup holds its own 64 rows of the register tile, 64 registers a thread
# either way, and a streamed iteration covers twice the rows).
STREAM_CANDS = 8
STREAM_TILE_ROWS = (64, 128)


def stream_warps(tile_rows: int) -> int:
    """Warps of the streamed kernel for tiles of tile_rows (one warp per 16 rows of the wgmma's M)."""
    return tile_rows // 16


def stream_descriptor(w2_rows, stream_rows: int):
    """Host TMA descriptor of W2 rows [V, r] (2-byte) in [stream_rows, r] boxes, in the NVMMA layout the streamed
    kernel's ring uses (the same get_default_for call)."""
    elt = gl.bfloat16 if str(w2_rows.dtype) == "torch.bfloat16" else gl.float16
    block = [stream_rows, w2_rows.shape[1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, elt)
    return GluonTensorDescriptor(w2_rows, list(w2_rows.shape), list(w2_rows.stride()), block, layout)


if HAVE_GLUON:

    @gluon.jit
    def _wait_slots(ptrs, first, tag, err_addr, SPIN_LIMIT: gl.constexpr, SPIN_STAGGER: gl.constexpr = 0,
                    SPIN_READS: gl.constexpr = 2):
        """Per-thread spin inside PTX until each slot read once already (`first`) carries `tag` (kernel.py's
        _wait_tagged); SPIN_STAGGER > 0: SPIN_READS reads in flight, SPIN_STAGGER cycles apart
        (_pipelined_spin_ptx)."""
        if SPIN_STAGGER > 0:
            operands = [ptrs, tag, gl.full(ptrs.shape, SPIN_LIMIT, gl.int32, ptrs.type.layout), err_addr, first,
                        gl.full(ptrs.shape, SPIN_STAGGER, gl.int32, ptrs.type.layout)]
            return gl.inline_asm_elementwise(WAIT_PIPELINED_PTX[SPIN_READS - 2], "=l,l,r,r,l,l,r", operands,
                                             dtype=gl.int64, is_pure=False, pack=1)
        return gl.inline_asm_elementwise(WAIT_TAGGED_PTX, "=l,l,r,r,l,l",
                                         [ptrs, tag, gl.full(ptrs.shape, SPIN_LIMIT, gl.int32, ptrs.type.layout),
                                          err_addr, first], dtype=gl.int64, is_pure=False, pack=1)

    @gluon.jit
    def _reload_missing(ptrs, seen, tag):
        """One more relaxed read of the slots whose key in `seen` lacks `tag` (others keep theirs, no traffic): a warp
        whose slots have all arrived issues nothing and does not wait."""
        return gl.inline_asm_elementwise(
            """{
            .reg .pred %rmp;
            .reg .b64 %rmt;
            .reg .b32 %rmg;
            mov.b64 $0, $2;
            shr.u64 %rmt, $2, 18;
            cvt.u32.u64 %rmg, %rmt;
            and.b32 %rmg, %rmg, 16383;
            setp.ne.u32 %rmp, %rmg, $3;
            @%rmp ld.relaxed.gpu.global.b64 $0, [$1];
            }""", "=l,l,l,r", [ptrs, seen, tag], dtype=gl.int64, is_pure=False, pack=1)

    @gluon.jit
    def _publish_key(ptr, key):
        """st.relaxed.gpu of this program's key by thread 0 (the key proves itself by its tag)."""
        gl.inline_asm_elementwise(
            """{
            .reg .pred %pkp;
            .reg .u32 %pkt;
            mov.u32 %pkt, %tid.x;
            setp.eq.u32 %pkp, %pkt, 0;
            @%pkp st.relaxed.gpu.global.b64 [$1], $2;
            mov.u32 $0, 0;
            }""", "=r,l,l", [ptr, key], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _poll_setup(pid, err_ptr, first_ptr, w1_ptr, stride_w1, o_cr, C: gl.constexpr, SLOTS: gl.constexpr,
                    NUM_PROGS: gl.constexpr, SPIN: gl.constexpr, CAND: gl.constexpr):
        """The [C, SLOTS] programs whose keys candidate row c polls (c * SLOTS + s; padding slots poll this program's
        own key, published just before every poll), the spin's error address in that layout, and step 0's
        candidates: every row holds the anchor's W1 row with key 0 (its key is irrelevant: column 0 wins the tie)."""
        o_c = gl.arange(0, C, gl.SliceLayout(1, SPIN))
        o_s = gl.arange(0, SLOTS, gl.SliceLayout(0, SPIN))
        o_p = o_c[:, None] * SLOTS + o_s[None, :]
        prog = gl.where(o_p < NUM_PROGS, o_p, pid)
        err_addr = err_ptr.to(gl.int64) + 0 * o_p.to(gl.int64)
        x_first = gl.load(first_ptr).to(gl.int64)
        cand = gl.load(w1_ptr + x_first * stride_w1 + gl.full([C, 1], 0, gl.int64, CAND) + o_cr[None, :])
        cand_key = gl.full([C], 0, gl.int64, gl.SliceLayout(1, SPIN))
        return prog, err_addr, cand, cand_key

    @gluon.jit
    def _next_candidates(slot_ptrs, tags, err_addr, w1_ptr, stride_w1, o_cr, CAND: gl.constexpr,
                         SPIN_LIMIT: gl.constexpr, GUESS_ROUNDS: gl.constexpr, SPIN_STAGGER: gl.constexpr = 0,
                         SPIN_READS: gl.constexpr = 2):
        """(candidate keys [C], their W1 rows [C, R] in CAND) from the [C, slots] tagged slots, row c polled by one
        warp: the best of row c once all its slots carry `tags`, by shuffles only (no CTA-wide sync).

        The row of the warp's best among the slots already there travels while the warp waits for the rest:
        GUESS_ROUNDS (>= 1) reads of the missing slots, each re-guessing (a new row load only where the guess
        changed), then the spin; the row is fetched after the spin only if a later slot won. (One early guess, or
        none, measured slower at 152k: 311.7 / 301.0 vs 296.6 us a walk, session 7; none at 32k too: HW12's
        "..._late" forms 48.3-48.7 vs 45.1-46.8 us with 3 rounds, code at ee2fd3a.)"""
        num_cands: gl.constexpr = tags.shape[0]
        seen = _load_relaxed(slot_ptrs)
        guess_key = gl.full([num_cands], -9223372036854775807 - 1, gl.int64, gl.SliceLayout(1, CAND))
        guess = gl.zeros([num_cands, o_cr.shape[0]], w1_ptr.dtype.element_ty, CAND)
        for r in gl.static_range(GUESS_ROUNDS):
            if r > 0:
                seen = _reload_missing(slot_ptrs, seen, tags)
            arrived = ((seen >> 18) & 0x3FFF) == tags
            seen_best = gl.convert_layout(gl.max(gl.where(arrived, seen, -9223372036854775807 - 1), axis=1),
                                          gl.SliceLayout(1, CAND))
            guess = gl.load(w1_ptr + (ID_MASK - (seen_best & ID_MASK))[:, None] * stride_w1 + o_cr[None, :],
                            mask=(seen_best != guess_key)[:, None], other=guess)
            guess_key = seen_best
        slots = _wait_slots(slot_ptrs, seen, tags, err_addr, SPIN_LIMIT, SPIN_STAGGER, SPIN_READS)
        cand_key = gl.max(slots, axis=1)
        cand_key_c = gl.convert_layout(cand_key, gl.SliceLayout(1, CAND))
        cand_ptrs = w1_ptr + (ID_MASK - (cand_key_c & ID_MASK))[:, None] * stride_w1 + o_cr[None, :]
        # `other=guess`: a warp whose last guess held loads nothing here.
        cand = gl.load(cand_ptrs, mask=(cand_key_c != guess_key)[:, None], other=guess)
        return cand_key, cand

    @gluon.jit
    def _agree(key_smem, cand_key, KEYS_LAYOUT: gl.constexpr, NW: gl.constexpr):
        """The CTA's winner among the warps' candidates: (winning key, its column = the warp that holds its row).
        The one CTA sync of the exchange sits between the store and the load (inserted by Triton's membar pass)."""
        key_smem.store(cand_key)
        keys = key_smem.load(KEYS_LAYOUT)
        winner = gl.max(keys, axis=0)
        cols = gl.arange(0, NW, KEYS_LAYOUT)
        col = gl.min(gl.where(keys == winner, cols, NW), axis=0)
        return winner, col

    @gluon.jit
    def _step_start(b_smem, cand, key_smem, cand_key, k, pid, tok_ptr, KEYS_LAYOUT: gl.constexpr, C: gl.constexpr):
        """The candidates' W1 rows into the wgmma B operand (generic stores, fenced for the async proxy before the
        agreeing sync), the winner agreed, the previous step's token stored by program 0; returns the winner's
        column."""
        b_smem.store(cand)
        fence_async_shared()
        winner, col = _agree(key_smem, cand_key, KEYS_LAYOUT, C)
        if k > 0:
            if pid == 0:
                gl.store(tok_ptr + k - 1, ID_MASK - (winner & ID_MASK))
        return col

    @gluon.jit
    def _cta_max(keys, best_smem, KEYS_LAYOUT: gl.constexpr, NW: gl.constexpr):
        """max(keys) of the whole CTA with one sync: each warp reduces its own rows with shuffles (warp w holds rows
        [w * M / NW, (w + 1) * M / NW) of the [M] keys in the accumulator's row layout), the NW warp maxima meet in
        shared memory, and every thread reduces those NW itself (gl.max over the CTA costs two syncs: it broadcasts
        its result)."""
        per_warp = gl.max(gl.reshape(keys, [NW, keys.shape[0] // NW]), axis=1)
        best_smem.store(per_warp)
        return gl.max(best_smem.load(KEYS_LAYOUT), axis=0)

    @gluon.jit
    def _score_tile(acc, col, u_smem, tile, row0, shard_end, logit_scale, SCALED: gl.constexpr,
                    CANDS: gl.constexpr, ACC_LAYOUT: gl.constexpr, HAS_D2T: gl.constexpr = False, id_offsets=0,
                    dl_step=0, valid=True, temp=0.0, n_smem=0, SAMPLED: gl.constexpr = False,
                    STORE_LOGITS: gl.constexpr = False):
        """Keys of one [ST] tile of the shard from the accumulator's winning column, rounded as vLLM (kernel.py's
        _score_row): bias to U's dtype, (scale, round), + U, round; its base logits are row `tile` of this step's
        u_smem. HAS_D2T: keyed by target id (row + id_offsets, the tile's d2t), which orders as the draft id does
        where d2t maps draft ids to increasing target ids (the caller's promise). STORE_LOGITS: the logits stored at
        their target ids of the step's draft-logits cache row dl_step (where the row is `valid`, not padding).
        SAMPLED: a row of temperature temp != 0 scores logits / temp + noise (row `tile` of the step's Gumbel noise,
        n_smem), the same operations as kernel.py's _score_row."""
        st: gl.constexpr = acc.shape[0]
        rows = row0 + gl.arange(0, st, gl.SliceLayout(1, ACC_LAYOUT))
        u = u_smem.index(tile).load(gl.SliceLayout(1, ACC_LAYOUT))
        cols = gl.arange(0, CANDS, gl.SliceLayout(0, ACC_LAYOUT))
        acc = gl.sum(gl.where(cols[None, :] == col, acc, 0.0), axis=1)
        out_ty = u.dtype
        bias = acc.to(out_ty).to(gl.float32)
        if SCALED:
            bias = (bias * logit_scale).to(out_ty).to(gl.float32)
        logits = (u.to(gl.float32) + bias).to(out_ty).to(gl.float32)
        ids = rows
        if HAS_D2T:
            ids = rows + id_offsets
        if STORE_LOGITS:
            gl.store(dl_step + ids, logits.to(dl_step.dtype.element_ty), mask=(rows < shard_end) & valid)
        scored = logits
        if SAMPLED:
            noise = n_smem.index(tile).load(gl.SliceLayout(1, ACC_LAYOUT))
            hot = temp != 0.0
            scored = gl.where(hot, logits / gl.where(hot, temp, 1.0) + noise, logits)
        scored = gl.where(rows < shard_end, scored, float("-inf"))
        return _ordered_keys(scored, ids)

    @gluon.jit
    def _load_u_tiles(u_ptr, step, stride_uk, shard_begin, shard_end, TILES_P2: gl.constexpr, ST: gl.constexpr,
                      LAYOUT: gl.constexpr):
        """[TILES_P2, ST] base logits of one step's shard (tile t = rows [t * ST, (t + 1) * ST)), 0 past it."""
        o_t = gl.arange(0, TILES_P2, gl.SliceLayout(1, LAYOUT))
        o_r = gl.arange(0, ST, gl.SliceLayout(0, LAYOUT))
        rows = shard_begin + o_t[:, None] * ST + o_r[None, :]
        return gl.load(u_ptr + step * stride_uk + rows, mask=rows < shard_end, other=0.0)

    @gluon.jit
    def _resident_tiles(run, col, b_view, zero_acc, a_regs, a_regs2, res_smem, res_ready, u_smem, shard_begin,
                        shard_end, logit_scale, RES_T: gl.constexpr, RS_ROWS: gl.constexpr, SCALED: gl.constexpr,
                        LEAN_ENDS: gl.constexpr, PAIRED: gl.constexpr = False, HAS_D2T: gl.constexpr = False,
                        id_off0=0, id_off1=0, dl_step=0, valid=True, temp=0.0, n_smem=0,
                        SAMPLED: gl.constexpr = False, STORE_LOGITS: gl.constexpr = False):
        """run folded with the keys of the shard's RES_T resident tiles (the first in registers where RS_ROWS; with
        LEAN_ENDS the shared-memory ones arrive by TMA on res_ready, whose one phase is waited every step: a try-wait
        of a completed phase returns at once). PAIRED (RES_T == 2): both tiles' products in flight, one wait, then
        both scored (else each tile's product is waited for and scored before the next is issued). dl_step .. STORE_LOGITS:
        _score_tile's draw (a draft-logits cache, a sampled row)."""
        ACC: gl.constexpr = zero_acc.type.layout
        ST: gl.constexpr = zero_acc.shape[0]
        CANDS: gl.constexpr = zero_acc.shape[1]
        gl.static_assert(PAIRED or not HAS_D2T, "d2t: the PAIRED fully resident forms only")
        if PAIRED:
            gl.static_assert(RES_T == 2, "PAIRED walks two resident tiles")
            if LEAN_ENDS:
                mbarrier.wait(res_ready, 0)
            if RS_ROWS > 0:
                acc0 = warpgroup_mma(a_regs, b_view, zero_acc, use_acc=False, is_async=True)
            else:
                acc0 = warpgroup_mma(res_smem.index(0), b_view, zero_acc, use_acc=False, is_async=True)
            if RS_ROWS > ST:
                acc1 = warpgroup_mma(a_regs2, b_view, zero_acc, use_acc=False, is_async=True)
            else:
                acc1 = warpgroup_mma(res_smem.index(1 - RS_ROWS // ST), b_view, zero_acc, use_acc=False,
                                     is_async=True)
            acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
            keys0 = _score_tile(acc0, col, u_smem, 0, shard_begin, shard_end, logit_scale, SCALED, CANDS, ACC,
                                HAS_D2T, id_off0, dl_step, valid, temp, n_smem, SAMPLED, STORE_LOGITS)
            keys1 = _score_tile(acc1, col, u_smem, 1, shard_begin + ST, shard_end, logit_scale, SCALED, CANDS, ACC,
                                HAS_D2T, id_off1, dl_step, valid, temp, n_smem, SAMPLED, STORE_LOGITS)
            return gl.maximum(run, gl.maximum(keys0, keys1))
        for t in gl.static_range(RES_T):
            if t == 0 and RS_ROWS > 0:
                acc = warpgroup_mma(a_regs, b_view, zero_acc, use_acc=False, is_async=True)
            elif t == 1 and RS_ROWS > ST:
                acc = warpgroup_mma(a_regs2, b_view, zero_acc, use_acc=False, is_async=True)
            else:
                if LEAN_ENDS and t == RS_ROWS // ST:
                    mbarrier.wait(res_ready, 0)
                acc = warpgroup_mma(res_smem.index(t - RS_ROWS // ST), b_view, zero_acc, use_acc=False,
                                    is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            run = gl.maximum(run, _score_tile(acc, col, u_smem, t, shard_begin + t * ST, shard_end,
                                              logit_scale, SCALED, CANDS, ACC, False, 0, dl_step, valid, temp,
                                              n_smem, SAMPLED, STORE_LOGITS))
        return run

    @gluon.jit
    def _streamed_tile(run, g, j, col, b_view, zero_acc, ring, ready, u_smem, w2_desc, stream_begin, shard_end,
                       logit_scale, total, STREAM_TILES: gl.constexpr, RES_T: gl.constexpr, SCALED: gl.constexpr,
                       dl_step=0, valid=True, temp=0.0, n_smem=0, SAMPLED: gl.constexpr = False,
                       STORE_LOGITS: gl.constexpr = False):
        """run folded with the keys of streamed tile j, global streamed iteration g (slot g % STAGES); its slot
        refilled by this CTA's thread 0 with iteration g + STAGES's tile. dl_step .. STORE_LOGITS: _score_tile's."""
        ACC: gl.constexpr = zero_acc.type.layout
        ST: gl.constexpr = zero_acc.shape[0]
        CANDS: gl.constexpr = zero_acc.shape[1]
        STAGES: gl.constexpr = ring.shape[0]
        TILE_BYTES: gl.constexpr = ST * ring.shape[2] * 2
        slot = g % STAGES
        mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
        acc = warpgroup_mma(ring.index(slot), b_view, zero_acc, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        # Every warp's wgmma has read the slot before one thread refills it (the next step's tiles too).
        _cta_sync()
        g_next = g + STAGES
        mbarrier.expect(ready.index(slot), TILE_BYTES, pred=g_next < total)
        _tma_load(w2_desc, [stream_begin + (g_next % STREAM_TILES) * ST, 0], ready.index(slot), ring.index(slot),
                  pred=g_next < total)
        return gl.maximum(run, _score_tile(acc, col, u_smem, RES_T + j, stream_begin + j * ST, shard_end,
                                           logit_scale, SCALED, CANDS, ACC, False, 0, dl_step, valid, temp, n_smem,
                                           SAMPLED, STORE_LOGITS))

    @gluon.jit
    def _step_publish(k, a0, a1, cand, cand_key, zero_acc, u_ptr, stride_uk, w2_desc, tok_ptr, keys_ptr, num_steps,
                      logit_scale, ring, ready, res_smem, res_ready, b_smem, key_smem, best_smem, u_smem, gen, pid,
                      shard_begin, shard_end, stream_begin, STREAM_TILES: gl.constexpr, RES_T: gl.constexpr,
                      RS_ROWS: gl.constexpr, SCALED: gl.constexpr, NUM_PROGS: gl.constexpr, KEY_STRIDE: gl.constexpr,
                      TILES_P2: gl.constexpr, STREAM_FIRST: gl.constexpr, LEAN_ENDS: gl.constexpr,
                      PAIRED: gl.constexpr, HAS_D2T: gl.constexpr = False, id_off0=0, id_off1=0, dl_row=0,
                      stride_dlk=0, valid=True, temp=0.0, nt_ptr=0, stride_ntk=0, n_smem=0,
                      SAMPLED: gl.constexpr = False, STORE_LOGITS: gl.constexpr = False):
        """Step k up to its key's publication: the candidates' rows into B, the shard's keys (resident tiles' A
        operands a0 / a1: registers, or shared memory), the CTA's best published; returns (tag, key slot, the next
        step's base logits and, SAMPLED, Gumbel noise (nt_ptr: the noise table's row), loaded while the programs
        meet). STORE_LOGITS: the step's logits into row dl_row + k * stride_dlk of the draft-logits cache."""
        NW: gl.constexpr = gl.num_warps()
        CANDS: gl.constexpr = 8
        STAGES: gl.constexpr = ring.shape[0]
        ST: gl.constexpr = ring.shape[1]
        ACC: gl.constexpr = zero_acc.type.layout
        U_TILES: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        CAND_KEYS: gl.constexpr = gl.BlockedLayout([CANDS], [32], [NW], [0])
        WARP_KEYS: gl.constexpr = gl.BlockedLayout([NW], [32], [NW], [0])
        total = num_steps * STREAM_TILES
        # Streamed tiles scored before the resident ones each step (STREAM_FIRST: those the ring holds).
        lead: gl.constexpr = (STAGES if STAGES < STREAM_TILES else STREAM_TILES) if STREAM_FIRST else 0
        # W1[x] once a step: each candidate's row into its B column (the streamed wgmmas reuse it).
        col = _step_start(b_smem, cand, key_smem, cand_key, k, pid, tok_ptr, CAND_KEYS, CANDS)
        b_view = b_smem.permute((1, 0))
        dl_step = 0
        if STORE_LOGITS:
            dl_step = dl_row + k * stride_dlk
        run = gl.full([ST], -9223372036854775807 - 1, gl.int64, gl.SliceLayout(1, ACC))
        # STREAM_FIRST: the ring's tiles that landed during the exchange first, so their slots' refills are issued
        # before the resident tiles' work, which then runs while those refills travel.
        for j in range(lead):  # (lead is 0 without streamed tiles)
            run = _streamed_tile(run, k * STREAM_TILES + j, j, col, b_view, zero_acc, ring, ready, u_smem,
                                 w2_desc, stream_begin, shard_end, logit_scale, total, STREAM_TILES, RES_T, SCALED,
                                 dl_step, valid, temp, n_smem, SAMPLED, STORE_LOGITS)
        run = _resident_tiles(run, col, b_view, zero_acc, a0, a1, res_smem, res_ready, u_smem, shard_begin,
                              shard_end, logit_scale, RES_T, RS_ROWS, SCALED, LEAN_ENDS, PAIRED, HAS_D2T, id_off0,
                              id_off1, dl_step, valid, temp, n_smem, SAMPLED, STORE_LOGITS)
        if STREAM_TILES > 0:
            for j in range(lead, STREAM_TILES):
                run = _streamed_tile(run, k * STREAM_TILES + j, j, col, b_view, zero_acc, ring, ready, u_smem,
                                     w2_desc, stream_begin, shard_end, logit_scale, total, STREAM_TILES, RES_T,
                                     SCALED, dl_step, valid, temp, n_smem, SAMPLED, STORE_LOGITS)
        best = _cta_max(run, best_smem, WARP_KEYS, NW)
        tag = ((gen + k) % 16383) + 1
        kslot = k % 2
        _publish_key(keys_ptr + (kslot * NUM_PROGS + pid) * KEY_STRIDE, best | (tag << 18))
        # The next step's base logits travel while the programs meet (stored after the wait: every warp has read this
        # step's from u_smem before _cta_max's sync).
        u_next = _load_u_tiles(u_ptr, gl.minimum(k + 1, num_steps - 1), stride_uk, shard_begin, shard_end,
                               TILES_P2, ST, U_TILES)
        n_next = 0
        if SAMPLED:
            n_next = _load_u_tiles(nt_ptr, gl.minimum(k + 1, num_steps - 1), stride_ntk, shard_begin, shard_end,
                                   TILES_P2, ST, U_TILES)
        return tag, kslot, u_next, n_next

    @gluon.jit
    def _step_exchange(k, tag, kslot, u_next, cand, cand_key, w1_ptr, stride_w1, keys_ptr, num_steps, u_tiles, o_cr,
                       prog, err_addr, pid, NUM_PROGS: gl.constexpr, KEY_STRIDE: gl.constexpr,
                       SLOTS_PER_CAND: gl.constexpr, SPIN_LIMIT: gl.constexpr, GUESS_ROUNDS: gl.constexpr,
                       LEAN_ENDS: gl.constexpr, SPIN_STAGGER: gl.constexpr, SPIN_READS: gl.constexpr, n_next=0,
                       n_tiles=0, SAMPLED: gl.constexpr = False):
        """Step k's exchange: the next step's candidates (keys, W1 rows) once every program's key is in, and its base
        logits (SAMPLED: and noise) stored; returns (candidate keys, candidate rows)."""
        NW: gl.constexpr = gl.num_warps()
        CANDS: gl.constexpr = 8
        R: gl.constexpr = o_cr.shape[0]
        SPIN: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        CAND: gl.constexpr = gl.BlockedLayout([1, R // 32], [1, 32], [NW, 1], [1, 0])
        slot_ptrs = keys_ptr + (kslot * NUM_PROGS + prog) * KEY_STRIDE
        tags = gl.full([CANDS, SLOTS_PER_CAND], 0, gl.int32, SPIN) + tag.to(gl.int32)
        if LEAN_ENDS:
            if k + 1 < num_steps:
                cand_key, cand = _next_candidates(slot_ptrs, tags, err_addr, w1_ptr, stride_w1, o_cr, CAND,
                                                  SPIN_LIMIT, GUESS_ROUNDS, SPIN_STAGGER, SPIN_READS)
                u_tiles.store(u_next)
                if SAMPLED:
                    n_tiles.store(n_next)
            elif pid == 0:
                # The last step: only program 0 stores a token, and it needs the winner's key, not its W1 row; the
                # other programs leave once their key is out.
                cand_key = gl.max(_wait_slots(slot_ptrs, _load_relaxed(slot_ptrs), tags, err_addr, SPIN_LIMIT,
                                              SPIN_STAGGER, SPIN_READS), axis=1)
        else:
            cand_key, cand = _next_candidates(slot_ptrs, tags, err_addr, w1_ptr, stride_w1, o_cr, CAND,
                                              SPIN_LIMIT, GUESS_ROUNDS, SPIN_STAGGER, SPIN_READS)
            u_tiles.store(u_next)
            if SAMPLED:
                n_tiles.store(n_next)
        return cand_key, cand

    @gluon.jit
    def _stream_steps(u_ptr, stride_uk, w1_ptr, stride_w1, w2_desc, tok_ptr, keys_ptr, gen_ptr,
                      num_steps, logit_scale, ring, ready, a_regs, a_regs2, res_smem, res_ready, b_smem, key_smem,
                      best_smem, u_tiles, u_smem, o_cr, prog, err_addr, cand, cand_key, gen, pid, shard_begin,
                      shard_end, stream_begin, STREAM_TILES: gl.constexpr, RES_T: gl.constexpr, RS_ROWS: gl.constexpr,
                      SCALED: gl.constexpr, NUM_PROGS: gl.constexpr, KEY_STRIDE: gl.constexpr,
                      SLOTS_PER_CAND: gl.constexpr, TILES_P2: gl.constexpr, SPIN_LIMIT: gl.constexpr,
                      GUESS_ROUNDS: gl.constexpr, STREAM_FIRST: gl.constexpr, LEAN_ENDS: gl.constexpr,
                      PAIRED: gl.constexpr, SPIN_STAGGER: gl.constexpr = 0, SPIN_READS: gl.constexpr = 2,
                      HAS_D2T: gl.constexpr = False, id_off0=0, id_off1=0, dl_row=0, stride_dlk=0, valid=True,
                      temp=0.0, nt_ptr=0, stride_ntk=0, n_tiles=0, n_smem=0, SAMPLED: gl.constexpr = False,
                      STORE_LOGITS: gl.constexpr = False):
        """The walk's steps (head_walk_b1_stream_kernel's loop): each publishes its key, then exchanges it."""
        NW: gl.constexpr = gl.num_warps()
        CANDS: gl.constexpr = 8
        ST: gl.constexpr = ring.shape[1]
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, CANDS, 16])
        CAND_KEYS: gl.constexpr = gl.BlockedLayout([CANDS], [32], [NW], [0])
        zero_acc = gl.zeros([ST, CANDS], gl.float32, ACC)
        for k in range(num_steps):
            tag, kslot, u_next, n_next = _step_publish(
                k, a_regs, a_regs2, cand, cand_key, zero_acc, u_ptr, stride_uk, w2_desc, tok_ptr, keys_ptr, num_steps,
                logit_scale, ring, ready, res_smem, res_ready, b_smem, key_smem, best_smem, u_smem, gen, pid,
                shard_begin, shard_end, stream_begin, STREAM_TILES, RES_T, RS_ROWS, SCALED, NUM_PROGS, KEY_STRIDE,
                TILES_P2, STREAM_FIRST, LEAN_ENDS, PAIRED, HAS_D2T, id_off0, id_off1, dl_row, stride_dlk, valid, temp,
                nt_ptr, stride_ntk, n_smem, SAMPLED, STORE_LOGITS)
            cand_key, cand = _step_exchange(k, tag, kslot, u_next, cand, cand_key, w1_ptr, stride_w1, keys_ptr,
                                            num_steps, u_tiles, o_cr, prog, err_addr, pid, NUM_PROGS, KEY_STRIDE,
                                            SLOTS_PER_CAND, SPIN_LIMIT, GUESS_ROUNDS, LEAN_ENDS, SPIN_STAGGER,
                                            SPIN_READS, n_next, n_tiles, SAMPLED)
        winner, col = _agree(key_smem, cand_key, CAND_KEYS, CANDS)
        if pid == 0:
            gl.store(tok_ptr + num_steps - 1, ID_MASK - (winner & ID_MASK))
        gl.store(gen_ptr + pid, gen + num_steps)

    @gluon.jit
    def head_walk_b1_stream_kernel(
        u_ptr, stride_uk,
        w1_ptr, stride_w1,
        w2_ptr, stride_w2r, stride_w2v, w2_desc,
        first_ptr, tok_ptr,
        keys_ptr, gen_ptr, err_ptr,
        num_steps, vocab, logit_scale, d2t_ptr,
        req_ptr, temp_ptr, nt_ptr, stride_ntk, stride_ntb, dl_ptr, stride_dlr, stride_dlk,
        R: gl.constexpr, ST: gl.constexpr, RES_ROWS: gl.constexpr, STREAM_TILES: gl.constexpr,
        TILES_P2: gl.constexpr, STAGES: gl.constexpr, CHUNK_ROWS: gl.constexpr, NUM_PROGS: gl.constexpr,
        KEY_STRIDE: gl.constexpr, SLOTS_PER_CAND: gl.constexpr, RS_ROWS: gl.constexpr, SCALED: gl.constexpr,
        SPIN_LIMIT: gl.constexpr, GUESS_ROUNDS: gl.constexpr = 3, STREAM_FIRST: gl.constexpr = False,
        LEAN_ENDS: gl.constexpr = False, PAIRED: gl.constexpr = False, RS_TMA: gl.constexpr = False,
        SPIN_STAGGER: gl.constexpr = 0, SPIN_READS: gl.constexpr = 2, HAS_D2T: gl.constexpr = False,
        SAMPLED: gl.constexpr = False, STORE_LOGITS: gl.constexpr = False, HAS_REQ: gl.constexpr = False,
    ):
        # Program p owns vocabulary rows [p * CHUNK_ROWS, p * CHUNK_ROWS + CHUNK_ROWS): the first RES_ROWS stay in
        # shared memory (the first RS_ROWS of those in registers), the other STREAM_TILES tiles of ST rows come
        # through a ring of STAGES shared-memory slots filled by TMA (w2_desc: W2 rows [V, R] in [ST, R] boxes).
        # Global streamed iteration g = k * STREAM_TILES + j reads tile g % STREAM_TILES from slot g % STAGES at
        # phase (g // STAGES) & 1, and refills that slot with iteration g + STAGES's tile: the ring never drains
        # between steps, so the next step's first STAGES tiles are copied while the programs exchange keys (W2
        # does not depend on the token). Keys / tags / slots as head_walk_b1_kernel (and kernel.py).
        # SAMPLED: the row's request (req_ptr[0] with HAS_REQ, else 0; -1: a padding row, greedy, stores nothing)
        # draws with its temperature temp_ptr[req] (0: greedy) and the Gumbel noise of the table nt_ptr
        # (noise_table_kernel's [N, 1, V]: steps stride_ntk apart; stride_ntb, its row stride, is not read by one
        # row), which travels with the base logits: the next step's is loaded while the programs meet and kept in
        # shared memory beside them. STORE_LOGITS: each step's logits into the draft-logits cache
        # dl_ptr[req, k, target id].
        NW: gl.constexpr = gl.num_warps()
        CANDS: gl.constexpr = 8
        RES_T: gl.constexpr = RES_ROWS // ST
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                      instr_shape=[16, CANDS, 16])
        # [CANDS, SLOTS_PER_CAND] slots: candidate row c is polled by warp c % NW (two rows a warp at 4 warps).
        SPIN: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        CAND: gl.constexpr = gl.BlockedLayout([1, R // 32], [1, 32], [NW, 1], [1, 0])
        LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        U_TILES: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
        # Must be the host descriptor's layout (stream_descriptor).
        W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ST, R], w2_ptr.dtype.element_ty)
        B_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CANDS, R], w1_ptr.dtype.element_ty)
        PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        w_ty = w2_ptr.dtype.element_ty
        TILE_BYTES: gl.constexpr = ST * R * 2

        pid = gl.program_id(0)
        shard_begin = pid * CHUNK_ROWS
        shard_end = gl.minimum(shard_begin + CHUNK_ROWS, vocab)
        stream_begin = shard_begin + RES_ROWS
        # The row's draw: its request (a padding row, -1, walks greedy and stores nothing) and temperature.
        valid = True
        req_safe = 0
        if HAS_REQ:
            req = gl.load(req_ptr).to(gl.int64)
            valid = req >= 0
            req_safe = gl.where(valid, req, 0)
        temp = 0.0
        if SAMPLED:
            if HAS_REQ:
                temp = gl.load(temp_ptr + req_safe, mask=valid, other=0.0).to(gl.float32)
            else:
                temp = gl.load(temp_ptr).to(gl.float32)

        # The ring first: its first STAGES copies travel while the resident rows are loaded.
        ring = gl.allocate_shared_memory(w_ty, [STAGES, ST, R], W_SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        fence_async_shared()
        _cta_sync()
        total = num_steps * STREAM_TILES
        if STREAM_TILES > 0:
            for s in gl.static_range(STAGES):
                mbarrier.expect(ready.index(s), TILE_BYTES, pred=s < total)
                _tma_load(w2_desc, [stream_begin + (s % STREAM_TILES) * ST, 0], ready.index(s), ring.index(s),
                          pred=s < total)
        SMEM_RES_T: gl.constexpr = (RES_ROWS - RS_ROWS) // ST
        res_ready = ready  # unused unless LEAN_ENDS
        rs_stage = ring  # unused unless RS_TMA
        if LEAN_ENDS:
            # The shared-memory resident tiles by TMA too (rows past the shard are read but scored -inf), and step
            # 0's base logits and the anchor's W1 row issued before the register tile: nothing the first step needs
            # waits behind a load -> store round trip of the resident rows.
            res_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(res_ready, count=1)
            fence_async_shared()
            _cta_sync()
            if RS_TMA:
                # The register tiles by TMA too, through a staging buffer (fully resident shards: no ring to share
                # the shared memory with), read into registers once every copy has landed.
                rs_stage = gl.allocate_shared_memory(w_ty, [RS_ROWS // ST, ST, R], W_SMEM)
                mbarrier.expect(res_ready, RES_ROWS // ST * TILE_BYTES)
                for c in gl.static_range(RS_ROWS // ST):
                    _tma_load(w2_desc, [shard_begin + c * ST, 0], res_ready, rs_stage.index(c))
            else:
                mbarrier.expect(res_ready, SMEM_RES_T * TILE_BYTES)
            if SMEM_RES_T > 0:
                res_smem = gl.allocate_shared_memory(w_ty, [SMEM_RES_T, ST, R], W_SMEM)
                for c in gl.static_range(SMEM_RES_T):
                    _tma_load(w2_desc, [shard_begin + RS_ROWS + c * ST, 0], res_ready, res_smem.index(c))
            else:
                res_smem = ring  # unused
            if PAIRED:
                # Every copy leaves before the anchor's loads: ptxas otherwise issues the second behind the W1 row's
                # load, which waits for the anchor token (one dependent round trip in front of the tile).
                _cta_sync()
            u_first = _load_u_tiles(u_ptr, 0, stride_uk, shard_begin, shard_end, TILES_P2, ST, U_TILES)
            n_first = 0
            if SAMPLED:
                n_first = _load_u_tiles(nt_ptr, 0, stride_ntk, shard_begin, shard_end, TILES_P2, ST, U_TILES)
            o_cr = gl.arange(0, R, gl.SliceLayout(0, CAND))
            prog, err_addr, cand, cand_key = _poll_setup(pid, err_ptr, first_ptr, w1_ptr, stride_w1, o_cr, CANDS,
                                                         SLOTS_PER_CAND, NUM_PROGS, SPIN, CAND)

        if RS_ROWS > 0:
            # The first resident tile's A fragments live in registers for the whole walk (RS_ROWS == ST: 64
            # registers a thread, ST = 16 * NW), loaded straight from global: its rows take no shared memory, which
            # is what lets an rs plan keep one more ring stage or resident tile. "rs2" (RS_ROWS == 2 * ST): the
            # second resident tile in registers too (128 registers a thread of W2), one more resident tile in the
            # same shared memory.
            DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
            if RS_TMA:
                # (rows past the shard arrive too: scored -inf, as the shared-memory tiles')
                mbarrier.wait(res_ready, 0)
                a_regs = rs_stage.index(0).load(DOT_A)
                if RS_ROWS > ST:
                    a_regs2 = rs_stage.index(1).load(DOT_A)
                else:
                    a_regs2 = 0  # unused
            else:
                rows_a = shard_begin + gl.arange(0, ST, gl.SliceLayout(1, DOT_A))
                o_ak = gl.arange(0, R, gl.SliceLayout(0, DOT_A))
                a_regs = gl.load(w2_ptr + rows_a[:, None] * stride_w2v + o_ak[None, :] * stride_w2r,
                                 mask=(rows_a < shard_end)[:, None], other=0.0)
                if RS_ROWS > ST:
                    rows_a2 = rows_a + ST
                    a_regs2 = gl.load(w2_ptr + rows_a2[:, None] * stride_w2v + o_ak[None, :] * stride_w2r,
                                      mask=(rows_a2 < shard_end)[:, None], other=0.0)
                else:
                    a_regs2 = 0  # unused
        else:
            a_regs = 0  # unused
            a_regs2 = 0  # unused
        if LEAN_ENDS:
            pass  # res_smem: loading by TMA (above)
        elif RES_ROWS > RS_ROWS:
            # [tiles, ST, R] like the ring: any number of tiles (a 2-D buffer's rows must be a power of two).
            res_smem = gl.allocate_shared_memory(w_ty, [(RES_ROWS - RS_ROWS) // ST, ST, R], W_SMEM)
            o_lr = gl.arange(0, ST, gl.SliceLayout(1, LOAD))
            o_lk = gl.arange(0, R, gl.SliceLayout(0, LOAD))
            for c in gl.static_range((RES_ROWS - RS_ROWS) // ST):
                rows_c = shard_begin + RS_ROWS + c * ST + o_lr
                tile = gl.load(w2_ptr + rows_c[:, None] * stride_w2v + o_lk[None, :] * stride_w2r,
                               mask=(rows_c < shard_end)[:, None], other=0.0)
                res_smem.index(c).store(tile)
        else:
            res_smem = ring  # unused
        b_smem = gl.allocate_shared_memory(w1_ptr.dtype.element_ty, [CANDS, R], B_SMEM)
        key_smem = gl.allocate_shared_memory(gl.int64, [CANDS], PLAIN)
        best_smem = gl.allocate_shared_memory(gl.int64, [NW], PLAIN)
        # Written as one [TILES_P2, ST] tile (order of rank 2), read as TILES_P2 rows of ST (a buffer of rank-1 rows:
        # index(t) takes a runtime t), the same bytes.
        u_tiles = gl.allocate_shared_memory(u_ptr.dtype.element_ty, [TILES_P2, ST],
                                            gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        if _PUBLIC_REINTERPRET:
            u_smem = u_tiles.reinterpret(u_ptr.dtype.element_ty, [TILES_P2, ST], PLAIN)
        else:
            u_smem = u_tiles._reinterpret(u_ptr.dtype.element_ty, [TILES_P2, ST], PLAIN)
        if LEAN_ENDS:
            u_tiles.store(u_first)
            fence_async_shared()
        else:
            u_tiles.store(_load_u_tiles(u_ptr, 0, stride_uk, shard_begin, shard_end, TILES_P2, ST, U_TILES))
            fence_async_shared()
            n_first = 0
            if SAMPLED:
                n_first = _load_u_tiles(nt_ptr, 0, stride_ntk, shard_begin, shard_end, TILES_P2, ST, U_TILES)
            o_cr = gl.arange(0, R, gl.SliceLayout(0, CAND))
            prog, err_addr, cand, cand_key = _poll_setup(pid, err_ptr, first_ptr, w1_ptr, stride_w1, o_cr, CANDS,
                                                         SLOTS_PER_CAND, NUM_PROGS, SPIN, CAND)
        if HAS_D2T:
            # The two resident tiles' rows as target ids (d2t: target = draft + d2t[draft]), once for the walk.
            rows_d = shard_begin + gl.arange(0, ST, gl.SliceLayout(1, ACC))
            id_off0 = gl.load(d2t_ptr + rows_d, mask=rows_d < shard_end, other=0).to(gl.int32)
            id_off1 = gl.load(d2t_ptr + rows_d + ST, mask=rows_d + ST < shard_end, other=0).to(gl.int32)
        else:
            id_off0 = 0
            id_off1 = 0
        # The row's noise buffer and cache row (placeholders where not used).
        n_tiles = u_tiles  # unused unless SAMPLED
        n_smem = u_smem
        if SAMPLED:
            n_tiles = gl.allocate_shared_memory(gl.float32, [TILES_P2, ST], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
            if _PUBLIC_REINTERPRET:
                n_smem = n_tiles.reinterpret(gl.float32, [TILES_P2, ST], PLAIN)
            else:
                n_smem = n_tiles._reinterpret(gl.float32, [TILES_P2, ST], PLAIN)
            n_tiles.store(n_first)
        dl_row = 0
        if STORE_LOGITS:
            dl_row = dl_ptr + req_safe * stride_dlr
        gen = gl.load(gen_ptr + pid)
        _stream_steps(u_ptr, stride_uk, w1_ptr, stride_w1, w2_desc, tok_ptr, keys_ptr, gen_ptr,
                      num_steps, logit_scale, ring, ready, a_regs, a_regs2, res_smem, res_ready, b_smem, key_smem,
                      best_smem, u_tiles, u_smem, o_cr, prog, err_addr, cand, cand_key, gen, pid, shard_begin,
                      shard_end, stream_begin, STREAM_TILES, RES_T, RS_ROWS, SCALED, NUM_PROGS, KEY_STRIDE,
                      SLOTS_PER_CAND, TILES_P2, SPIN_LIMIT, GUESS_ROUNDS, STREAM_FIRST, LEAN_ENDS, PAIRED,
                      SPIN_STAGGER, SPIN_READS, HAS_D2T, id_off0, id_off1, dl_row, stride_dlk, valid, temp, nt_ptr,
                      stride_ntk, n_tiles, n_smem, SAMPLED, STORE_LOGITS)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
        if LEAN_ENDS:
            mbarrier.invalidate(res_ready)
