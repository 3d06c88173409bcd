"""The top-k walk's candidates: the K largest logits of every (row, step), the set torch.topk returns, faster.

torch.topk over DSpark's [B * N, V] base logits took most of the top-k walk's time on the H200 (40 us for 15 rows of
32k, 1.1 ms for 960 rows of 151,936, 1.8 ms for 960 of 248,320: ~260 GB/s). Here, for 16-bit logits, selects over
torch.topk's own 16-bit order keys (the bits made monotone, NaN largest, -0.0 below +0.0); radix selects of
DIGIT_BITS-bit histogram rounds pick a k-th largest key where one is needed. Two paths:
- one read (small inputs): split programs (row, SPLIT elements) each stage their own first K, a merge per row picks
  the row's K from the splits x K staged;
- two reads (from BOUND_MIN_ELEMENTS logits): a streaming pass stores the maximum of each piece of a row; one program
  per row takes the K-th largest piece maximum B, which is at most the row's K-th key (K pieces hold a key at least as
  large), reads again only the pieces whose maximum is at least B (about K pieces: a few % of the row), lists their
  elements at or above B and picks K from the list. Rows where the bound is loose (a constant row, a top clustered in
  few pieces) overfill the list and go through the one-read path instead, in two persistent launches that do
  nothing otherwise.
Either way the result is the first K elements in the order (key descending, index ascending), torch.topk's CUDA
kernel's boundary tie rule (its gatherTopK writes ties in index order). One read: every such element is among its
split's first K in that order, and the staged candidates equal to the row's K-th key sit in index order. Two reads:
the list holds every element at or above B, and the ties at the K-th key are cut by a radix select on their indices.

Only the set is torch.topk's: the candidates are not sorted by value, which the walk does not need.
"""
import dataclasses

import torch
import triton
import triton.language as tl

from .._pdl import interpreted, pdl_available, wait_for_the_launch_before

