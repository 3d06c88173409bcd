"""vLLM's `moe_align_block_size` as one Triton launch (vLLM's own is a CUDA op, absent without the vLLM build).

Groups the T * top_k (token, expert) routes by expert, each expert's group padded to a multiple of `block_size`,
so that every BLOCK_SIZE_M row block of the fused-MoE GEMM reads one expert. Same outputs and contract as
vllm/model_executor/layers/fused_moe/moe_align_block_size.py (no expert map):

    sorted_ids        [max_padded] int32   route index (token * top_k + slot) per row, `numel` = padding
    expert_ids        [max_blocks] int32   expert of each block; -1 past the used blocks
    num_post_pad      [1] int32            rows in use (sum over experts of the padded group sizes)

The order of routes inside an expert's group is not specified (vLLM's kernel fills them with atomics too).
Part of the timed MoE call: vLLM runs it inside every MoE layer with more than num_experts / (4 top_k) tokens.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 1024


@triton.jit
def _moe_align_kernel(topk_ids, sorted_ids, expert_ids, num_post_pad, cursor, numel, max_padded, max_blocks,
                      E: tl.constexpr, BLOCK_E: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr):
    # one program: counts by atomics, padded offsets by a scan over experts, then each route takes the next row
    # of its expert's group (atomics again); barriers separate the phases (threads of one block)
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    tl.store(cursor + o_e, tl.zeros([BLOCK_E], dtype=tl.int32), mask=m_e)
    for start in range(0, max_padded, CHUNK):
        o = start + tl.arange(0, CHUNK)
        tl.store(sorted_ids + o, tl.zeros([CHUNK], dtype=tl.int32) + numel, mask=o < max_padded)
    for start in range(0, max_blocks, CHUNK):
        o = start + tl.arange(0, CHUNK)
        tl.store(expert_ids + o, tl.full([CHUNK], -1, dtype=tl.int32), mask=o < max_blocks)
    tl.debug_barrier()
    for start in range(0, numel, CHUNK):
        o = start + tl.arange(0, CHUNK)
        m = o < numel
        e = tl.load(topk_ids + o, mask=m, other=0).to(tl.int32)
        tl.atomic_add(cursor + e, tl.full([CHUNK], 1, dtype=tl.int32), mask=m)
    tl.debug_barrier()
    # read through an atomic: the counts live in L2, not in this SM's L1
    counts = tl.atomic_add(cursor + o_e, tl.zeros([BLOCK_E], dtype=tl.int32), mask=m_e)
    counts = tl.where(m_e, counts, 0)
    padded = (counts + BS - 1) // BS * BS
    ends = tl.cumsum(padded, 0)
    tl.store(num_post_pad, tl.sum(padded, 0))
    tl.debug_barrier()
    tl.atomic_xchg(cursor + o_e, ends - padded, mask=m_e)
    tl.debug_barrier()
    for start in range(0, numel, CHUNK):
        o = start + tl.arange(0, CHUNK)
        m = o < numel
        e = tl.load(topk_ids + o, mask=m, other=0).to(tl.int32)
        row = tl.atomic_add(cursor + e, tl.full([CHUNK], 1, dtype=tl.int32), mask=m)
        tl.store(sorted_ids + row, o, mask=m)
        tl.store(expert_ids + row // BS, e, mask=m)


def padded_sizes(numel: int, num_experts: int, block_size: int) -> tuple[int, int]:
    """(max_padded, max_blocks) exactly as vLLM sizes its buffers."""
    max_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    return max_padded, triton.cdiv(max_padded, block_size)


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map=None,
                         pad_sorted_ids: bool = False, ignore_invalid_experts: bool = False,
                         return_scatter_idx: bool = False):
    """topk_ids [T, top_k] (int32/int64, values in [0, num_experts)) -> (sorted_ids, expert_ids, num_post_pad)."""
    if expert_map is not None or pad_sorted_ids or return_scatter_idx:
        raise ValueError("moe_align_block_size: expert_map, pad_sorted_ids and scatter_idx are not supported here")
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be a 2-D int32/int64 tensor, got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    if block_size < 1 or num_experts < 1:
        raise ValueError(f"block_size and num_experts must be >= 1, got {block_size}, {num_experts}")
    ids = topk_ids.contiguous()
    numel = ids.numel()
    max_padded, max_blocks = padded_sizes(numel, num_experts, block_size)
    dev = ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=dev)
    _moe_align_kernel[(1,)](ids, sorted_ids, expert_ids, num_post_pad, cursor, numel, max_padded, max_blocks,
                            E=num_experts, BLOCK_E=triton.next_power_of_2(num_experts), BS=block_size,
                            CHUNK=CHUNK, num_warps=4)
    return sorted_ids, expert_ids, num_post_pad


def naive_moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Reference on the host: routes of each expert in ascending order, experts in ascending order."""
    flat = topk_ids.reshape(-1).cpu().long().tolist()
    numel = len(flat)
    max_padded, max_blocks = padded_sizes(numel, num_experts, block_size)
    sorted_ids, expert_ids, row = [numel] * max_padded, [-1] * max_blocks, 0
    for e in range(num_experts):
        routes = [i for i, x in enumerate(flat) if x == e]
        if not routes:
            continue
        sorted_ids[row:row + len(routes)] = routes
        n = -(-len(routes) // block_size)
        expert_ids[row // block_size:row // block_size + n] = [e] * n
        row += n * block_size
    as_tensor = lambda v: torch.tensor(v, dtype=torch.int32)
    return as_tensor(sorted_ids), as_tensor(expert_ids), as_tensor([row])


def alignment_mismatch(out, ref, block_size: int) -> str | None:
    """None when `out` is a valid alignment equal to `ref` up to the order of routes inside each block group;
    else a description of the first difference."""
    (s, e, n), (rs, re_, rn) = [tuple(t.cpu() for t in x) for x in (out, ref)]
    if int(n[0]) != int(rn[0]):
        return f"num_post_pad {int(n[0])} != {int(rn[0])}"
    used = int(rn[0])
    blocks = used // block_size
    if not torch.equal(e[:blocks], re_[:blocks]):
        return f"expert_ids differ: {e[:blocks].tolist()} vs {re_[:blocks].tolist()}"
    start = 0  # a group of one expert may span several blocks: compare groups
    while start < blocks:
        end = start
        while end < blocks and int(re_[end]) == int(re_[start]):
            end += 1
        sl = slice(start * block_size, end * block_size)
        if sorted(s[sl].tolist()) != sorted(rs[sl].tolist()):
            return f"routes of expert {int(re_[start])} differ"
        start = end
    if used < len(rs) and (s[used:] != rs[used:]).any():
        return "padding past num_post_pad differs"
    return None
