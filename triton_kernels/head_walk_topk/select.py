"""The top-k walk's candidates: the K largest logits of every (row, step), the set torch.topk returns, faster.

torch.topk over DSpark's [B * N, V] base logits took most of the top-k walk's time on the H200 (session 21: 40 us for
15 rows of 32k, 1.1 ms for 960 rows of 151,936). Here, for 16-bit logits, a radix select over the 16-bit order keys
(torch.topk's own key: the bits made monotone, NaN largest, -0.0 below +0.0): two 256-bin histogram passes (high
byte, then the low byte among the high byte's bucket) pin the K-th largest key T exactly; a count pass and a gather
pass write every element above T and the first (by index) of those equal to T, as torch.topk's CUDA kernel picks
its boundary ties. Each pass is a grid of (row, split) programs, so one long row is read by many SMs.

Only the set is torch.topk's: the candidates come in index order (above T, then equal to T), not sorted by value,
which the walk does not need (it keys every candidate by value and id).
"""
import torch
import triton
import triton.language as tl

# Elements of a row one program reads per pass, and per load.
SPLIT = 8192
BLOCK = 2048
NUM_WARPS = 8
SELECT_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _order_keys(x_ptr, offs, mask):
    """torch.topk's radix key of 16-bit floats, as int32 in [0, 65536): bits ^ (sign ? 0xffff : 0x8000), NaN 0xffff."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    key = bits ^ tl.where((bits & 0x8000) != 0, 0xFFFF, 0x8000)
    return tl.where(x != x, 0xFFFF, key)


@triton.jit
def _digit_above(hist, need):
    """The largest digit d with (count of digits >= d) >= need, and the count of digits > d."""
    o_d = tl.arange(0, 256)
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    digit = tl.max(tl.where(at_or_above >= need, o_d, -1), axis=0)
    above = tl.sum(tl.where(o_d > digit, hist, 0), axis=0)
    return digit, above


@triton.jit
def _threshold(hist_ptr, row, k):
    """(T, elements above T) of a row from its two histograms."""
    o_d = tl.arange(0, 256)
    high, above_high = _digit_above(tl.load(hist_ptr + row * 512 + o_d), k)
    low, above_low = _digit_above(tl.load(hist_ptr + row * 512 + 256 + o_d), k - above_high)
    return high * 256 + low, above_high + above_low


@triton.jit
def topk_histogram_kernel(x_ptr, stride_x, vocab, hist_ptr, k, PASS: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK: tl.constexpr):
    """PASS 0: histogram of the keys' high bytes into hist[row, 0:256]; PASS 1: of the low bytes of the keys whose
    high byte is T's, into hist[row, 256:512]."""
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_d = tl.arange(0, 256)
    if PASS == 1:
        high, _ = _digit_above(tl.load(hist_ptr + row * 512 + o_d), k)
    counts = tl.zeros([256], dtype=tl.int32)
    for start in range(split * SPLIT, tl.minimum(split * SPLIT + SPLIT, vocab), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < vocab
        key = _order_keys(x_ptr + row * stride_x, offs, m)
        if PASS == 0:
            counts += tl.histogram(key >> 8, 256, mask=m)
        else:
            counts += tl.histogram(key & 0xFF, 256, mask=m & ((key >> 8) == high))
    tl.atomic_add(hist_ptr + row * 512 + PASS * 256 + o_d, counts, mask=counts > 0, sem="relaxed")


@triton.jit
def topk_count_kernel(x_ptr, stride_x, vocab, hist_ptr, count_ptr, k, num_splits, SPLIT: tl.constexpr,
                      BLOCK: tl.constexpr):
    """count[row, split] = (elements above T, elements equal to T) in the split."""
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    threshold, _ = _threshold(hist_ptr, row, k)
    above = tl.zeros([], dtype=tl.int32)
    equal = tl.zeros([], dtype=tl.int32)
    for start in range(split * SPLIT, tl.minimum(split * SPLIT + SPLIT, vocab), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < vocab
        key = _order_keys(x_ptr + row * stride_x, offs, m)
        above += tl.sum((m & (key > threshold)).to(tl.int32), axis=0)
        equal += tl.sum((m & (key == threshold)).to(tl.int32), axis=0)
    tl.store(count_ptr + (row * num_splits + split) * 2, above)
    tl.store(count_ptr + (row * num_splits + split) * 2 + 1, equal)


@triton.jit
def topk_gather_kernel(x_ptr, stride_x, vocab, hist_ptr, count_ptr, values_ptr, index_ptr, stride_out, k, num_splits,
                       SPLIT: tl.constexpr, BLOCK: tl.constexpr, SPLITS_P2: tl.constexpr):
    """Writes the split's elements above T at their place among the row's (index order), then its elements equal to T
    after all of the row's above-T ones, while fewer than k are written."""
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    threshold, num_above = _threshold(hist_ptr, row, k)
    o_s = tl.arange(0, SPLITS_P2)
    before = (o_s < split)
    above_base = tl.sum(tl.load(count_ptr + (row * num_splits + o_s) * 2, mask=before, other=0), axis=0)
    equal_base = num_above + tl.sum(tl.load(count_ptr + (row * num_splits + o_s) * 2 + 1, mask=before, other=0),
                                    axis=0)
    for start in range(split * SPLIT, tl.minimum(split * SPLIT + SPLIT, vocab), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < vocab
        x = tl.load(x_ptr + row * stride_x + offs, mask=m, other=0.0)
        key = _order_keys(x_ptr + row * stride_x, offs, m)
        is_above = (m & (key > threshold)).to(tl.int32)
        is_equal = (m & (key == threshold)).to(tl.int32)
        slot_above = above_base + tl.cumsum(is_above, axis=0) - 1
        slot_equal = equal_base + tl.cumsum(is_equal, axis=0) - 1
        slot = tl.where(is_above != 0, slot_above, slot_equal)
        take = ((is_above != 0) | ((is_equal != 0) & (slot_equal < k)))
        tl.store(values_ptr + row * stride_out + slot, x, mask=take)
        tl.store(index_ptr + row * stride_out + slot, offs.to(tl.int64), mask=take)
        above_base += tl.sum(is_above, axis=0)
        equal_base += tl.sum(is_equal, axis=0)


def topk_candidates(logits: torch.Tensor, k: int, *, split: int = SPLIT, block: int = BLOCK,
                    num_warps: int = NUM_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """The set torch.topk(logits, k, dim=-1) returns, for bf16 / fp16 logits.

    Args:
        logits: [..., V] bf16 or fp16, the last dimension contiguous.
        k: 1 <= k <= V.

    Returns:
        (values [..., k] in logits' dtype, indices [..., k] int64): every element whose key is above the k-th largest
        key T, in index order, then the first elements equal to T in index order (torch.topk's CUDA tie rule).
    """
    if logits.dtype not in SELECT_DTYPES:
        raise ValueError(f"topk_candidates: logits in {logits.dtype} (bfloat16 or float16; torch.topk otherwise)")
    vocab = logits.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"topk_candidates: k {k} outside 1..{vocab}")
    if logits.stride(-1) != 1:
        raise ValueError("topk_candidates: the last dimension must be contiguous")
    lead = logits.shape[:-1]
    x = logits.reshape(-1, vocab)
    rows = x.shape[0]
    values = torch.empty(*lead, k, dtype=logits.dtype, device=logits.device)
    indices = torch.empty(*lead, k, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return values, indices
    num_splits = triton.cdiv(vocab, split)
    hist = torch.zeros(rows, 512, dtype=torch.int32, device=logits.device)
    counts = torch.empty(rows, num_splits, 2, dtype=torch.int32, device=logits.device)
    grid = (rows, num_splits)
    for pass_ in (0, 1):
        topk_histogram_kernel[grid](x, x.stride(0), vocab, hist, k, PASS=pass_, SPLIT=split, BLOCK=block,
                                    num_warps=num_warps)
    topk_count_kernel[grid](x, x.stride(0), vocab, hist, counts, k, num_splits, SPLIT=split, BLOCK=block,
                            num_warps=num_warps)
    topk_gather_kernel[grid](x, x.stride(0), vocab, hist, counts, values.view(rows, k), indices.view(rows, k), k, k,
                             num_splits, SPLIT=split, BLOCK=block, SPLITS_P2=triton.next_power_of_2(num_splits),
                             num_warps=num_warps)
    return values, indices


def walk_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k walk's candidates: topk_candidates for 16-bit logits on CUDA, torch.topk (sorted=False) otherwise."""
    if logits.is_cuda and logits.dtype in SELECT_DTYPES and logits.stride(-1) == 1:
        return topk_candidates(logits, k)
    return logits.topk(k, dim=-1)