# Elements of a row one split program holds in registers; warps of a program; the most staged candidates a row may
# have; bits of the key decided per histogram round (16 / DIGIT_BITS rounds: 8 = two 256-bin rounds, 4 = four 16-bin
# ones, 2 = eight 4-bin ones). H200, session 21 call 7 (K 64, us, CUDA graph; torch.topk / bits 8 / 4 / 2 at split 4096
# and 8 warps): 15 rows of 32k 41.1 / 14.8 / 12.2 / 14.3; 120 of 32k 72.0 / 53.8 / 44.2 / 52.2; 15 of 151,936 57.1 /
# 43.0 / 35.0 / 41.9; 120 of 151,936 207.9 / 215.0 / 173.7 / 208.8; 960 of 151,936 1118 / 1670 / 1337 / 1616; 480 of
# 248,320 920 / 1321 / 1055 / 1276. Split 8192 and 16 warps slower in every cell (the same set everywhere).
SPLIT = 4096
NUM_WARPS = 8
MAX_STAGED = 16384
DIGIT_BITS = 4
# Warps of the two-read path's maxima pass (session 22 call 6, K 64, split 4096: 4 warps within 10% of the fastest
# option in every cell, the fastest from 960 rows: 960 x 248,320 238.7 us against 245.8-415.7 for the others).
BOUND_NUM_WARPS = 4
SELECT_DTYPES = (torch.bfloat16, torch.float16)
# The two-read path: the most pieces per split the bound takes its maxima over; the largest k (a row's list holds
# max(512, 4k) elements); indices below 2**INDEX_BITS (the pick's tie order is a radix select on them).
BOUND_MAX_PIECES = 64
BOUND_MAX_K = 512
INDEX_BITS = 20
# Elements the second read of the two-read path loads per round (whole pieces).
GATHER_CHUNK = 2048
# Warps of the two-read path's row programs (session 22 call 10, K 64: 8 against 4: 960 x 248,320 231.4 vs 240.5 us,
# 15 x 151,936 23.4 vs 26.7; 4 warps took 255 registers there). Three launches in its place (the bound and chosen
# pieces a row, the reads a chunk of pieces, the pick a row) measured 210 us at 960 x 248,320 but slower from 120
# rows of 32k down (4 us more there); not kept.
ROWS_NUM_WARPS = 8
# Digit bits of the row programs' radix selects (None: the select's digit_bits), read at plan time as the two above.
ROWS_DIGIT_BITS = None
# The row programs' register cap (0: none; None: ROWS_WIDE_MAXNREG beyond two programs an SM's worth of rows, else
# none), read at plan time as the knobs above. Uncapped they take 128 registers at 8 warps (triton 3.6), two programs
# an SM; capped at 80, three (16 B of stack). Measured (session 23 call 12, us of the whole select, randn / skewed
# rows): 960 x 151,936 158.6 -> 149.9, 960 x 248,320 202.9 -> 195.0; but 15 / 120 rows +0.5..1.5 (one wave either way).
ROWS_MAXNREG = None
ROWS_WIDE_MAXNREG = 80
# The one-read path measured faster than torch.topk up to 120 rows of 151,936 (session 21 call 7: 173.7 vs 207.9 us)
# and slower from 480 rows of 248,320; the walk takes torch.topk past this where no bound applies (k > BOUND_MAX_K,
# vocabularies past 2**INDEX_BITS).
ONE_READ_MAX_ELEMENTS = 120 * 151_936
# Below this many logits in all the one-read path is faster (H200, session 22 call 3, K 64: 15 x 32k 12.3 vs 18.2 us;
# 120 x 32k 44.2 vs 26.4; 15 x 151,936 35.1 vs 21.7).
BOUND_MIN_ELEMENTS = 1 << 20
# Whether the top-k walk's launches (the select's, the table's, the chain's) take programmatic dependent launch
# where the caller does not say (`pdl_launch`). Measured (H200, session 23 call 5, select + table walk, us): 32k b1
# greedy 25.1 -> 23.3, sampled 29.6 -> 28.7, 152k b1 34.5 -> 33.1, b8 47.3 -> 46.1, b32 sampled 121.7 -> 120.3, 248k
# b64 238.5 -> 237.8 greedy, 251.7 -> 250.5 sampled; the same drafts and cache, eager and in a CUDA graph
# (test_gpu_pdl_changes_nothing).
DEFAULT_PDL = True


@triton.jit
def _order_keys(x_ptr, offs, mask):
    """torch.topk's radix key of the 16-bit floats at x_ptr + offs (see _order_keys_of)."""
    return _order_keys_of(tl.load(x_ptr + offs, mask=mask, other=0.0))


