"""Persistent Triton kernel for the DSpark serial head walk (walk.py has the public function and the plan).

One launch walks all N steps. Program p owns a contiguous vocabulary shard of W2; up to RES_TILES tiles of RT
rows stay in shared memory for the whole walk (loaded before the step loop, they are loop-invariant operands of
`tl.dot([rows, r], [r, BP])`, a wgmma that reads them from shared memory every step); the rest of the shard
(partial residency) is streamed each step in ST-row tiles (STREAM_TMA: through a ring of shared-memory stages that
TMA copies fill; else double-buffered in registers). Each step every program: picks the previous token
from all programs' published keys, gathers W1[x], (RNN: advances its slice of the recurrent state and exchanges
it), computes its shard's logits for all rows, takes the shard's argmax / Gumbel-max per row, publishes it as
one int64 key per row, and waits for every program's key of this step (a grid barrier or tagged keys).

A key orders (value, -token id) as one signed int64: the top 32 bits are the fp32 value made monotone as an
int32, the low 18 bits the inverted token id, so `max(keys)` is the argmax with the first of equal maxima, as
torch.argmax and vLLM's Gumbel sampler pick.

MULTI=False runs without grid barriers: one program walks everything (the only mode that is correct under
TRITON_INTERPRET=1, which runs programs one after another), or several programs run one step per launch
("lockstep": the launch boundary is the barrier; this is the one-launch-per-step kernel and the CPU check of
the multi-program exchange).
"""
import triton
import triton.language as tl

MAX_TOKENS = 1 << 18  # token ids < 262,144 (Qwen3.5's 248,320 fits)
ID_MASK = tl.constexpr(MAX_TOKENS - 1)
NO_ID = tl.constexpr(MAX_TOKENS)
# The narrowest base-logit box a one-row TMA ring copies (see _load_u_desc).
U_BOX_BYTES = 128
U_BOX_BITS = tl.constexpr(8 * U_BOX_BYTES)
# vLLM's gumbel.py: draft noise is salted away from the target's.
DRAFT_NOISE_SALT = tl.constexpr(1 << 30)
# One thread's spin on one tagged slot (_spin_tagged): relaxed loads until the key's tag bits (18-31) equal $2, at
# most $3 polls (then the int32 flag at $4 is set and the stale key returned).
SPIN_TAGGED_PTX = tl.constexpr("""{
        .reg .pred %hwp;
        .reg .b64 %hwt;
        .reg .b32 %hwg, %hwn;
        mov.u32 %hwn, 0;
        HW_SPIN:
        ld.relaxed.gpu.global.b64 $0, [$1];
        shr.u64 %hwt, $0, 18;
        cvt.u32.u64 %hwg, %hwt;
        and.b32 %hwg, %hwg, 16383;
        setp.eq.u32 %hwp, %hwg, $2;
        @%hwp bra HW_DONE;
        add.u32 %hwn, %hwn, 1;
        setp.lt.u32 %hwp, %hwn, $3;
        @%hwp bra HW_SPIN;
        mov.u32 %hwg, 1;
        st.relaxed.gpu.global.b32 [$4], %hwg;
        HW_DONE:
        }""")
# SPIN_TAGGED_PTX for a slot read once already ($5, the first read: _wait_tagged; gluon_b1 spins with it too).
WAIT_TAGGED_PTX = tl.constexpr("""{
        .reg .pred %hwp;
        .reg .b64 %hwt;
        .reg .b32 %hwg, %hwn;
        mov.b64 $0, $5;
        mov.u32 %hwn, 0;
        HW_CHECK:
        shr.u64 %hwt, $0, 18;
        cvt.u32.u64 %hwg, %hwt;
        and.b32 %hwg, %hwg, 16383;
        setp.eq.u32 %hwp, %hwg, $2;
        @%hwp bra HW_DONE;
        setp.ge.u32 %hwp, %hwn, $3;
        @%hwp bra HW_FAIL;
        add.u32 %hwn, %hwn, 1;
        ld.relaxed.gpu.global.b64 $0, [$1];
        bra HW_CHECK;
        HW_FAIL:
        mov.u32 %hwg, 1;
        st.relaxed.gpu.global.b32 [$4], %hwg;
        HW_DONE:
        }""")


@triton.jit
def _rotl32(value, shift: tl.constexpr):
    return (value << shift) | (value >> (32 - shift))