@triton.jit
def _order_keys_of(x):
    """torch.topk's radix key of 16-bit floats, as int32 in [0, 65536): bits ^ (sign ? 0xffff : 0x8000), NaN 0xffff."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    key = bits ^ tl.where((bits & 0x8000) != 0, 0xFFFF, 0x8000)
    return tl.where(x != x, 0xFFFF, key)


@triton.jit
def _digit_above(hist, need, BINS: tl.constexpr):
    """The largest digit d with (count of digits >= d) >= need, and the count of digits > d."""
    o_d = tl.arange(0, BINS)
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    digit = tl.max(tl.where(at_or_above >= need, o_d, -1), axis=0)
    above = tl.sum(tl.where(o_d > digit, hist, 0), axis=0)
    return digit, above


@triton.jit
def _kth_key(key, valid, need, DIGIT_BITS: tl.constexpr, KEY_BITS: tl.constexpr = 16):
    """The need-th largest of the valid keys (non-negative, below 2**KEY_BITS), T, and how many valid keys are above
    it (need <= valid count)."""
    key = tl.where(valid, key, 0)  # masked-off lanes inside the bins too (the interpreter indexes with them)
    threshold = tl.zeros([], dtype=tl.int32)
    num_above = tl.zeros([], dtype=tl.int32)
    for i in tl.static_range(KEY_BITS // DIGIT_BITS):
        # Digit i of T, among the keys whose higher digits are T's so far (a histogram of 2**DIGIT_BITS bins: the
        # cost of tl.histogram grows with its bins, so 16-bin rounds beat 256-bin ones; measured, session 21).
        in_bucket = valid & ((key >> (KEY_BITS - DIGIT_BITS * i)) == (threshold >> (KEY_BITS - DIGIT_BITS * i)))
        digits = (key >> (KEY_BITS - DIGIT_BITS * (i + 1))) & ((1 << DIGIT_BITS) - 1)
        digit, above = _digit_above(tl.histogram(digits, 1 << DIGIT_BITS, mask=in_bucket), need - num_above,
                                    1 << DIGIT_BITS)
        threshold = threshold | (digit << (KEY_BITS - DIGIT_BITS * (i + 1)))
        num_above = num_above + above
    return threshold, num_above


@triton.jit
def _select_slots(key, valid, need, DIGIT_BITS: tl.constexpr):
    """Radix select of `need` keys among the valid ones: (take, slot) with the slots 0..need-1 of those above the
    need-th largest key T in position order, then of the first of those equal to T in position order."""
    threshold, num_above = _kth_key(key, valid, need, DIGIT_BITS)
    is_above = (valid & (key > threshold)).to(tl.int32)
    is_equal = (valid & (key == threshold)).to(tl.int32)
    slot_equal = num_above + tl.cumsum(is_equal, axis=0) - 1
    take = (is_above != 0) | ((is_equal != 0) & (slot_equal < need))
    slot = tl.where(is_above != 0, tl.cumsum(is_above, axis=0) - 1, slot_equal)
    return take, tl.where(take, slot, 0)


# ------------------------------------------------------------------------------------------- one read: split, merge
@triton.jit
def _split_select(x_ptr, stride_x, vocab, stage_key_ptr, stage_idx_ptr, k, num_splits, row, split,
                  SPLIT: tl.constexpr, KP: tl.constexpr, DIGIT_BITS: tl.constexpr):
    """Stages split `split` of row `row`: its first min(k, elements) by (key desc, index asc), keys -1 after them."""
    offs = split * SPLIT + tl.arange(0, SPLIT)
    valid = offs < vocab
    key = _order_keys(x_ptr + row * stride_x, offs, valid)
    need = tl.minimum(k, tl.minimum(vocab - split * SPLIT, SPLIT))
    take, slot = _select_slots(key, valid, need, DIGIT_BITS)
    base = (row * num_splits + split) * k
    o_p = tl.arange(0, KP)
    tl.store(stage_key_ptr + base + o_p, -1, mask=(o_p >= need) & (o_p < k))
    tl.store(stage_key_ptr + base + slot, key, mask=take)
    tl.store(stage_idx_ptr + base + slot, offs.to(tl.int64), mask=take)


@triton.jit
def _merge_staged(x_ptr, stride_x, stage_key_ptr, stage_idx_ptr, values_ptr, index_ptr, stride_out, k, staged, row,
                  STAGED: tl.constexpr, DIGIT_BITS: tl.constexpr):
    """Row `row`'s k from its staged candidates."""
    o_c = tl.arange(0, STAGED)
    m_c = o_c < staged
    key = tl.load(stage_key_ptr + row * staged + o_c, mask=m_c, other=-1)
    idx = tl.load(stage_idx_ptr + row * staged + o_c, mask=m_c, other=0)
    take, slot = _select_slots(key, key >= 0, k, DIGIT_BITS)
    idx = tl.where(take, idx, 0)  # slots a short split left unwritten hold no index
    tl.store(index_ptr + row * stride_out + slot, idx, mask=take)
    tl.store(values_ptr + row * stride_out + slot, tl.load(x_ptr + row * stride_x + idx, mask=take), mask=take)


@triton.jit
def topk_split_kernel(x_ptr, stride_x, vocab, stage_key_ptr, stage_idx_ptr, k, num_splits, SPLIT: tl.constexpr,
                      KP: tl.constexpr, DIGIT_BITS: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_the_launch_before(PDL)
    _split_select(x_ptr, stride_x, vocab, stage_key_ptr, stage_idx_ptr, k, num_splits, tl.program_id(0).to(tl.int64),
                  tl.program_id(1), SPLIT, KP, DIGIT_BITS)


@triton.jit
def topk_merge_kernel(x_ptr, stride_x, stage_key_ptr, stage_idx_ptr, values_ptr, index_ptr, stride_out, k, staged,
                      STAGED: tl.constexpr, DIGIT_BITS: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_the_launch_before(PDL)
    _merge_staged(x_ptr, stride_x, stage_key_ptr, stage_idx_ptr, values_ptr, index_ptr, stride_out, k, staged,
                  tl.program_id(0).to(tl.int64), STAGED, DIGIT_BITS)


# ------------------------------------------------------------------------- two reads: bound, filter, list merge
@triton.jit
def _max_propagating_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL).to(a.dtype)


@triton.jit
def topk_bound_maxima_kernel(x_ptr, stride_x, vocab, maxima_ptr, num_maxima, fallback_ptr, SPLIT: tl.constexpr,
                             PIECES: tl.constexpr, PDL: tl.constexpr = False):
    """Each of PIECES equal pieces of split `split` of row `row`: the key of its float maximum (NaN if any; -1 for a
    piece past the row), which is its largest key except that a zero maximum is taken as +0.0 (a float maximum does
    not tell -0.0 from +0.0; the row programs allow for it). Floats, not keys, because a bf16x2 / f16x2 maximum takes
    a pair an instruction: a key an element held this pass to 3.3 TB/s, compute-bound (session 22, calls 9 and 11).
    Program (0, 0) empties the fallback list the next launch fills."""
    wait_for_the_launch_before(PDL)
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if (row == 0) & (split == 0):
        tl.store(fallback_ptr, 0)
    offs = split * SPLIT + tl.arange(0, SPLIT)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < vocab, other=float("-inf"))
    piece_float_max = tl.reduce(tl.reshape(x, [PIECES, SPLIT // PIECES]), 1, _max_propagating_nan)
    piece_max = tl.where(piece_float_max == 0, 0x8000, _order_keys_of(piece_float_max))
    o_piece = split * SPLIT + tl.arange(0, PIECES) * (SPLIT // PIECES)
    tl.store(maxima_ptr + row * num_maxima + split * PIECES + tl.arange(0, PIECES),
             tl.where(o_piece < vocab, piece_max, -1))


@triton.jit
def _pick_from_list(x_ptr, stride_x, list_key_ptr, list_idx_ptr, values_ptr, index_ptr, stride_out, k, listed, row,
                    CAPACITY: tl.constexpr, INDEX_BITS: tl.constexpr, DIGIT_BITS: tl.constexpr):
    """Row `row`'s k from the `listed` (key, index) pairs of its list: those above the k-th key T, then of those equal
    to T the smallest indices (torch.topk's boundary ties)."""
    o_c = tl.arange(0, CAPACITY)
    in_list = o_c < listed
    key = tl.load(list_key_ptr + row * CAPACITY + o_c, mask=in_list, other=0)
    idx = tl.load(list_idx_ptr + row * CAPACITY + o_c, mask=in_list, other=0)
    threshold, num_above = _kth_key(key, in_list, k, DIGIT_BITS)
    above = in_list & (key > threshold)
    equal = in_list & (key == threshold)
    need_equal = k - num_above
    if tl.sum(equal.to(tl.int32), axis=0) > need_equal:
        last_index = (1 << INDEX_BITS) - 1
        first_indices, _ = _kth_key(last_index - idx, equal, need_equal, DIGIT_BITS, INDEX_BITS)
        equal = equal & (last_index - idx >= first_indices)
    take = above | equal
    slot = tl.where(take, tl.cumsum(take.to(tl.int32), axis=0) - 1, 0)
    tl.store(index_ptr + row * stride_out + slot, idx.to(tl.int64), mask=take)
    tl.store(values_ptr + row * stride_out + slot, tl.load(x_ptr + row * stride_x + idx, mask=take), mask=take)


@triton.jit
def topk_bounded_row_kernel(x_ptr, stride_x, vocab, maxima_ptr, num_maxima, piece_ids_ptr, list_key_ptr, list_idx_ptr,
                            values_ptr, index_ptr, stride_out, fallback_ptr, k, PIECE: tl.constexpr,
                            MAXIMA: tl.constexpr, MAX_PIECES: tl.constexpr, CHUNK: tl.constexpr,
                            CAPACITY: tl.constexpr, INDEX_BITS: tl.constexpr, DIGIT_BITS: tl.constexpr,
                            PDL: tl.constexpr = False):
    """Row `row`'s k from its pieces' maxima and a second read of only the pieces that can hold them.

    The k-th largest piece maximum B is at most the row's k-th key (k pieces hold a key at least as large), so the
    row's first k lie in the pieces whose maximum is at least B (about k of them): those are read, their elements at
    or above B listed, and the k picked from the list (ties at the k-th key by smallest index, torch.topk's rule).
    A row with more than MAX_PIECES such pieces or CAPACITY such elements goes on the fallback list instead."""
    wait_for_the_launch_before(PDL)
    row = tl.program_id(0).to(tl.int64)
    o_m = tl.arange(0, MAXIMA)
    piece_max = tl.load(maxima_ptr + row * num_maxima + o_m, mask=o_m < num_maxima, other=-1)
    bound, _ = _kth_key(piece_max, piece_max >= 0, k, DIGIT_BITS)
    bound = tl.where(tl.sum((piece_max >= 0).to(tl.int32), axis=0) >= k, bound, 0)  # fewer pieces than k: none
    bound = tl.where(bound == 0x8000, 0x7FFF, bound)  # a float maximum's +0.0 may stand for -0.0
    chosen = piece_max >= bound
    num_pieces = tl.sum(chosen.to(tl.int32), axis=0)
    listed = tl.zeros([], dtype=tl.int32)  # the elements at or above the bound found so far
    if num_pieces <= MAX_PIECES:
        slot = tl.where(chosen, tl.cumsum(chosen.to(tl.int32), axis=0) - 1, 0)
        tl.store(piece_ids_ptr + row * MAX_PIECES + slot, o_m, mask=chosen)
        tl.debug_barrier()  # the piece ids, written by other threads of this program, read below
        o_e = tl.arange(0, PIECE)
        for start in range(0, num_pieces, CHUNK):
            o_p = start + tl.arange(0, CHUNK)
            piece = tl.load(piece_ids_ptr + row * MAX_PIECES + o_p, mask=o_p < num_pieces, other=0)
            offs = piece[:, None] * PIECE + o_e[None, :]
            inside = (o_p < num_pieces)[:, None] & (offs < vocab)
            key = _order_keys(x_ptr + row * stride_x, offs, inside)
            candidate = inside & (key >= bound)
            at = listed + tl.reshape(tl.cumsum(tl.reshape(candidate.to(tl.int32), [CHUNK * PIECE]), axis=0),
                                     [CHUNK, PIECE]) - 1
            tl.store(list_key_ptr + row * CAPACITY + at, key, mask=candidate & (at < CAPACITY))
            tl.store(list_idx_ptr + row * CAPACITY + at, offs, mask=candidate & (at < CAPACITY))
            listed += tl.sum(tl.sum(candidate.to(tl.int32), axis=1), axis=0)
    if (num_pieces > MAX_PIECES) | (listed > CAPACITY):
        tl.store(fallback_ptr + 1 + tl.atomic_add(fallback_ptr, 1, sem="relaxed"), row.to(tl.int32))
    else:
        tl.debug_barrier()  # the list, likewise
        _pick_from_list(x_ptr, stride_x, list_key_ptr, list_idx_ptr, values_ptr, index_ptr, stride_out, k, listed,
                        row, CAPACITY, INDEX_BITS, DIGIT_BITS)


@triton.jit
def topk_fallback_split_kernel(x_ptr, stride_x, vocab, stage_key_ptr, stage_idx_ptr, k, num_splits, fallback_ptr,
                               SPLIT: tl.constexpr, KP: tl.constexpr, DIGIT_BITS: tl.constexpr,
                               PDL: tl.constexpr = False):
    """The one-read split pass for the splits of the rows on the fallback list, each program every num_programs-th."""
    wait_for_the_launch_before(PDL)
    for i in range(tl.program_id(0), tl.load(fallback_ptr) * num_splits, tl.num_programs(0)):
        row = tl.load(fallback_ptr + 1 + i // num_splits).to(tl.int64)
        _split_select(x_ptr, stride_x, vocab, stage_key_ptr, stage_idx_ptr, k, num_splits, row, i % num_splits,
                      SPLIT, KP, DIGIT_BITS)


@triton.jit
def topk_fallback_merge_kernel(x_ptr, stride_x, stage_key_ptr, stage_idx_ptr, values_ptr, index_ptr, stride_out, k,
                               staged, fallback_ptr, STAGED: tl.constexpr, DIGIT_BITS: tl.constexpr,
                               PDL: tl.constexpr = False):
    """The one-read merge for the rows on the fallback list."""
    wait_for_the_launch_before(PDL)
    for i in range(tl.program_id(0), tl.load(fallback_ptr), tl.num_programs(0)):
        _merge_staged(x_ptr, stride_x, stage_key_ptr, stage_idx_ptr, values_ptr, index_ptr, stride_out, k, staged,
                      tl.load(fallback_ptr + 1 + i).to(tl.int64), STAGED, DIGIT_BITS)


# ---------------------------------------------------------------------------------------------------------- host
@dataclasses.dataclass
class SelectPlan:
    """topk_candidates' outputs, its launches as (name, launch) in order, and the fallback list ([rows on it, rows]
    int32; None on the one-read path)."""
    values: torch.Tensor
    indices: torch.Tensor
    launches: list
    fallback: torch.Tensor | None


def topk_candidates(logits: torch.Tensor, k: int, *, split: int = SPLIT, num_warps: int | None = None,
                    digit_bits: int = DIGIT_BITS, bound_pieces: int | None = None,
                    pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The set torch.topk(logits, k, dim=-1) returns, for bf16 / fp16 logits.

    Args:
        logits: [..., V] bf16 or fp16, the last dimension contiguous.
        k: 1 <= k <= V, with ceil(V / split) * k <= MAX_STAGED.
        num_warps: per program; None: NUM_WARPS on the one-read path, BOUND_NUM_WARPS for the two-read path's maxima
            pass (its row programs take ROWS_NUM_WARPS, its fallback NUM_WARPS).
        bound_pieces: 0 reads the logits once (each split selects its own k, a merge the row's); a power of two
            dividing `split` reads them twice: first for the maxima of that many pieces per split, whose k-th largest
            bounds the row's k-th key, then for the few elements at or above the bound, from which a merge picks k
            (rows with too many fall back to the one-read path). None picks by size (`default_bound_pieces`).
        pdl: launch each kernel with programmatic dependent launch (it starts while the one before ends, then waits
            for it before touching memory); None: DEFAULT_PDL.

    Returns:
        (values [..., k] in logits' dtype, indices [..., k] int64): the first k elements in the order (torch.topk's
        radix key descending, index ascending), which is torch.topk's set on CUDA, boundary ties included.
    """
    plan = select_launches(logits, k, split=split, num_warps=num_warps, digit_bits=digit_bits,
                           bound_pieces=bound_pieces, pdl=pdl)
    for _, launch in plan.launches:
        launch()
    return plan.values, plan.indices


def select_launches(logits: torch.Tensor, k: int, *, split: int = SPLIT, num_warps: int | None = None,
                    digit_bits: int = DIGIT_BITS, bound_pieces: int | None = None,
                    pdl: bool | None = None) -> SelectPlan:
    """topk_candidates' outputs and its launches in order, unlaunched (the bench times them)."""
    if logits.dtype not in SELECT_DTYPES:
        raise ValueError(f"topk_candidates: logits in {logits.dtype} (bfloat16 or float16; torch.topk otherwise)")
    vocab = logits.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"topk_candidates: k {k} outside 1..{vocab}")
    if logits.stride(-1) != 1:
        raise ValueError("topk_candidates: the last dimension must be contiguous")
    num_splits = triton.cdiv(vocab, split)
    if digit_bits not in (2, 4, 8):
        raise ValueError(f"topk_candidates: digit_bits {digit_bits} (2, 4 or 8)")
    if num_splits * k > MAX_STAGED:
        raise ValueError(f"topk_candidates: {num_splits} splits x k {k} staged candidates, above {MAX_STAGED}")
    lead = logits.shape[:-1]
    x = logits.reshape(-1, vocab)
    rows = x.shape[0]
    if bound_pieces is None:
        bound_pieces = default_bound_pieces(rows, vocab, k, split)
    if bound_pieces and (bound_pieces & (bound_pieces - 1) or split % bound_pieces):
        raise ValueError(f"topk_candidates: bound_pieces {bound_pieces} (a power of two dividing split {split})")
    if bound_pieces and (k > BOUND_MAX_K or vocab > 1 << INDEX_BITS):
        raise ValueError(f"topk_candidates: a bound for k {k} <= {BOUND_MAX_K}, vocab {vocab} <= {1 << INDEX_BITS}")
    if num_warps is None:
        num_warps = BOUND_NUM_WARPS if bound_pieces else NUM_WARPS
    values = torch.empty(*lead, k, dtype=logits.dtype, device=logits.device)
    indices = torch.empty(*lead, k, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return SelectPlan(values, indices, [], None)
    dev = logits.device
    pdl = pdl_launch(dev, pdl)
    stage_key = torch.empty(rows, num_splits * k, dtype=torch.int32, device=dev)
    stage_idx = torch.empty(rows, num_splits * k, dtype=torch.int64, device=dev)
    out = (values.view(rows, k), indices.view(rows, k), k)
    # the one-read launches (the two-read path's fallback too) at NUM_WARPS there: 4 spill their select
    one_read_warps = num_warps if not bound_pieces else NUM_WARPS
    one_read = dict(SPLIT=split, KP=triton.next_power_of_2(k), DIGIT_BITS=digit_bits, num_warps=one_read_warps, **pdl)
    merge = dict(STAGED=triton.next_power_of_2(num_splits * k), DIGIT_BITS=digit_bits, num_warps=one_read_warps,
                 **pdl)
    if not bound_pieces:
        return SelectPlan(values, indices, [
            ("split", lambda: topk_split_kernel[(rows, num_splits)](
                x, x.stride(0), vocab, stage_key, stage_idx, k, num_splits, **one_read)),
            ("merge", lambda: topk_merge_kernel[(rows,)](
                x, x.stride(0), stage_key, stage_idx, *out, k, num_splits * k, **merge)),
        ], None)
    num_maxima = num_splits * bound_pieces
    capacity, max_pieces = list_capacity(k), bound_max_pieces(k)
    maxima = torch.empty(rows, num_maxima, dtype=torch.int32, device=dev)
    piece_ids = torch.empty(rows, max_pieces, dtype=torch.int32, device=dev)
    list_key, list_idx = torch.empty(2, rows, capacity, dtype=torch.int32, device=dev)
    fallback = torch.empty(rows + 1, dtype=torch.int32, device=dev)  # [rows on it, rows]
    persistent = (min(rows * num_splits, _persistent_programs(dev)),)
    # the module's knobs read now, not when a launch runs (the bench changes them between plans)
    chunk, rows_warps = max(1, GATHER_CHUNK // (split // bound_pieces)), ROWS_NUM_WARPS
    rows_bits = ROWS_DIGIT_BITS or digit_bits
    rows_maxnreg = ROWS_MAXNREG
    if rows_maxnreg is None:
        rows_maxnreg = ROWS_WIDE_MAXNREG if rows > _persistent_programs(dev) else 0  # two programs an SM
    rows_cap = dict(maxnreg=rows_maxnreg) if rows_maxnreg and not interpreted(topk_split_kernel) else {}
    index_bits = triton.cdiv(INDEX_BITS, rows_bits) * rows_bits
    launches = [("maxima", lambda: topk_bound_maxima_kernel[(rows, num_splits)](
        x, x.stride(0), vocab, maxima, num_maxima, fallback, SPLIT=split, PIECES=bound_pieces,
        num_warps=num_warps, **pdl))]
    launches.append(("rows", lambda: topk_bounded_row_kernel[(rows,)](
        x, x.stride(0), vocab, maxima, num_maxima, piece_ids, list_key, list_idx, *out, fallback, k,
        PIECE=split // bound_pieces, MAXIMA=triton.next_power_of_2(num_maxima), MAX_PIECES=max_pieces, CHUNK=chunk,
        CAPACITY=capacity, INDEX_BITS=index_bits, DIGIT_BITS=rows_bits, num_warps=rows_warps, **pdl, **rows_cap)))
    return SelectPlan(values, indices, launches + [
        ("fallback_split", lambda: topk_fallback_split_kernel[persistent](
            x, x.stride(0), vocab, stage_key, stage_idx, k, num_splits, fallback, **one_read)),
        ("fallback_merge", lambda: topk_fallback_merge_kernel[persistent](
            x, x.stride(0), stage_key, stage_idx, *out, k, num_splits * k, fallback, **merge)),
    ], fallback)


def pdl_launch(device: torch.device, pdl: bool | None) -> dict:
    """The launch options for `pdl` (None: DEFAULT_PDL): PDL needs sm_90 and a real launch (not the interpreter)."""
    if pdl is None:
        pdl = DEFAULT_PDL
    if not pdl or not pdl_available(device, topk_split_kernel):
        return {}
    return dict(PDL=True, launch_pdl=True)


def bound_max_pieces(k: int) -> int:
    """The most pieces the second read takes per row (about k hold a maximum at or above the bound, more with ties)."""
    return max(256, triton.next_power_of_2(4 * k))


def list_capacity(k: int) -> int:
    """Slots of a row's candidate list on the two-read path: room for the bound's slack and its ties."""
    return max(512, triton.next_power_of_2(4 * k))


def _persistent_programs(device: torch.device) -> int:
    """Programs of the fallback launches: two per SM (the select's registers allow two 8-warp programs)."""
    if device.type != "cuda":
        return 1
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def default_bound_pieces(rows: int, vocab: int, k: int, split: int = SPLIT) -> int:
    """Pieces per split for the bound (0: the one-read path): enough that a row has about 16k of them (fewer, larger
    pieces loosen the bound where a row's top clusters in one part of the vocabulary), at most BOUND_MAX_PIECES, and
    at least k inside the row (else the bound is none and every row falls back)."""
    num_splits = triton.cdiv(vocab, split)
    if rows * vocab < BOUND_MIN_ELEMENTS or k > BOUND_MAX_K or vocab > 1 << INDEX_BITS:
        return 0
    pieces = min(triton.next_power_of_2(triton.cdiv(16 * k, num_splits)), BOUND_MAX_PIECES, split)
    return pieces if triton.cdiv(vocab, split // pieces) >= k else 0


def walk_candidates(logits: torch.Tensor, k: int, pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k walk's candidates: topk_candidates for 16-bit logits on CUDA where it measured faster than
    torch.topk (the two-read path at every size measured, 15 x 32k to 960 x 248,320; the one-read path up to
    ONE_READ_MAX_ELEMENTS), torch.topk otherwise. Either way torch.topk's set. pdl: as topk_candidates'."""
    if not (logits.is_cuda and logits.dtype in SELECT_DTYPES and logits.stride(-1) == 1
            and triton.cdiv(logits.shape[-1], SPLIT) * k <= MAX_STAGED):
        return logits.topk(k, dim=-1)
    vocab = logits.shape[-1]
    if (logits.numel() <= ONE_READ_MAX_ELEMENTS
            or default_bound_pieces(logits.numel() // max(vocab, 1), vocab, k)):
        return topk_candidates(logits, k, pdl=pdl)
    return logits.topk(k, dim=-1)