@triton.jit
def _murmur3_mix(h, key):
    key *= 0xCC9E2D51
    key = _rotl32(key, 15)
    key *= 0x1B873593
    h ^= key
    h = _rotl32(h, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _murmur3_fmix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _gumbel_noise(seed, pos, keys):
    """vLLM's fp32 draft noise: murmur3_uniform32(seed, pos, keys) -> -log(-log1p(-u)), same operation order,
    so that the compiled arithmetic (and any FMA contraction) matches vLLM's kernel bit for bit."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    keys = keys.to(tl.uint32)
    h = (seed ^ seed).to(tl.uint32)
    h = _murmur3_mix(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = _murmur3_mix(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _murmur3_mix(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _murmur3_mix(h, keys)
    bits = _murmur3_fmix32(h ^ 16)
    hi16 = (bits >> 16).to(tl.int32)
    lo16 = (bits & 0xFFFF).to(tl.int32)
    u = hi16.to(tl.float32) * 1.52587890625e-05 + (lo16.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    poly = 1.0 / 8.0
    poly = 1.0 / 7.0 + u * poly
    poly = 1.0 / 6.0 + u * poly
    poly = 1.0 / 5.0 + u * poly
    poly = 1.0 / 4.0 + u * poly
    poly = 1.0 / 3.0 + u * poly
    poly = 1.0 / 2.0 + u * poly
    poly = 1.0 + u * poly
    series = -u * poly
    direct = tl.log(tl.maximum(1.0 - u, 5.960464477539063e-08))
    log1p_neg = tl.where(u < 0.25, series, direct)
    return -tl.log(-log1p_neg)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _ordered_keys(values, ids):
    # +0.0 folds -0.0 into +0.0, which torch.argmax treats as equal.
    bits = (values + 0.0).to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (ID_MASK - ids.to(tl.int64))


@triton.jit
def _spin_until(count_ptr, target, err_ptr, SPIN_LIMIT: tl.constexpr):
    """Acquire polls of a step counter (Triton's scalar atomics) until it reaches target; a wait that gives up sets
    the flag at err_ptr."""
    cur = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (cur < target) & (spins < SPIN_LIMIT):
        cur = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= SPIN_LIMIT:
        tl.atomic_or(err_ptr, 1)


@triton.jit
def _grid_barrier(count_ptr, err_ptr, NUM_PROGS: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """All programs meet. The counter only grows (int64), so it never needs resetting between launches."""
    tl.debug_barrier()
    old = tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    _spin_until(count_ptr, (old // NUM_PROGS + 1) * NUM_PROGS, err_ptr, SPIN_LIMIT)
    tl.debug_barrier()


@triton.jit
def _publish_and_wait(keys_ptr, slot, pid, o_b, best, tag, num_rows, err_ptr, NUM_PROGS: tl.constexpr,
                      PP: tl.constexpr, BP: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Flag exchange: the keys carry the step's tag; row 0's key, written last with release semantics, is the
    program's arrival flag, and every program polls the others' row-0 keys instead of a shared counter. One
    global round trip less than counter + read; no reset ever (tags only grow, 0 never matches)."""
    tagged = best | (tag.to(tl.int64) << 18)
    base = keys_ptr + slot * NUM_PROGS * BP + pid * BP
    tl.store(base + o_b, tagged, mask=o_b > 0)
    tl.debug_barrier()
    tl.atomic_xchg(base, tl.sum(tl.where(o_b == 0, tagged, 0), axis=0), sem="release", scope="gpu")
    o_p = tl.arange(0, PP)
    flags_ptr = keys_ptr + slot * NUM_PROGS * BP + o_p * BP
    spins = 0
    waiting = 1
    flags = tl.full([PP], 0, dtype=tl.int64)
    while (waiting > 0) & (spins < SPIN_LIMIT):
        flags = tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [flags_ptr], dtype=tl.int64,
                                          is_pure=False, pack=1)
        late = (o_p < NUM_PROGS) & (((flags >> 18) & 0x3FFF) != tag)
        waiting = tl.sum(late.to(tl.int32), axis=0)
        spins += 1
    if spins >= SPIN_LIMIT:
        tl.atomic_or(err_ptr, 1)
    tl.debug_barrier()
    # Row 0's winner, straight from the flags: with one row this is the whole exchange.
    return tl.max(tl.where(o_p < NUM_PROGS, flags, -9223372036854775807 - 1), axis=0)


@triton.jit
def _publish_relaxed(ptrs, keys):
    """st.relaxed.gpu of every key: no fence and no atomic round trip, since each key proves itself by its tag."""
    tl.inline_asm_elementwise("st.relaxed.gpu.global.b64 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,l", [ptrs, keys],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _spin_tagged(ptrs, tag, err_addr, SPIN_LIMIT: tl.constexpr):
    """Each thread spins on its own slots inside PTX until the slot carries `tag` and returns the key: the wait
    costs no CTA-wide sync per poll (Triton's while loop needs a reduced scalar condition, a bar.sync each poll).
    A thread that gives up sets the int32 flag at err_addr (an address as int64: the asm's operands are
    broadcast together, and Triton 3.6 refuses to combine pointers of two element types) and returns the stale
    key."""
    return tl.inline_asm_elementwise(
        SPIN_TAGGED_PTX,
        "=l,l,r,r,l", [ptrs, tag, tl.full(ptrs.shape, SPIN_LIMIT, tl.int32), err_addr], dtype=tl.int64,
        is_pure=False, pack=1)


@triton.jit
def _load_relaxed(ptrs):
    return tl.inline_asm_elementwise("ld.relaxed.gpu.global.b64 $0, [$1];", "=l,l", [ptrs], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _wait_tagged(ptrs, first, tag, err_addr, SPIN_LIMIT: tl.constexpr):
    """_spin_tagged for slots already read once (`first`, from _load_relaxed): a thread owning several slots
    issues all their first reads before it waits on any, so slots that have arrived cost one round trip
    together, not one each (_spin_tagged's loop reads its slots one after another)."""
    return tl.inline_asm_elementwise(
        WAIT_TAGGED_PTX,
        "=l,l,r,r,l,l", [ptrs, tag, tl.full(ptrs.shape, SPIN_LIMIT, tl.int32), err_addr, first], dtype=tl.int64,
        is_pure=False, pack=1)


@triton.jit
def _prefetch_l1(ptrs):
    """prefetch.global.L1 of the line holding each address: nothing waits on it, a later plain load hits L1."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_rows_l1(w1_ptr, stride_w1, ids, R: tl.constexpr):
    """W1 rows of `ids` (any shape) into L1, one line prefetch per 128 bytes, each thread for its own ids (no
    layout change, so a thread starts as soon as its own candidate is known)."""
    LINE: tl.constexpr = 1024 // w1_ptr.dtype.element_ty.primitive_bitwidth
    row = w1_ptr + ids * stride_w1
    for i in tl.static_range(0, R, LINE):
        _prefetch_l1(row + i)


@triton.jit
def _prefetch_u_l1(u_ptr, stride_ub, stride_uk, step, row_begin, shard_end, num_rows, ROWS: tl.constexpr,
                   BP: tl.constexpr, ONE_ROW: tl.constexpr):
    """Lines of U[:, step, row_begin : row_begin + ROWS] into L1 (addresses clamped into the shard and the live
    rows: a prefetch is never masked)."""
    LINE: tl.constexpr = 1024 // u_ptr.dtype.element_ty.primitive_bitwidth
    NL: tl.constexpr = ROWS // LINE if ROWS >= LINE else 1
    o_l = tl.minimum(row_begin + tl.arange(0, NL) * LINE, shard_end - 1)
    if ONE_ROW:
        _prefetch_l1(u_ptr + step * stride_uk + o_l)
    else:
        o_b = tl.minimum(tl.arange(0, BP), num_rows - 1)
        _prefetch_l1(u_ptr + o_b[None, :] * stride_ub + step * stride_uk + o_l[:, None])


@triton.jit
def _gather_first(base, p0, o_k, num_rows, tag, NUM_PROGS: tl.constexpr, PCH: tl.constexpr, BP: tl.constexpr):
    """_gather_tagged's first batch of loads: [PCH, BP] keys, the lowest key of this tag in dead lanes."""
    o_c = p0 + tl.arange(0, PCH)
    live = (o_c < NUM_PROGS)[:, None] & (o_k < num_rows)[None, :]
    floor = (-9223372036854775807 - 1) | (tag.to(tl.int64) << 18)
    return tl.load(base + o_c[:, None] * BP + o_k[None, :], mask=live, other=floor, volatile=True)


@triton.jit
def _gather_tagged(base, p0, o_k, num_rows, tag, first, err_ptr, NUM_PROGS: tl.constexpr, PCH: tl.constexpr,
                   BP: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Keys [PCH, BP] of programs p0 .. p0 + PCH - 1, live rows only, each carrying `tag`: one batch of relaxed
    (volatile) loads for all slots (or `first`, issued earlier by _gather_first), then, while any slot misses its
    tag, one batch of reloads of the missing ones (a CTA-wide count per round: the round trips of all slots
    overlap). Dead lanes (padding programs and rows) load nothing and hold the lowest key of this tag."""
    o_c = p0 + tl.arange(0, PCH)
    ptrs = base + o_c[:, None] * BP + o_k[None, :]
    if first is None:
        keys = _gather_first(base, p0, o_k, num_rows, tag, NUM_PROGS, PCH, BP)
    else:
        keys = first
    missing = ((keys >> 18) & 0x3FFF) != tag
    late = tl.sum(missing.to(tl.int32))
    spins = 0
    while (late > 0) & (spins < SPIN_LIMIT):
        # `other=keys` (not a select after the load): every reload keeps its own register, so all are in flight
        # together instead of one round trip each.
        keys = tl.load(ptrs, mask=missing, other=keys, volatile=True)
        missing = ((keys >> 18) & 0x3FFF) != tag
        late = tl.sum(missing.to(tl.int32))
        spins += 1
    if spins >= SPIN_LIMIT:
        tl.atomic_or(err_ptr, 1)
    return keys


@triton.jit
def _publish_tagged(keys_ptr, slot, pid, best, tag, NUM_PROGS: tl.constexpr, BP: tl.constexpr):
    """The tagged exchange's publish: this program's [BP] keys with the step's tag, relaxed stores that nothing
    waits on (work independent of the exchange, like the next step's noise, can run between this and the wait)."""
    _publish_relaxed(keys_ptr + slot * NUM_PROGS * BP + pid * BP + tl.arange(0, BP), best | (tag.to(tl.int64) << 18))


@triton.jit
def _winner_key(best):
    """An exchange key made non-negative with its order kept: the value's 32 bits (sign flipped) move down over the
    tag bits 18-49, the id stays in bits 0-17. A winners slot reset to 0 then loses to every key of a step, and
    the winner's id is read from the same low bits (_winner_ids)."""
    return (((best >> 32) + 2147483648) << 18) | (best & ID_MASK)


@triton.jit
def _arrive_release(count_ptr, INLINE_PTX: tl.constexpr):
    """One release arrival of this program on the step counter, after a CTA barrier (so it orders every thread's
    earlier winners update, as a grid sync does). PTX: a fire-and-forget red by thread 0 (nothing to wait for
    but the release's own fence); else Triton's scalar atomic (the interpreter)."""
    tl.debug_barrier()
    if INLINE_PTX:
        tl.inline_asm_elementwise(
            """{
            .reg .pred %axp;
            .reg .u32 %axt;
            mov.u32 %axt, %tid.x;
            setp.eq.u32 %axp, %axt, 0;
            @%axp red.release.gpu.global.add.u64 [$1], 1;
            mov.u32 $0, 0;
            }""", "=r,l", [count_ptr.to(tl.int64, bitcast=True)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_count(count_ptr, target, err_ptr, SPIN_LIMIT: tl.constexpr, INLINE_PTX: tl.constexpr):
    """Until the step counter reaches `target`: thread 0 spins with acquire loads inside PTX (no CTA sync per poll,
    one poller a program instead of every warp), then a CTA barrier hands its acquire to the other threads (as a
    grid sync does). A wait that gives up sets the int32 flag at err_ptr."""
    if INLINE_PTX:
        tl.inline_asm_elementwise(
            """{
            .reg .pred %axp;
            .reg .u32 %axt, %axn;
            .reg .b64 %axc;
            mov.u32 %axt, %tid.x;
            setp.ne.u32 %axp, %axt, 0;
            @%axp bra AX_DONE;
            mov.u32 %axn, 0;
            AX_SPIN:
            ld.acquire.gpu.global.b64 %axc, [$1];
            setp.ge.s64 %axp, %axc, $2;
            @%axp bra AX_DONE;
            add.u32 %axn, %axn, 1;
            setp.lt.u32 %axp, %axn, $3;
            @%axp bra AX_SPIN;
            mov.u32 %axt, 1;
            st.relaxed.gpu.global.b32 [$4], %axt;
            AX_DONE:
            mov.u32 $0, 0;
            }""", "=r,l,l,r,l", [count_ptr.to(tl.int64, bitcast=True), target.to(tl.int64),
                                 tl.full([], SPIN_LIMIT, tl.int32), err_ptr.to(tl.int64, bitcast=True)],
            dtype=tl.int32, is_pure=False, pack=1)
    else:
        _spin_until(count_ptr, target, err_ptr, SPIN_LIMIT)
    tl.debug_barrier()


@triton.jit
def _winners_slot(win_ptr, slot, o_b, BP: tl.constexpr, WIN_STRIDE: tl.constexpr):
    """[BP] pointers to the rows of winners slot `slot` (of 3), WIN_STRIDE int64 entries apart."""
    return win_ptr + slot * BP * WIN_STRIDE + o_b * WIN_STRIDE


@triton.jit
def _fold_winners(win_ptr, slot, best, o_b, m_b, BP: tl.constexpr, WIN_STRIDE: tl.constexpr):
    """This program's [BP] row bests into winners slot `slot`: relaxed atomic max, nothing waited on."""
    tl.atomic_max(_winners_slot(win_ptr, slot, o_b, BP, WIN_STRIDE), _winner_key(best), mask=m_b, sem="relaxed",
                  scope="gpu")


@triton.jit
def _clear_winners(win_ptr, slot, o_b, BP: tl.constexpr, WIN_STRIDE: tl.constexpr):
    """Winners slot `slot` back to 0, the value every key of a step beats (_winner_key)."""
    tl.store(_winners_slot(win_ptr, slot, o_b, BP, WIN_STRIDE), tl.zeros([BP], dtype=tl.int64))


@triton.jit
def _read_winners(win_ptr, slot, o_b, m_b, BP: tl.constexpr, WIN_STRIDE: tl.constexpr):
    """[BP] winning keys of a step's winners slot (0 in padding rows): volatile loads, past L1."""
    return tl.load(_winners_slot(win_ptr, slot, o_b, BP, WIN_STRIDE), mask=m_b, other=0, volatile=True)


@triton.jit
def _exchange_amax(win_ptr, count_ptr, err_ptr, epoch, pid, best, o_b, m_b, NUM_PROGS: tl.constexpr,
                   BP: tl.constexpr, WIN_STRIDE: tl.constexpr, SPIN_LIMIT: tl.constexpr, INLINE_PTX: tl.constexpr):
    """Exchange "amax": every program folds its [BP] row bests into the step's [BP] winners slot with relaxed
    atomic max (fire and forget), arrives once on the step counter (release), waits for all NUM_PROGS arrivals
    (acquire) and reads back the [BP] winners: per program and step BP keys out and BP keys in, whatever the
    number of programs (the tagged exchanges read all [P, BP]). Returns the winners [BP].

    Epochs and slots: step `epoch` (the counter's count of completed steps, so it grows across walks and graph
    replays and never needs a host reset) uses slot epoch % 3. Once every program has arrived for `epoch`, every
    program has read epoch - 1's winners (it read them before it could score this step), so program 0 resets
    slot (epoch + 2) % 3 = (epoch - 1) % 3 to 0; the reset is ordered before anyone's max into that slot (at
    epoch + 2) by program 0's release arrival at epoch + 1. A walk therefore leaves the slots of its next two
    epochs at 0, which is what the next walk (or the lockstep form) starts from."""
    slot = epoch % 3
    _fold_winners(win_ptr, slot, best, o_b, m_b, BP, WIN_STRIDE)
    _arrive_release(count_ptr, INLINE_PTX)
    _wait_count(count_ptr, (epoch + 1) * NUM_PROGS, err_ptr, SPIN_LIMIT, INLINE_PTX)
    winners = _read_winners(win_ptr, slot, o_b, m_b, BP, WIN_STRIDE)
    if pid == 0:
        _clear_winners(win_ptr, (epoch + 2) % 3, o_b, BP, WIN_STRIDE)
    return winners


@triton.jit
def _exchange_first(keys_ptr, slot, pid, tag, num_rows, NUM_PROGS: tl.constexpr, PP: tl.constexpr,
                    BP: tl.constexpr, MODE: tl.constexpr):
    """The batched exchanges' first reads (several rows; MODE 3 probe: column 0 of every program, [PP]; 4 poll: the
    first pass of live slots, [PCH, BP]), issued before work that does not need them (the next step's noise), so
    their round trip overlaps it; _exchange_tagged(first=...) checks them and re-polls what is missing."""
    base = keys_ptr + slot * NUM_PROGS * BP
    if MODE == 3:
        o_p = tl.arange(0, PP)
        first = _load_relaxed(base + tl.where(o_p < NUM_PROGS, o_p, pid) * BP)
    else:
        PCH: tl.constexpr = PP if PP * BP <= 4096 else 4096 // BP
        first = _gather_first(base, 0, tl.arange(0, BP), num_rows, tag, NUM_PROGS, PCH, BP)
    return first


@triton.jit
def _exchange_tagged(keys_ptr, slot, pid, o_b, tag, first, err_ptr, num_rows, w1_ptr, stride_w1,
                     NUM_PROGS: tl.constexpr, PP: tl.constexpr, BP: tl.constexpr, KB: tl.constexpr,
                     MODE: tl.constexpr, PREFETCH_W1: tl.constexpr, R: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Tagged exchange (after _publish_tagged): every key carries the step's tag (bits 18-31), so each slot is its
    own arrival flag and publishing is a plain relaxed store. KB = 1 (one batch row): every thread spins on its
    own slots of column 0 (PREFETCH_W1: and, the moment its slot arrives, prefetches that program's candidate
    W1 row into L1, so the winner's gather after the max is an L1 hit); one CTA-wide max is the winner, a scalar.
    KB = BP, winners [BP], by MODE: 2 "tagged" (per-thread PTX spin on each slot, one slot after another);
    3 "probe" (the per-thread spin on column 0 only, a CTA sync, then one batch of loads of every live slot that
    re-polls the few whose tags are missing); 4 "poll" (that batch of loads and re-polls from the start).

    Slot reuse (slot = k % 2) is safe: a program writes step k's keys only after it read all of step k - 1's,
    which every program published after it had read all of step k - 2's from the same slot (the key it
    publishes depends on the keys it read, so the read completes first)."""
    err_addr = err_ptr.to(tl.int64)
    base = keys_ptr + slot * NUM_PROGS * BP
    # Padding lanes poll this program's own slot, which holds this step's key already.
    if KB == 1 or MODE == 3:
        o_p = tl.arange(0, PP)
        prog = tl.where(o_p < NUM_PROGS, o_p, pid)
        if first is None:
            keys = _spin_tagged(base + prog * BP, tl.full([PP], 0, tl.int32) + tag, err_addr + 0 * o_p, SPIN_LIMIT)
        else:
            keys = _wait_tagged(base + prog * BP, first, tl.full([PP], 0, tl.int32) + tag, err_addr + 0 * o_p,
                                SPIN_LIMIT)
        if KB == 1:
            if PREFETCH_W1:
                _prefetch_rows_l1(w1_ptr, stride_w1, ID_MASK - (keys & ID_MASK), R)
            winner = tl.max(keys, axis=0)
        else:
            # Every program's column 0 has arrived: its other columns, stored beside it, almost surely too.
            tl.debug_barrier()
    if KB > 1 and MODE >= 3:
        # At most 4096 slots a pass (16 a thread at 8 warps); 125 programs (V = 32k) x 32 rows is one pass.
        PCH: tl.constexpr = PP if PP * BP <= 4096 else 4096 // BP
        o_k = tl.arange(0, BP)
        winner = tl.full([BP], -9223372036854775807 - 1, dtype=tl.int64)
        for p0 in tl.static_range(0, NUM_PROGS, PCH):
            if MODE == 4 and p0 == 0:
                keys = _gather_tagged(base, p0, o_k, num_rows, tag, first, err_ptr, NUM_PROGS, PCH, BP, SPIN_LIMIT)
            else:
                keys = _gather_tagged(base, p0, o_k, num_rows, tag, None, err_ptr, NUM_PROGS, PCH, BP, SPIN_LIMIT)
            winner = tl.maximum(winner, tl.max(keys, axis=0))
    elif KB > 1:
        # At most 2048 slots a pass (8 a thread), so the polled keys and their addresses stay in registers.
        PCH: tl.constexpr = PP if PP * KB <= 2048 else 2048 // KB
        o_k = tl.arange(0, KB)
        zero = tl.full([PCH, KB], 0, tl.int32)
        winner = tl.full([KB], -9223372036854775807 - 1, dtype=tl.int64)
        for p0 in tl.static_range(0, PP, PCH):
            o_c = p0 + tl.arange(0, PCH)
            prog_c = tl.where(o_c < NUM_PROGS, o_c, pid)
            ptrs = base + prog_c[:, None] * BP + o_k[None, :]
            keys = _wait_tagged(ptrs, _load_relaxed(ptrs), zero + tag, err_addr + zero, SPIN_LIMIT)
            winner = tl.maximum(winner, tl.max(keys, axis=0))
    return winner


@triton.jit
def _score_tile(w, u, noise, m_dot, rows, step, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr, stride_ub,
                stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, vocab,
                SAMPLED: tl.constexpr, HAS_D2T: tl.constexpr, STORE_LOGITS: tl.constexpr, W2_SCALED: tl.constexpr,
                KEY_BY_TARGET: tl.constexpr, DOT_PRECISION: tl.constexpr, ONE_ROW: tl.constexpr,
                SCALED: tl.constexpr, SPLIT: tl.constexpr, d2t_rows=None):
    """(keys, ids) of one tile of vocabulary rows for every batch row: int64 keys [rows, BP] (the caller reduces
    them: one max over the keys is the argmax with the first of equal maxima), or with SPLIT the fp32 scores
    [rows, BP] themselves (the caller keeps a running (value, id) max, _fold_split: a few instructions an element
    where a key costs a dozen). ids [rows]: the token ids the keys order by. ONE_ROW (a walk of one batch row;
    temp, seed, pos, req_safe, valid are then scalars): keys [rows]. noise: this tile's Gumbel noise computed
    ahead (None: computed here). d2t_rows: the tile's d2t offsets loaded once before the step loop (a resident
    tile's rows never change; None: loaded here). Rows past `vocab` score -inf: their base logits load as -inf (_load_u).

    The tile is the dot's first operand ([rows, r] @ [r, BP]): on Hopper that is a wgmma reading W2 straight
    from shared memory, where a [BP, r] @ [r, rows] product would copy the whole tile into registers each step.
    """
    acc = tl.dot(w.to(m_dot.dtype), m_dot, input_precision=DOT_PRECISION)
    m_v = rows < vocab
    if ONE_ROW:
        keys = _score_row(acc, u, rows, step, req_safe, valid, temp, seed, pos, u_ptr, stride_uk, w2_scale_ptr,
                          d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, vocab, o_b, SAMPLED, HAS_D2T,
                          STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, SCALED, d2t_rows, noise)
        ids = rows
    else:
        if W2_SCALED:
            acc = acc * tl.load(w2_scale_ptr + rows, mask=m_v, other=0.0)[:, None]
        out_ty = u_ptr.dtype.element_ty
        # vLLM rounds the GEMV's bias to the logits dtype, scales it there only when its scale is not 1
        # (LogitsProcessor), and adds it to the base logits with one more rounding (a torch add). With scale 1 the
        # multiply and its rounding are exact no-ops: SCALED leaves them out.
        bias = acc.to(out_ty).to(tl.float32)
        if SCALED:
            bias = (bias * logit_scale).to(out_ty).to(tl.float32)
        if u is None:
            u = _load_u(u_ptr, stride_ub, stride_uk, step, rows, vocab, o_b, m_b)
        logits = (u.to(tl.float32) + bias).to(out_ty).to(tl.float32)
        if HAS_D2T:
            target_ids = rows + _tile_d2t(d2t_ptr, rows, m_v, d2t_rows)
        else:
            target_ids = rows
        if STORE_LOGITS == 2:  # a compact draft-column buffer by batch row (head_walk expands it after the walk)
            tl.store(dl_ptr + o_b[None, :] * stride_dlr + step * stride_dlk + rows[:, None],
                     logits.to(dl_ptr.dtype.element_ty), mask=m_v[:, None] & valid[None, :])
        elif STORE_LOGITS:
            tl.store(dl_ptr + req_safe[None, :] * stride_dlr + step * stride_dlk + target_ids[:, None],
                     logits.to(dl_ptr.dtype.element_ty), mask=m_v[:, None] & valid[None, :])
        if SAMPLED:
            hot = temp != 0.0
            if noise is None:
                noise = _gumbel_noise(seed[None, :], pos[None, :], target_ids[:, None])
            scored = tl.where(hot[None, :], logits / tl.where(hot, temp, 1.0)[None, :] + noise, logits)
        else:
            scored = logits
        if KEY_BY_TARGET:
            ids = target_ids
        else:
            ids = rows
        if SPLIT:
            keys = scored
        else:
            scored = tl.where(m_v[:, None], scored, float("-inf"))
            # ids joined to an accumulator-shaped tensor, so the keys stay in the accumulator's layout (else Triton
            # moves the whole [rows, BP] key tile into the ids' layout through shared memory before reducing it).
            ids2d = ids[:, None] + (acc != acc).to(tl.int32)
            keys = _ordered_keys(scored, ids2d)
    return keys, ids


@triton.jit
def _tile_d2t(d2t_ptr, rows, m_v, d2t_rows=None):
    """The tile's d2t offsets (int32): preloaded ones, else a load."""
    if d2t_rows is None:
        offsets = tl.load(d2t_ptr + rows, mask=m_v, other=0).to(tl.int32)
    else:
        offsets = d2t_rows
    return offsets


@triton.jit
def _score_row(acc, u, rows, step, req_safe, valid, temp, seed, pos, u_ptr, stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr,
               stride_dlr, stride_dlk, logit_scale, vocab, o_b, SAMPLED: tl.constexpr, HAS_D2T: tl.constexpr,
               STORE_LOGITS: tl.constexpr, W2_SCALED: tl.constexpr, KEY_BY_TARGET: tl.constexpr,
               SCALED: tl.constexpr, d2t_rows=None, noise=None):
    """_score_tile for a walk of one batch row: [rows] keys. The accumulator is folded to its live column first
    (a column's 16 neighbours sit in one thread quad: shuffles only), so the rounding, the noise and the key
    reduction work on [rows] instead of [rows, BP], and the base logits come as a [rows] vector. noise: the row's
    [rows] noise from the table (None: computed here)."""
    m_v = rows < vocab
    acc = tl.sum(tl.where((o_b == 0)[None, :], acc, 0.0), axis=1)
    if W2_SCALED:
        acc = acc * tl.load(w2_scale_ptr + rows, mask=m_v, other=0.0)
    out_ty = u_ptr.dtype.element_ty
    bias = acc.to(out_ty).to(tl.float32)
    if SCALED:
        bias = (bias * logit_scale).to(out_ty).to(tl.float32)
    if u is None:
        u = _load_u_row(u_ptr, stride_uk, step, rows, vocab)
    logits = (u.to(tl.float32) + bias).to(out_ty).to(tl.float32)
    if HAS_D2T:
        target_ids = rows + _tile_d2t(d2t_ptr, rows, m_v, d2t_rows)
    else:
        target_ids = rows
    if STORE_LOGITS == 2:  # compact: draft columns of batch row 0 (where, not &: the interpreter rejects block & scalar)
        tl.store(dl_ptr + step * stride_dlk + rows, logits.to(dl_ptr.dtype.element_ty), mask=tl.where(valid, m_v, False))
    elif STORE_LOGITS:
        tl.store(dl_ptr + req_safe * stride_dlr + step * stride_dlk + target_ids, logits.to(dl_ptr.dtype.element_ty),
                 mask=tl.where(valid, m_v, False))
    if SAMPLED:
        hot = temp != 0.0
        if noise is None:
            scored = tl.where(hot, logits / tl.where(hot, temp, 1.0) + _gumbel_noise(seed, pos, target_ids), logits)
        else:
            scored = tl.where(hot, logits / tl.where(hot, temp, 1.0) + noise, logits)
    else:
        scored = logits
    scored = tl.where(m_v, scored, float("-inf"))
    if KEY_BY_TARGET:
        ids = target_ids
    else:
        ids = rows
    return _ordered_keys(scored, ids + (acc != acc).to(tl.int32))


@triton.jit
def _load_u_row(u_ptr, stride_uk, step, rows, vocab):
    """[rows] of the base logits U[0, step, rows]."""
    return tl.load(u_ptr + step * stride_uk + rows, mask=rows < vocab, other=0.0)


@triton.jit
def _fold(acc_keys, best, keys, KEYS_ONCE: tl.constexpr):
    """KEYS_ONCE: an elementwise running max, reduced once per step (no CTA-wide reduction per tile)."""
    if KEYS_ONCE:
        acc_keys = tl.maximum(acc_keys, keys)
    else:
        best = tl.maximum(best, tl.max(keys, axis=0))
    return acc_keys, best


@triton.jit
def _fold_split(run_v, run_id, scored, ids, ORDERED: tl.constexpr):
    """Running (value, id) max per element over a step's tiles, lowest id on equal values. ORDERED: every id of
    this tile is above every id already folded (tiles walked in row order, ids = rows), so a strict `>` keeps the
    lowest; else (target ids of a reduced vocabulary) equal values compare ids."""
    if ORDERED:
        take = scored > run_v
    else:
        take = (scored > run_v) | ((scored == run_v) & (ids[:, None] < run_id))
    return tl.where(take, scored, run_v), tl.where(take, ids[:, None], run_id)


@triton.jit
def _split_key(run_v, run_id, fallback_id, PAIR: tl.constexpr):
    """[BP] int64 keys from a running (value, id) max. PAIR: an fp32 max, then an int32 min of the ids holding it
    (two one-word reductions, where the int64 key needs a two-word shuffle and compare each level, but two
    CTA-wide rounds); else one int64 key per element, one reduction. A column whose max no id holds (all NaN)
    falls back to fallback_id, a valid token of the shard, never an id past the vocabulary."""
    if PAIR:
        vmax = tl.max(run_v, axis=0)
        ids = tl.min(tl.where(run_v == vmax[None, :], run_id, ID_MASK), axis=0)
        keys = _ordered_keys(vmax, tl.where(ids == ID_MASK, fallback_id, ids))
    else:
        keys = tl.max(_ordered_keys(run_v, tl.where(run_id == ID_MASK, fallback_id, run_id)), axis=0)
    return keys


@triton.jit
def _fold_streamed(stream_v, stream_id, stream_keys, best, tile_keys, tile_ids, fallback_id, SPLIT: tl.constexpr,
                   KEYS_ONCE: tl.constexpr, ORDERED: tl.constexpr, PAIR_REDUCE: tl.constexpr):
    """A scored streamed tile into the step's streamed-tile max: the running (value, id) max with SPLIT (stream_keys
    passed on), else the int64 keys (stream_v / stream_id passed on)."""
    if SPLIT:
        stream_v, stream_id = _fold_split(stream_v, stream_id, tile_keys, tile_ids, ORDERED)
        if not KEYS_ONCE:
            best = tl.maximum(best, _split_key(stream_v, stream_id, fallback_id, PAIR_REDUCE))
    else:
        stream_keys, best = _fold(stream_keys, best, tile_keys, KEYS_ONCE)
    return stream_v, stream_id, stream_keys, best


@triton.jit
def _step_seed(seed, step):
    """vLLM's spec_step_seed (naive.spec_step_seed): the draft step mixed into the request seed's high bits."""
    return seed ^ (tl.cast(step, tl.int64) << 32)


@triton.jit
def _tile_noise(seed0, step, pos_ptr, stride_pb, o_b, m_b, rows, d2t_ptr, vocab, anchor, HAS_D2T: tl.constexpr):
    """[rows, BP] Gumbel noise of `step` for these rows, exactly as _score_tile computes it inline (the same ops in
    the same order), so it can be computed a step ahead, while the exchange waits. anchor: None or a non-negative
    int32 [rows, BP] tensor in the accumulator's layout, joined to the ids (+ anchor >> 31, always 0) so the noise
    is computed in that layout (else Triton computes it in its own and moves both tiles through shared memory each
    step)."""
    seed = _step_seed(seed0, step)
    pos = tl.load(pos_ptr + o_b * stride_pb + step, mask=m_b, other=0).to(tl.int64) + DRAFT_NOISE_SALT
    if HAS_D2T:
        target_ids = rows + tl.load(d2t_ptr + rows, mask=rows < vocab, other=0).to(tl.int32)
    else:
        target_ids = rows
    ids = target_ids[:, None]
    if anchor is not None:
        ids = ids + (anchor >> 31)
    return _gumbel_noise(seed[None, :], pos[None, :], ids)


@triton.jit
def _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, step, rows, vocab, o_b, m_hot, ONE_ROW: tl.constexpr):
    """[rows, BP] of the noise table at `step` (0 where a row is greedy or padding: its score ignores it); one row:
    its [rows] (unmasked by the row: a greedy or padding row's score ignores whatever the table holds there). Creates
    no tensor, so the Gluon rows walk loads its [ST, BN] tiles with it too, in its accumulator's layout."""
    if ONE_ROW:
        noise = tl.load(nt_ptr + step * stride_ntk + rows, mask=rows < vocab, other=0.0)
    else:
        noise = tl.load(nt_ptr + step * stride_ntk + o_b[None, :] * stride_ntb + rows[:, None],
                        mask=(rows < vocab)[:, None] & m_hot[None, :], other=0.0)
    return noise


@triton.jit
def noise_table_kernel(nt_ptr, stride_ntk, stride_ntb, req_ptr, temp_ptr, seed_ptr, pos_ptr, stride_pb, d2t_ptr,
                       vocab, num_steps, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr, BLOCK: tl.constexpr):
    """Program (vocabulary block, batch row, step): the Gumbel noise the walk adds to that row's scores at that step,
    nt[k, b, v] = G(seed ^ k << 32, positions[b, k] + 2**30, target id of v), computed as _tile_noise computes it
    (the same function on the same values: bit-identical), for sampled rows only (greedy and padding rows are left
    as they are; the walk does not read them). The noise depends on no drawn token, so all of it can be made at once,
    at full occupancy, before the walk. The last steps are written first, so that the first steps, which the walk
    reads first, are the likeliest still in L2."""
    i_v, b, k = tl.program_id(0), tl.program_id(1), num_steps - 1 - tl.program_id(2)
    if HAS_REQ:
        req = tl.load(req_ptr + b).to(tl.int64)
    else:
        req = b.to(tl.int64)
    req_safe = tl.maximum(req, 0)
    temp = tl.load(temp_ptr + req_safe)
    if (req >= 0) & (temp != 0.0):
        rows = i_v * BLOCK + tl.arange(0, BLOCK)
        m_v = rows < vocab
        if HAS_D2T:
            ids = rows + _tile_d2t(d2t_ptr, rows, m_v)
        else:
            ids = rows
        seed = _step_seed(tl.load(seed_ptr + req_safe).to(tl.int64), k)
        pos = tl.load(pos_ptr + b * stride_pb + k).to(tl.int64) + DRAFT_NOISE_SALT
        noise = _gumbel_noise(seed, pos, ids)
        tl.store(nt_ptr + k * stride_ntk + b * stride_ntb + rows, noise, mask=m_v)


@triton.jit
def _row_requests(req_ptr, o_b, m_b, HAS_REQ: tl.constexpr):
    """(valid, req_safe) of the batch rows o_b (live where m_b): each row's request (req_ptr[b] with HAS_REQ, else b),
    valid where it is one (not -1, a padding row, nor past the live rows), and 0 where it is not, to index by. (Also
    the Gluon rows walk's: no tensor is created here, so it takes the caller's layout.)"""
    if HAS_REQ:
        req = tl.load(req_ptr + o_b, mask=m_b, other=-1).to(tl.int64)
    else:
        req = tl.where(m_b, o_b, -1).to(tl.int64)
    valid = req >= 0
    return valid, tl.where(valid, req, 0)


@triton.jit
def _load_u_tile(u_ptr, stride_ub, stride_uk, step, rows, vocab, o_b, m_b, ONE_ROW: tl.constexpr):
    if ONE_ROW:
        u = _load_u_row(u_ptr, stride_uk, step, rows, vocab)
    else:
        u = _load_u(u_ptr, stride_ub, stride_uk, step, rows, vocab, o_b, m_b)
    return u


@triton.jit
def _load_u(u_ptr, stride_ub, stride_uk, step, rows, vocab, o_b, m_b):
    """[rows, BP] of the base logits U[b, step, rows]; -inf past the vocabulary and in padding rows, so that those
    scores lose without a select per element."""
    return tl.load(u_ptr + o_b[None, :] * stride_ub + step * stride_uk + rows[:, None],
                   mask=(rows < vocab)[:, None] & m_b[None, :], other=float("-inf"))


@triton.jit
def _load_u_desc(u_desc, step, row0, rows, shard_end, BP: tl.constexpr, ST: tl.constexpr, ONE_ROW: tl.constexpr,
                 U_BITS: tl.constexpr):
    """A streamed tile's base logits through its tensor descriptor: [ST] of U[0] seen as [N, V] (one row), or
    [ST, BP] of U seen as [B, N, V]. The copy fills what lies past the tensor with zeros (padding batch rows,
    rows past the vocabulary): rows past the shard are set to -inf, as _load_u does, so they never win.

    One row copies boxes of at least 128 bytes (U_BOX_BYTES; walk._stream_descriptors makes them so): the ring
    Triton allocates for narrower boxes puts stages 64 bytes apart, and the TMA copy into such a stage faulted on
    the H200 (misaligned address, 32-row bf16 tiles). The tile is then the box's first ST entries."""
    if ONE_ROW:
        UW: tl.constexpr = ST if ST * U_BITS >= U_BOX_BITS else U_BOX_BITS // U_BITS
        if UW == ST:
            u = tl.reshape(u_desc.load([step, row0]), [ST])
        else:
            # One nonzero term per column: the sum is exact (x + 0 = x; a -0.0 turned +0.0 keys alike).
            box = tl.reshape(u_desc.load([step, row0]), [UW // ST, ST])
            u = tl.sum(tl.where((tl.arange(0, UW // ST) == 0)[:, None], box.to(tl.float32), 0.0), axis=0)
    else:
        u = tl.trans(tl.reshape(u_desc.load([0, step, row0]), [BP, ST]))
        u = tl.where((rows < shard_end)[:, None], u, float("-inf"))
    return u


@triton.jit
def _pick(keys_ptr, slot, o_b, m_b, d2t_ptr, NUM_PROGS: tl.constexpr, PP: tl.constexpr, BP: tl.constexpr,
          HAS_D2T: tl.constexpr, KEY_BY_TARGET: tl.constexpr):
    """Every program reduces all programs' keys the same way, so all agree on the token: [BP] target ids."""
    PCHUNK: tl.constexpr = 32 if PP > 32 else PP
    best = tl.full([BP], -9223372036854775807 - 1, dtype=tl.int64)
    for p0 in tl.static_range(0, PP, PCHUNK):
        o_p = p0 + tl.arange(0, PCHUNK)
        keys = tl.load(keys_ptr + slot * NUM_PROGS * BP + o_p[:, None] * BP + o_b[None, :],
                       mask=(o_p < NUM_PROGS)[:, None], other=-9223372036854775807 - 1, volatile=True)
        best = tl.maximum(best, tl.max(keys, axis=0))
    ids = ID_MASK - (best & ID_MASK)
    if HAS_D2T and not KEY_BY_TARGET:
        ids = ids + tl.load(d2t_ptr + ids, mask=m_b, other=0)
    return tl.where(m_b, ids, 0)


@triton.jit
def _winner_ids(best0, winners, o_b, m_b, d2t_ptr, HAS_D2T: tl.constexpr, KEY_BY_TARGET: tl.constexpr,
                KB: tl.constexpr):
    """[BP] target ids from the tagged exchange's winning keys (a scalar when KB = 1)."""
    if KB == 1:
        ids = tl.where(o_b == 0, ID_MASK - (best0 & ID_MASK), 0)
    else:
        ids = ID_MASK - (winners & ID_MASK)
    if HAS_D2T and not KEY_BY_TARGET:
        ids = ids + tl.load(d2t_ptr + ids, mask=m_b, other=0)
    return tl.where(m_b, ids, 0)


@triton.jit
def _resident_d2t(d2t_ptr, rows, shard_end):
    """A resident tile's d2t offsets (int32), read once a walk."""
    return _tile_d2t(d2t_ptr, rows, rows < shard_end)


@triton.jit
def _resident_tile(w2_ptr, stride_w2r, stride_w2v, rows, shard_end, o_r):
    return tl.load(w2_ptr + rows[:, None] * stride_w2v + o_r[None, :] * stride_w2r, mask=(rows < shard_end)[:, None],
                   other=0.0)


@triton.jit
def _prefetch_tile_l2(w2_ptr, stride_w2v, row0, shard_end, R: tl.constexpr, ST: tl.constexpr):
    """Rows [row0, min(row0 + ST, shard_end)) of a row-contiguous W2 into L2 with one bulk prefetch
    (cp.async.bulk.prefetch.L2, the copy engine's: nothing waits on it), issued by thread 0."""
    nbytes = (tl.minimum(shard_end - row0, ST) * R * (w2_ptr.dtype.element_ty.primitive_bitwidth // 8)).to(tl.int32)
    addr = (w2_ptr + row0.to(tl.int64) * stride_w2v).to(tl.int64, bitcast=True)
    tl.inline_asm_elementwise(
        """{
        .reg .pred %l2p;
        .reg .u32 %l2t;
        mov.u32 %l2t, %tid.x;
        setp.eq.u32 %l2p, %l2t, 0;
        setp.gt.and.s32 %l2p, $2, 0, %l2p;
        @%l2p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.u32 $0, 0;
        }""", "=r,l,r", [addr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def head_walk_kernel(
    u_ptr, stride_ub, stride_uk,
    w1_ptr, stride_w1,
    w2_ptr, stride_w2r, stride_w2v, w2_scale_ptr,
    first_ptr, tok_ptr, stride_tb,
    req_ptr, temp_ptr, seed_ptr, pos_ptr, stride_pb,
    d2t_ptr,
    dl_ptr, stride_dlr, stride_dlk,
    conf_h_ptr, conf_w_ptr, conf_ptr,
    gh_ptr, t1_ptr, stride_t1,
    hj_ptr, t3_ptr, stride_t3, ws_ptr,
    sb_ptr, ob_ptr,
    keys_ptr, count_ptr, gen_ptr, err_ptr,
    w2_desc, u_desc,
    num_rows, num_steps, vocab, logit_scale, k_begin, k_end,
    win_ptr, arrive_ptr,
    R: tl.constexpr, BP: tl.constexpr, RT: tl.constexpr, RES_TILES: tl.constexpr, ST: tl.constexpr, CHUNK_ROWS: tl.constexpr,
    NUM_PROGS: tl.constexpr, PP: tl.constexpr, HEAD: tl.constexpr,
    SAMPLED: tl.constexpr, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr, STORE_LOGITS: tl.constexpr,
    HAS_CONF: tl.constexpr, W2_SCALED: tl.constexpr, MULTI: tl.constexpr, DO_FINAL: tl.constexpr,
    SJ: tl.constexpr, SPIN_LIMIT: tl.constexpr, DOT_PRECISION: tl.constexpr, EXCHANGE: tl.constexpr,
    KEYS_ONCE: tl.constexpr, KB: tl.constexpr, PREFETCH: tl.constexpr, L1_PREFETCH: tl.constexpr,
    SCALED: tl.constexpr, SPLIT_KEYS: tl.constexpr, PAIR_REDUCE: tl.constexpr, NOISE_AHEAD_OPT: tl.constexpr,
    SPLIT_STREAMED: tl.constexpr, L2_PREFETCH: tl.constexpr, L2_BULK: tl.constexpr, STREAM_TMA: tl.constexpr,
    U_RING: tl.constexpr = True, WIN_STRIDE: tl.constexpr = 1, INLINE_PTX: tl.constexpr = True,
    D2T_INCREASING: tl.constexpr = False, D2T_HOIST: tl.constexpr = True,
    nt_ptr=None, stride_ntk=0, stride_ntb=0, NOISE_TABLE: tl.constexpr = False,
):
    # HEAD: 0 markov, 1 gated markov, 2 rnn. RES_TILES (0-4) tiles of RT rows stay resident; the rest of the
    # shard is streamed in ST-row tiles (smaller: each pipeline stage holds one in shared memory). Vectors over
    # the batch rows have BP entries; KB = 1 when the walk has one row (then scored as [rows] vectors, and the
    # tagged exchange polls one column), else BP. EXCHANGE (with MULTI): 0 counter barrier + key read, 1 flags
    # (row 0's key is the arrival flag), 2 tagged (every key its own flag, relaxed stores, per-thread spin),
    # 3 probe / 4 poll (tagged keys; B > 1: batched loads of every live key, after a column-0 spin for probe).
    # KEYS_ONCE: one CTA-wide key reduction per step instead of one per tile. PREFETCH: streamed tiles are
    # double-buffered in registers. L1_PREFETCH: the next U and the candidates' W1 rows into L1 (measured slower).
    # L2_PREFETCH > 0 (streamed tiles, with PREFETCH): the tile that many ahead is bulk-prefetched into L2 (the
    # next step's first tiles during this step's last ones); L2_BULK False (the interpreter: inline PTX) walks the
    # same loop without issuing the prefetches. STREAM_TMA = s > 0 (streamed tiles; w2_desc / u_desc are host
    # tensor descriptors): the streamed loop is a `tl.range(num_stages=s)` over tensor-descriptor loads, which
    # Triton pipelines into a ring of s shared-memory stages filled by TMA and waited on with mbarriers (tiles
    # i + 1 .. i + s - 1 in flight while tile i's wgmma runs; no register copy, no fence in front of the wgmma).
    # U_RING (with STREAM_TMA): the streamed tiles' base logits come through the ring too; else by pointer loads
    # issued at the top of each iteration (no second mbarrier wait, and no generic-to-async fence before the copy
    # that refills a base-logit stage).
    # EXCHANGE 5 "amax" (_exchange_amax; win_ptr: 3 winners slots of [BP] keys, WIN_STRIDE int64 apart; arrive_ptr:
    # its step counter): with MULTI the persistent exchange; without, the lockstep form (each launch reads the last
    # step's winners from their slot and folds its own keys into the next). INLINE_PTX: the arrival and the wait
    # in PTX (False: Triton atomics, for the interpreter). EXCHANGE 7 (with MULTI; the bench's sync floors only): no
    # exchange at all, each program walks its own shard's best (wrong tokens): the step without any exchange.
    # Sampled keys order by target id (vLLM's noised argmax breaks ties in target space). A greedy walk keys by draft
    # id and maps its winner through d2t after the exchange (a dependent load on every step's chain), unless the
    # host vouched that d2t increases (D2T_INCREASING): then target ids order as draft ids do and the keys carry them.
    KEY_BY_TARGET: tl.constexpr = SAMPLED or (HAS_D2T and D2T_INCREASING)
    FLAGS: tl.constexpr = MULTI and EXCHANGE == 1
    TAGGED: tl.constexpr = MULTI and EXCHANGE >= 2 and EXCHANGE <= 4
    AMAX: tl.constexpr = EXCHANGE == 5
    LOCAL: tl.constexpr = MULTI and EXCHANGE == 7
    # Exchanges that leave each step's winning keys in registers (`winners`, or `best0` for one row).
    WINNERS: tl.constexpr = TAGGED or (MULTI and AMAX) or LOCAL
    # Candidate W1 rows are prefetched by target id: greedy keys of a reduced vocabulary carry draft ids.
    PREFETCH_W1: tl.constexpr = L1_PREFETCH and not (HAS_D2T and not KEY_BY_TARGET)
    HAS_STREAM: tl.constexpr = CHUNK_ROWS > RES_TILES * RT
    ONE_ROW: tl.constexpr = KB == 1
    # Several rows: a running (value, id) max per element instead of int64 keys (_fold_split); ids ascend over
    # the tiles unless sampled keys order by the target ids of a reduced vocabulary.
    SPLIT: tl.constexpr = SPLIT_KEYS and not ONE_ROW
    SPLIT_STREAM: tl.constexpr = SPLIT and SPLIT_STREAMED
    ORDERED: tl.constexpr = not (HAS_D2T and KEY_BY_TARGET) or D2T_INCREASING
    # Batched exchanges (probe / poll), fully resident shards: the noise of step k + 1 is computed while step k's
    # first key reads are in flight (with streamed tiles too the carried noise spills: triton 3.6, 152k).
    # NOISE_TABLE (sampled): the resident tiles' Gumbel noise is loaded from nt_ptr ([N, B, V] fp32,
    # noise_table_kernel's output, written before the walk) at the step's top, beside the base logits, instead of
    # computed while scoring; a streamed tile's beside its W2 rows (NOISE_TABLE_STREAM).
    NOISE_TABLE_ON: tl.constexpr = NOISE_TABLE and SAMPLED
    NOISE_TABLE_STREAM: tl.constexpr = NOISE_TABLE_ON and HAS_STREAM
    NOISE_AHEAD: tl.constexpr = (not NOISE_TABLE_ON and NOISE_AHEAD_OPT and SAMPLED and TAGGED
                                 and (EXCHANGE == 3 or EXCHANGE == 4)
                                 and SPLIT and KEYS_ONCE and RES_TILES >= 1 and not HAS_STREAM)
    pid = tl.program_id(0)
    o_b = tl.arange(0, BP)
    m_b = o_b < num_rows
    o_r = tl.arange(0, R)
    o_t = tl.arange(0, RT)
    shard_begin = pid * CHUNK_ROWS
    shard_end = tl.minimum(shard_begin + CHUNK_ROWS, vocab)
    w2_dot_ty = w2_ptr.dtype.element_ty
    if W2_SCALED:
        w2_dot_ty = tl.bfloat16

    valid, req_safe = _row_requests(req_ptr, o_b, m_b, HAS_REQ)
    temp = tl.full([BP], 0.0, dtype=tl.float32)
    seed0 = tl.full([BP], 0, dtype=tl.int64)
    if SAMPLED:
        temp = tl.load(temp_ptr + req_safe, mask=valid, other=0.0).to(tl.float32)
        seed0 = tl.load(seed_ptr + req_safe, mask=valid, other=0).to(tl.int64)
    if ONE_ROW:
        # One batch row: its request's scalars stand in for the [BP] vectors (_score_row).
        if HAS_REQ:
            req_safe = tl.load(req_ptr).to(tl.int64)
            valid = req_safe >= 0
            req_safe = tl.where(valid, req_safe, 0)
        else:
            req_safe = tl.full([], 0, dtype=tl.int64)
            valid = tl.full([], 1, dtype=tl.int1)
        temp = tl.full([], 0.0, dtype=tl.float32)
        seed0 = tl.full([], 0, dtype=tl.int64)
        if SAMPLED:
            temp = tl.load(temp_ptr + req_safe, mask=valid, other=0.0).to(tl.float32)
            seed0 = tl.load(seed_ptr + req_safe, mask=valid, other=0).to(tl.int64)

    # Resident tiles: loaded once, loop-invariant dot operands for every step (Triton keeps them in shared memory).
    if RES_TILES >= 1:
        w_res0 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + o_t, shard_end, o_r)
    if RES_TILES >= 2:
        w_res1 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + RT + o_t, shard_end, o_r)
    if RES_TILES >= 3:
        w_res2 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + 2 * RT + o_t, shard_end, o_r)
    if RES_TILES >= 4:
        w_res3 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + 3 * RT + o_t, shard_end, o_r)
    # ... and, for several rows, their d2t offsets (a reduced draft vocabulary): read once, not on every step's chain.
    # (None where there is no d2t or no such tile: _score_tile then loads nothing, or its own. One row: its [rows]
    # vector sits in another layout than the preload's, and converting it each step cost more than the load: triton
    # 3.6, 32k b1 sampled 1,352 -> 1,640 instructions.)
    HOIST_D2T: tl.constexpr = HAS_D2T and not ONE_ROW and D2T_HOIST
    d2t_r0 = _resident_d2t(d2t_ptr, shard_begin + o_t, shard_end) if HOIST_D2T and RES_TILES >= 1 else None
    d2t_r1 = _resident_d2t(d2t_ptr, shard_begin + RT + o_t, shard_end) if HOIST_D2T and RES_TILES >= 2 else None
    d2t_r2 = _resident_d2t(d2t_ptr, shard_begin + 2 * RT + o_t, shard_end) if HOIST_D2T and RES_TILES >= 3 else None
    d2t_r3 = _resident_d2t(d2t_ptr, shard_begin + 3 * RT + o_t, shard_end) if HOIST_D2T and RES_TILES >= 4 else None
    stream_begin = shard_begin + RES_TILES * RT
    o_s = tl.arange(0, ST)
    STREAM_PREFETCH: tl.constexpr = HAS_STREAM and PREFETCH and STREAM_TMA == 0
    # The streamed loop by tile index, for the L2 prefetch.
    STREAM_L2: tl.constexpr = STREAM_PREFETCH and L2_PREFETCH > 0
    n_stream = tl.cdiv(shard_end - stream_begin, ST)
    if STREAM_L2 and L2_BULK:
        for jp in tl.static_range(L2_PREFETCH):
            if jp < n_stream:
                _prefetch_tile_l2(w2_ptr, stride_w2v, stream_begin + jp * ST, shard_end, R, ST)
    if STREAM_PREFETCH:
        w_next = _resident_tile(w2_ptr, stride_w2r, stride_w2v, stream_begin + o_s, shard_end, o_r)
        u_next = _load_u_tile(u_ptr, stride_ub, stride_uk, tl.minimum(k_begin, num_steps - 1), stream_begin + o_s,
                              shard_end, o_b, m_b, ONE_ROW)

    if FLAGS or TAGGED:
        gen = tl.load(gen_ptr + pid)
    if AMAX:
        # Fewer than NUM_PROGS arrivals of this launch can precede this read (this program has not arrived), so
        # every program finds the same epoch.
        epoch0 = tl.load(arrive_ptr, volatile=True) // NUM_PROGS
        if not MULTI and pid == 0:
            # Lockstep: this launch reads slot epoch0 - 1 and fills slot epoch0; nobody touches epoch0 + 1's.
            _clear_winners(win_ptr, (epoch0 + 1) % 3, o_b, BP, WIN_STRIDE)

    if k_begin == 0:
        x = tl.load(first_ptr + o_b, mask=m_b, other=0).to(tl.int64)
        x0 = tl.load(first_ptr).to(tl.int64)
    else:
        if AMAX:
            # (epoch0 + 2) % 3: the slot of epoch0 - 1, the last launch's step.
            x = _winner_ids(None, _read_winners(win_ptr, (epoch0 + 2) % 3, o_b, m_b, BP, WIN_STRIDE), o_b, m_b, d2t_ptr,
                            HAS_D2T, KEY_BY_TARGET, BP)
        else:
            x = _pick(keys_ptr, (k_begin - 1) % 2, o_b, m_b, d2t_ptr, NUM_PROGS, PP, BP, HAS_D2T, KEY_BY_TARGET)
        x0 = tl.sum(tl.where(o_b == 0, x, 0), axis=0)
        if pid == 0:
            tl.store(tok_ptr + o_b * stride_tb + (k_begin - 1), x, mask=m_b)

    best0 = tl.full([], -9223372036854775807 - 1, dtype=tl.int64)
    winners = tl.full([BP], -9223372036854775807 - 1, dtype=tl.int64)
    if HAS_D2T and KEY_BY_TARGET:
        fallback_id = shard_begin + tl.load(d2t_ptr + shard_begin).to(tl.int32)
    else:
        fallback_id = shard_begin
    nz0 = None
    nz1 = None
    nz2 = None
    nz3 = None
    if NOISE_AHEAD:
        k_first = tl.minimum(k_begin, num_steps - 1)
        nz0 = _tile_noise(seed0, k_first, pos_ptr, stride_pb, o_b, m_b, shard_begin + o_t, d2t_ptr, shard_end, None,
                          HAS_D2T)
        if RES_TILES >= 2:
            nz1 = _tile_noise(seed0, k_first, pos_ptr, stride_pb, o_b, m_b, shard_begin + RT + o_t, d2t_ptr,
                              shard_end, None, HAS_D2T)
        if RES_TILES >= 3:
            nz2 = _tile_noise(seed0, k_first, pos_ptr, stride_pb, o_b, m_b, shard_begin + 2 * RT + o_t, d2t_ptr,
                              shard_end, None, HAS_D2T)
        if RES_TILES >= 4:
            nz3 = _tile_noise(seed0, k_first, pos_ptr, stride_pb, o_b, m_b, shard_begin + 3 * RT + o_t, d2t_ptr,
                              shard_end, None, HAS_D2T)
    for k in range(k_begin, k_end):
        if k > k_begin and WINNERS and ONE_ROW:
            # The winner is a scalar every thread holds: no vector of ids, no layout conversion before the gather.
            x0 = ID_MASK - (best0 & ID_MASK)
            if HAS_D2T and not KEY_BY_TARGET:
                x0 = x0 + tl.load(d2t_ptr + x0)
            x = tl.where(o_b == 0, x0, 0)
            if pid == 0:
                tl.store(tok_ptr + (k - 1), x0)
        elif k > k_begin:
            if WINNERS:
                x = _winner_ids(best0, winners, o_b, m_b, d2t_ptr, HAS_D2T, KEY_BY_TARGET, KB)
            elif FLAGS and num_rows == 1:
                x0 = ID_MASK - (best0 & ID_MASK)
                if HAS_D2T and not KEY_BY_TARGET:
                    x0 = x0 + tl.load(d2t_ptr + x0)
                x = tl.where(o_b == 0, x0, 0)
            else:
                x = _pick(keys_ptr, (k - 1) % 2, o_b, m_b, d2t_ptr, NUM_PROGS, PP, BP, HAS_D2T, KEY_BY_TARGET)
            if pid == 0:
                tl.store(tok_ptr + o_b * stride_tb + (k - 1), x, mask=m_b)
            if ONE_ROW and not FLAGS:
                # (flags with one row has x0 already, from its flags)
                x0 = tl.sum(tl.where(o_b == 0, x, 0), axis=0)
        # Base logits of the resident tiles, issued beside the W1 gather so their latency hides behind it. (A
        # prefetch one step ahead, carried through the loop, made Triton convert them to the accumulator's
        # layout through shared memory every step: 2-4 more CTA-wide syncs on the step chain.)
        if RES_TILES >= 1:
            u_res0 = _load_u_tile(u_ptr, stride_ub, stride_uk, k, shard_begin + o_t, shard_end, o_b, m_b, ONE_ROW)
        if RES_TILES >= 2:
            u_res1 = _load_u_tile(u_ptr, stride_ub, stride_uk, k, shard_begin + RT + o_t, shard_end, o_b, m_b, ONE_ROW)
        if RES_TILES >= 3:
            u_res2 = _load_u_tile(u_ptr, stride_ub, stride_uk, k, shard_begin + 2 * RT + o_t, shard_end, o_b, m_b,
                                  ONE_ROW)
        if RES_TILES >= 4:
            u_res3 = _load_u_tile(u_ptr, stride_ub, stride_uk, k, shard_begin + 3 * RT + o_t, shard_end, o_b, m_b,
                                  ONE_ROW)
        # This step's noise tiles: computed ahead (nz*), loaded from the table or None (computed while scoring).
        sn0 = nz0
        sn1 = nz1
        sn2 = nz2
        sn3 = nz3
        m_hot = m_b
        if NOISE_TABLE_ON and not ONE_ROW:  # (one row: the table's loads are not masked by the row)
            m_hot = m_b & (temp != 0.0)
        if NOISE_TABLE_ON:
            # The table's tiles travel beside the base logits and the W1 gather (none of them waits on another).
            if RES_TILES >= 1:
                sn0 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, shard_begin + o_t, shard_end, o_b, m_hot,
                                       ONE_ROW)
            if RES_TILES >= 2:
                sn1 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, shard_begin + RT + o_t, shard_end, o_b,
                                       m_hot, ONE_ROW)
            if RES_TILES >= 3:
                sn2 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, shard_begin + 2 * RT + o_t, shard_end,
                                       o_b, m_hot, ONE_ROW)
            if RES_TILES >= 4:
                sn3 = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, shard_begin + 3 * RT + o_t, shard_end,
                                       o_b, m_hot, ONE_ROW)
        if ONE_ROW:
            # [R, BP]: W1[x] in column 0, gathered from a scalar address.
            e = tl.load(w1_ptr + x0 * stride_w1 + o_r[:, None] + 0 * o_b[None, :], mask=(o_b == 0)[None, :],
                        other=0.0).to(tl.float32)
        else:
            # [R, BP]: W1[x] of every row, transposed for the [rows, r] @ [r, BP] products.
            e = tl.load(w1_ptr + x[None, :] * stride_w1 + o_r[:, None], mask=m_b[None, :], other=0.0).to(tl.float32)
        if HAS_CONF:
            if pid == 0:
                wc = tl.load(conf_w_ptr + o_r)
                ch = tl.load(conf_h_ptr + o_b * num_steps + k, mask=m_b, other=0.0)
                tl.store(conf_ptr + o_b * num_steps + k, tl.sigmoid(ch + tl.sum(e * wc[:, None], axis=0)), mask=m_b)
        if HEAD == 0:
            m = e
        elif HEAD == 1:
            gh = tl.load(gh_ptr + (o_b[None, :] * num_steps + k) * R + o_r[:, None], mask=m_b[None, :], other=0.0)
            ge = tl.load(t1_ptr + x[None, :] * stride_t1 + o_r[:, None]).to(tl.float32)
            m = tl.sigmoid(gh + ge) * e
        else:
            # RNN: the program advances its SJ dims of the state (all of them, SJ at a time, without grid
            # barriers), publishes them, and everyone reads the whole new state back.
            if MULTI:
                j_lo = pid * SJ
                j_hi = j_lo + SJ
            else:
                j_lo = 0
                j_hi = R
            if k > 0:
                s_full = tl.load(sb_ptr + ((k - 1) % 2) * BP * R + o_b[:, None] * R + o_r[None, :], volatile=True)
            else:
                s_full = tl.full([BP, R], 0.0, dtype=tl.float32)
            hj_row = hj_ptr + (o_b[:, None] * num_steps + k) * (3 * R)
            t3_row = t3_ptr + x[:, None] * stride_t3
            for j0 in range(j_lo, j_hi, SJ):
                o_j = j0 + tl.arange(0, SJ)
                m_j = o_j < R
                mj = m_b[:, None] & m_j[None, :]
                ws_g = tl.load(ws_ptr + o_j[None, :] * R + o_r[:, None], mask=m_j[None, :], other=0.0)
                ws_c = tl.load(ws_ptr + (R + o_j[None, :]) * R + o_r[:, None], mask=m_j[None, :], other=0.0)
                ws_o = tl.load(ws_ptr + (2 * R + o_j[None, :]) * R + o_r[:, None], mask=m_j[None, :], other=0.0)
                if k > 0:
                    s_mine = tl.load(sb_ptr + ((k - 1) % 2) * BP * R + o_b[:, None] * R + o_j[None, :], mask=mj,
                                     other=0.0, volatile=True)
                else:
                    s_mine = tl.full([BP, SJ], 0.0, dtype=tl.float32)
                pre_g = tl.dot(s_full, ws_g, input_precision="ieee") \
                    + tl.load(hj_row + o_j[None, :], mask=mj, other=0.0) \
                    + tl.load(t3_row + o_j[None, :], mask=mj, other=0.0).to(tl.float32)
                pre_c = tl.dot(s_full, ws_c, input_precision="ieee") \
                    + tl.load(hj_row + R + o_j[None, :], mask=mj, other=0.0) \
                    + tl.load(t3_row + R + o_j[None, :], mask=mj, other=0.0).to(tl.float32)
                pre_o = tl.dot(s_full, ws_o, input_precision="ieee") \
                    + tl.load(hj_row + 2 * R + o_j[None, :], mask=mj, other=0.0) \
                    + tl.load(t3_row + 2 * R + o_j[None, :], mask=mj, other=0.0).to(tl.float32)
                gate = tl.sigmoid(pre_g)
                s_new = gate * s_mine + (1.0 - gate) * _tanh(pre_c)
                tl.store(sb_ptr + (k % 2) * BP * R + o_b[:, None] * R + o_j[None, :], s_new, mask=mj)
                tl.store(ob_ptr + (k % 2) * BP * R + o_b[:, None] * R + o_j[None, :], _tanh(pre_o), mask=mj)
            if MULTI:
                _grid_barrier(count_ptr, err_ptr, NUM_PROGS, SPIN_LIMIT)
            else:
                tl.debug_barrier()
            m = tl.load(ob_ptr + (k % 2) * BP * R + o_b[None, :] * R + o_r[:, None], volatile=True)
        m_dot = m.to(w2_dot_ty)

        seed = seed0
        # Placeholders where the streamed tiles keep int64 keys (_fold_streamed passes them on unused).
        stream_v = tl.full([], 0.0, dtype=tl.float32)
        stream_id = tl.full([], 0, dtype=tl.int32)
        if ONE_ROW:
            pos = tl.full([], 0, dtype=tl.int64)
            if SAMPLED:
                pos = tl.load(pos_ptr + k).to(tl.int64) + DRAFT_NOISE_SALT
            best = tl.full([], -9223372036854775807 - 1, dtype=tl.int64)
            res_keys = tl.full([RT], -9223372036854775807 - 1, dtype=tl.int64)
            stream_keys = tl.full([ST], -9223372036854775807 - 1, dtype=tl.int64)
        else:
            pos = tl.full([BP], 0, dtype=tl.int64)
            if SAMPLED and not NOISE_AHEAD:
                pos = tl.load(pos_ptr + o_b * stride_pb + k, mask=m_b, other=0).to(tl.int64) + DRAFT_NOISE_SALT
            best = tl.full([BP], -9223372036854775807 - 1, dtype=tl.int64)
            res_keys = tl.full([RT, BP], -9223372036854775807 - 1, dtype=tl.int64)
            stream_keys = tl.full([ST, BP], -9223372036854775807 - 1, dtype=tl.int64)
            if SPLIT_STREAM:
                # Streamed tiles start from (-inf, no id). An element that stays -inf keeps no id: if its whole
                # column is -inf, _split_key's fallback (the shard's first row) is that column's lowest row.
                stream_v = tl.full([ST, BP], float("-inf"), dtype=tl.float32)
                stream_id = tl.full([ST, BP], ID_MASK, dtype=tl.int32)
        if SAMPLED:
            seed = _step_seed(seed0, k)
        if RES_TILES >= 1:
            keys, ids = _score_tile(
                w_res0, u_res0, sn0, m_dot, shard_begin + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr,
                stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, shard_end,
                SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED, SPLIT,
                d2t_rows=d2t_r0)
            if SPLIT:
                # The first tile starts the running max as it is (no -inf start, so no id is ever missing).
                res_v = keys
                if NOISE_AHEAD:
                    # Ids selected by the scores (a NaN holds none): in the accumulator's layout even with one
                    # tile, where they anchor the noise computed ahead.
                    res_id = tl.where(keys == keys, ids[:, None], ID_MASK)
                else:
                    res_id = ids[:, None] + tl.zeros([RT, BP], dtype=tl.int32)
            else:
                res_keys, best = _fold(res_keys, best, keys, KEYS_ONCE)
        if RES_TILES >= 2:
            keys, ids = _score_tile(
                w_res1, u_res1, sn1, m_dot, shard_begin + RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos,
                u_ptr, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                SPLIT, d2t_rows=d2t_r1)
            if SPLIT:
                res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
            else:
                res_keys, best = _fold(res_keys, best, keys, KEYS_ONCE)
        if RES_TILES >= 3:
            keys, ids = _score_tile(
                w_res2, u_res2, sn2, m_dot, shard_begin + 2 * RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos,
                u_ptr, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                SPLIT, d2t_rows=d2t_r2)
            if SPLIT:
                res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
            else:
                res_keys, best = _fold(res_keys, best, keys, KEYS_ONCE)
        if RES_TILES >= 4:
            keys, ids = _score_tile(
                w_res3, u_res3, sn3, m_dot, shard_begin + 3 * RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos,
                u_ptr, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                SPLIT, d2t_rows=d2t_r3)
            if SPLIT:
                res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
            else:
                res_keys, best = _fold(res_keys, best, keys, KEYS_ONCE)
        if SPLIT and not KEYS_ONCE and RES_TILES >= 1:
            best = tl.maximum(best, _split_key(res_v, res_id, fallback_id, PAIR_REDUCE))
        if HAS_STREAM and STREAM_TMA > 0:
            for j in tl.range(0, n_stream, num_stages=STREAM_TMA):
                row0 = stream_begin + j * ST
                rows = row0 + o_s
                if L2_PREFETCH > 0 and L2_BULK:
                    # The tile L2_PREFETCH ahead (wrapping: the next step reads the same tiles) into L2, so the
                    # next step's first copies, issued after its exchange, find their bytes there.
                    ahead = j + L2_PREFETCH
                    j_ahead = tl.where(ahead < n_stream, ahead, ahead - n_stream)
                    _prefetch_tile_l2(w2_ptr, stride_w2v, tl.where(ahead < 2 * n_stream, stream_begin + j_ahead * ST,
                                                                   shard_end), shard_end, R, ST)
                if not U_RING:
                    u_tile = _load_u_tile(u_ptr, stride_ub, stride_uk, k, rows, shard_end, o_b, m_b, ONE_ROW)
                w = w2_desc.load([row0, 0])
                if U_RING:
                    u_tile = _load_u_desc(u_desc, k, row0, rows, shard_end, BP, ST, ONE_ROW,
                                          u_ptr.dtype.element_ty.primitive_bitwidth)
                st_noise = None
                if NOISE_TABLE_STREAM:
                    st_noise = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, rows, shard_end, o_b, m_hot,
                                                ONE_ROW)
                tile_keys, tile_ids = _score_tile(
                    w, u_tile, st_noise, m_dot, rows, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr, stride_ub,
                    stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, shard_end,
                    SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                    SPLIT_STREAM)
                stream_v, stream_id, stream_keys, best = _fold_streamed(
                    stream_v, stream_id, stream_keys, best, tile_keys, tile_ids, fallback_id, SPLIT_STREAM, KEYS_ONCE,
                    ORDERED, PAIR_REDUCE)
        elif STREAM_L2:
            # As the STREAM_PREFETCH loop below, by tile index: the tile after the last one is the next step's
            # first, and L2_PREFETCH tiles further on are on their way into L2.
            for j in range(0, n_stream):
                rows = stream_begin + j * ST + o_s
                w = w_next
                u_tile = u_next
                last = j + 1 == n_stream
                j_next = tl.where(last, 0, j + 1)
                k_next = tl.where(last, tl.minimum(k + 1, num_steps - 1), k)
                rows_next = stream_begin + j_next * ST + o_s
                ahead = j + L2_PREFETCH
                j_ahead = tl.where(ahead < n_stream, ahead, ahead - n_stream)
                if L2_BULK and ahead < 2 * n_stream:
                    _prefetch_tile_l2(w2_ptr, stride_w2v, stream_begin + j_ahead * ST, shard_end, R, ST)
                w_next = _resident_tile(w2_ptr, stride_w2r, stride_w2v, rows_next, shard_end, o_r)
                u_next = _load_u_tile(u_ptr, stride_ub, stride_uk, k_next, rows_next, shard_end, o_b, m_b, ONE_ROW)
                st_noise = None
                if NOISE_TABLE_STREAM:
                    st_noise = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, rows, shard_end, o_b, m_hot,
                                                ONE_ROW)
                tile_keys, tile_ids = _score_tile(
                    w, u_tile, st_noise, m_dot, rows, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr, stride_ub,
                    stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, shard_end,
                    SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                    SPLIT_STREAM)
                stream_v, stream_id, stream_keys, best = _fold_streamed(
                    stream_v, stream_id, stream_keys, best, tile_keys, tile_ids, fallback_id, SPLIT_STREAM, KEYS_ONCE,
                    ORDERED, PAIR_REDUCE)
        elif STREAM_PREFETCH:
            # Streamed tiles double-buffered in registers: tile i + 1 (W2 and U) is in flight while tile i is
            # scored, and the step's first tile was loaded before the previous exchange.
            for row0 in range(stream_begin, shard_end, ST):
                rows = row0 + tl.arange(0, ST)
                w = w_next
                u_tile = u_next
                w_next = _resident_tile(w2_ptr, stride_w2r, stride_w2v, rows + ST, shard_end, o_r)
                u_next = _load_u_tile(u_ptr, stride_ub, stride_uk, k, rows + ST, shard_end, o_b, m_b, ONE_ROW)
                st_noise = None
                if NOISE_TABLE_STREAM:
                    st_noise = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, rows, shard_end, o_b, m_hot,
                                                ONE_ROW)
                tile_keys, tile_ids = _score_tile(
                    w, u_tile, st_noise, m_dot, rows, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr, stride_ub,
                    stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, shard_end,
                    SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                    SPLIT_STREAM)
                stream_v, stream_id, stream_keys, best = _fold_streamed(
                    stream_v, stream_id, stream_keys, best, tile_keys, tile_ids, fallback_id, SPLIT_STREAM, KEYS_ONCE,
                    ORDERED, PAIR_REDUCE)
            k_ahead = tl.minimum(k + 1, num_steps - 1)
            w_next = _resident_tile(w2_ptr, stride_w2r, stride_w2v, stream_begin + o_s, shard_end, o_r)
            u_next = _load_u_tile(u_ptr, stride_ub, stride_uk, k_ahead, stream_begin + o_s, shard_end, o_b, m_b,
                                  ONE_ROW)
        else:
            for row0 in range(stream_begin, shard_end, ST):
                rows = row0 + tl.arange(0, ST)
                w = _resident_tile(w2_ptr, stride_w2r, stride_w2v, rows, shard_end, o_r)
                st_noise = None
                if NOISE_TABLE_STREAM:
                    st_noise = _load_noise_tile(nt_ptr, stride_ntk, stride_ntb, k, rows, shard_end, o_b, m_hot,
                                                ONE_ROW)
                tile_keys, tile_ids = _score_tile(
                    w, None, st_noise, m_dot, rows, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_ptr, stride_ub,
                    stride_uk, w2_scale_ptr, d2t_ptr, dl_ptr, stride_dlr, stride_dlk, logit_scale, shard_end,
                    SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, ONE_ROW, SCALED,
                    SPLIT_STREAM)
                stream_v, stream_id, stream_keys, best = _fold_streamed(
                    stream_v, stream_id, stream_keys, best, tile_keys, tile_ids, fallback_id, SPLIT_STREAM, KEYS_ONCE,
                    ORDERED, PAIR_REDUCE)
        if KEYS_ONCE:
            if SPLIT:
                if RES_TILES >= 1:
                    best = tl.maximum(best, _split_key(res_v, res_id, fallback_id, PAIR_REDUCE))
            elif RES_TILES >= 1:
                best = tl.maximum(best, tl.max(res_keys, axis=0))
            if HAS_STREAM and SPLIT_STREAM:
                best = tl.maximum(best, _split_key(stream_v, stream_id, fallback_id, PAIR_REDUCE))
            elif HAS_STREAM:
                best = tl.maximum(best, tl.max(stream_keys, axis=0))
        if ONE_ROW:
            best = tl.where(o_b == 0, best, -9223372036854775807 - 1)
        if L1_PREFETCH and MULTI:
            # The next step's base logits into L1 while the programs meet: its loads, beside the W1 gather, hit.
            k_ahead = tl.minimum(k + 1, num_steps - 1)
            for i in tl.static_range(RES_TILES):
                _prefetch_u_l1(u_ptr, stride_ub, stride_uk, k_ahead, shard_begin + i * RT, shard_end, num_rows, RT,
                               BP, ONE_ROW)
        if TAGGED:
            tag = (((gen + k) % 16383) + 1).to(tl.int32)
            _publish_tagged(keys_ptr, k % 2, pid, best, tag, NUM_PROGS, BP)
            first = None
            if NOISE_AHEAD:
                # The next step's noise does not depend on this step's token: computed while the exchange's first
                # reads travel (the last program to publish would otherwise pay both one after the other).
                first = _exchange_first(keys_ptr, k % 2, pid, tag, num_rows, NUM_PROGS, PP, BP, EXCHANGE)
                # A branch ptxas keeps: its scheduler would otherwise sink the first reads below the noise,
                # next to their use (num_rows > 0 always holds in a launch).
                if num_rows > 0:
                    k_ahead = tl.minimum(k + 1, num_steps - 1)
                    nz0 = _tile_noise(seed0, k_ahead, pos_ptr, stride_pb, o_b, m_b, shard_begin + o_t, d2t_ptr,
                                      shard_end, res_id, HAS_D2T)
                    if RES_TILES >= 2:
                        nz1 = _tile_noise(seed0, k_ahead, pos_ptr, stride_pb, o_b, m_b, shard_begin + RT + o_t, d2t_ptr,
                                          shard_end, res_id, HAS_D2T)
                    if RES_TILES >= 3:
                        nz2 = _tile_noise(seed0, k_ahead, pos_ptr, stride_pb, o_b, m_b, shard_begin + 2 * RT + o_t,
                                          d2t_ptr, shard_end, res_id, HAS_D2T)
                    if RES_TILES >= 4:
                        nz3 = _tile_noise(seed0, k_ahead, pos_ptr, stride_pb, o_b, m_b, shard_begin + 3 * RT + o_t,
                                          d2t_ptr, shard_end, res_id, HAS_D2T)
            if KB == 1:
                best0 = _exchange_tagged(keys_ptr, k % 2, pid, o_b, tag, None, err_ptr, num_rows, w1_ptr,
                                         stride_w1, NUM_PROGS, PP, BP, KB, EXCHANGE, PREFETCH_W1, R, SPIN_LIMIT)
            else:
                winners = _exchange_tagged(keys_ptr, k % 2, pid, o_b, tag, first, err_ptr, num_rows, w1_ptr,
                                           stride_w1, NUM_PROGS, PP, BP, KB, EXCHANGE, PREFETCH_W1, R, SPIN_LIMIT)
        elif AMAX and MULTI:
            winners = _exchange_amax(win_ptr, arrive_ptr, err_ptr, epoch0 + (k - k_begin), pid, best, o_b, m_b,
                                     NUM_PROGS, BP, WIN_STRIDE, SPIN_LIMIT, INLINE_PTX)
            if ONE_ROW:
                best0 = tl.sum(tl.where(o_b == 0, winners, 0), axis=0)
        elif LOCAL:
            winners = best
            if ONE_ROW:
                best0 = tl.max(best, axis=0)
        elif AMAX:
            # Lockstep: the launch boundary is the barrier; the next launch reads this slot.
            _fold_winners(win_ptr, epoch0 % 3, best, o_b, m_b, BP, WIN_STRIDE)
            tl.atomic_add(arrive_ptr, 1, sem="relaxed", scope="gpu")
        elif FLAGS:
            tag = (((gen + k) % 16383) + 1).to(tl.int32)
            best0 = _publish_and_wait(keys_ptr, k % 2, pid, o_b, best, tag, num_rows, err_ptr, NUM_PROGS, PP, BP,
                                      SPIN_LIMIT)
        else:
            tl.store(keys_ptr + (k % 2) * NUM_PROGS * BP + pid * BP + o_b, best)
            if MULTI:
                _grid_barrier(count_ptr, err_ptr, NUM_PROGS, SPIN_LIMIT)
            else:
                tl.debug_barrier()

    if FLAGS or TAGGED:
        tl.store(gen_ptr + pid, gen + (k_end - k_begin))
    if DO_FINAL and WINNERS:
        x = _winner_ids(best0, winners, o_b, m_b, d2t_ptr, HAS_D2T, KEY_BY_TARGET, KB)
        if pid == 0:
            tl.store(tok_ptr + o_b * stride_tb + (num_steps - 1), x, mask=m_b)
    elif DO_FINAL:
        x = _pick(keys_ptr, (num_steps - 1) % 2, o_b, m_b, d2t_ptr, NUM_PROGS, PP, BP, HAS_D2T, KEY_BY_TARGET)
        if pid == 0:
            tl.store(tok_ptr + o_b * stride_tb + (num_steps - 1), x, mask=m_b)


@triton.jit
def expand_draft_logits_kernel(compact_ptr, stride_cb, stride_ck, cache_ptr, stride_cr, stride_cs, req_ptr, t2d_ptr,
                               target_vocab, HAS_REQ: tl.constexpr, BLOCK: tl.constexpr):
    """Program (target column block, step, batch row): one step's row of the draft-logits cache, BLOCK target
    columns, written whole: the logit of the draft id mapped there (t2d >= 0, from the walk's compact [B, N, V]
    buffer), -inf at the other columns (what vLLM's own walk writes there). Whole 32-byte sectors: a walk that wrote
    only the draft ids' scattered target columns left partial sectors that HBM rewrites read-modify-write."""
    i_c, k, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    if HAS_REQ:
        req = tl.load(req_ptr + b).to(tl.int64)
    else:
        req = b
    if req >= 0:  # -1: a padding row
        cols = i_c * BLOCK + tl.arange(0, BLOCK)
        m = cols < target_vocab
        draft = tl.load(t2d_ptr + cols, mask=m, other=-1)
        vals = tl.load(compact_ptr + b * stride_cb + k * stride_ck + draft, mask=draft >= 0, other=float("-inf"))
        tl.store(cache_ptr + req * stride_cr + k * stride_cs + cols, vals, mask=m)

