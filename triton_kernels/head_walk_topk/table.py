"""The top-k walk by a bias table: every step's Markov bias for every pair of candidates, then a chain of K-wide picks.

In the top-k mode a step's token is one of that step's K candidates, so the bias step k+1 adds is one of K rows
known before the walk: row i of  M_{k+1} = W1[candidates_k] . W2[candidates_{k+1}]^T  ([K, K], scaled and rounded as
vLLM's baddbmm_ rounds its product). `topk_bias_table_kernel` computes all of them at once, one program a (row, step)
(the anchor's single row for step 0), with the steps' Gumbel noise; `topk_table_chain_kernel` then walks each row:
a step is the previous pick's row of M, the K corrected logits and one CTA-wide max. No W1 gather and no dot product
waits on the chain any more; what does is one 4K-byte row of M (or, with TILE_AHEAD, nothing off chip: the next
step's whole table is loaded while this step picks).

The K^2 table is why it is for K <= walk.TABLE_MAX_TOPK: [B, N, K, K] fp32 (15.7 MB at 64 rows x 15 steps x K 64).
"""
import torch
import triton
import triton.language as tl

from hybridspec_kernels.head_walk.kernel import DRAFT_NOISE_SALT, ID_MASK, _gumbel_noise, _ordered_keys, _step_seed

from .._pdl import wait_for_the_launch_before
from .select import pdl_launch
from .walk import (
    NO_KEY,
    _corrected_scores,
    _forget_last_walk,
    _row_request,
    _step_candidates,
    _target_ids,
    stored_outputs,
)

# Warps of a chain program, greedy / sampled (the table's programs take TABLE_NUM_WARPS), and r a table program
# multiplies at once. Greedy: one warp, whose max is shuffles alone (4 warps: 9 CTA barriers a step for the three
# maxima the chain first took), fastest at every ladder point (session 23 calls 1, 3, 5: 32k b1 with the select 24.3
# us at 1 warp, 25.2 at 2); sampled: two (its cache stores and noise loads spread over them: 28.7 vs 29.6 at 32k b1,
# 120.1 vs 121.7 at 152k b32, 250.4 vs 251.7 at 248k b64).
CHAIN_NUM_WARPS = 1
SAMPLED_CHAIN_NUM_WARPS = 2
TABLE_NUM_WARPS = 4
TABLE_BLOCK_R = 64
# Bits of a pick's slot below its key's id: (score, ID_MASK - id) keys leave 14 of their low 32 bits free.
SLOT_BITS = tl.constexpr(12)


@triton.jit
def topk_bias_table_kernel(
    cand_ptr, stride_cb, stride_ck,
    w1_ptr, stride_w1,
    w2_ptr, stride_w2,
    first_ptr, stride_first,
    d2t_ptr,
    table_ptr, stride_tb, stride_tk,
    noise_ptr, stride_nb, stride_nk,
    req_ptr, seed_ptr, pos_ptr, stride_pb,
    logit_scale, topk, rank, target_vocab,
    KP: tl.constexpr, BLOCK_R: tl.constexpr, OUT_TY: tl.constexpr,
    SAMPLED: tl.constexpr, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr, SCALED: tl.constexpr,
    ROUND_DOT: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (b, k): table[b, k] = the bias rows of step k ([KP, KP] fp32, row i for previous candidate i, row 0 the
    anchor's at k = 0) and, sampled, noise[b, k] = the Gumbel noise of step k's candidates ([KP] fp32)."""
    wait_for_the_launch_before(PDL)
    b = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    o_i = tl.arange(0, KP)
    m_j = o_i < topk
    ids = tl.load(cand_ptr + b * stride_cb + k * stride_ck + o_i, mask=m_j, other=0).to(tl.int64)
    targets = _target_ids(ids, d2t_ptr, m_j, HAS_D2T)
    # The previous step's candidates (their target ids index W1), or the anchor alone: clamped into W1 as the loop
    # walk does (a padding row's anchor may be anything).
    m_prev = tl.where(k > 0, m_j, False)  # where: the interpreter rejects block & scalar
    prev = _target_ids(tl.load(cand_ptr + b * stride_cb + (k - 1) * stride_ck + o_i, mask=m_prev, other=0)
                       .to(tl.int64), d2t_ptr, m_prev, HAS_D2T)
    anchor = tl.minimum(tl.maximum(tl.load(first_ptr + b * stride_first).to(tl.int64), 0), target_vocab - 1)
    prev = tl.where(k > 0, prev, anchor)
    m_i = tl.where(k > 0, m_j, o_i == 0)
    acc = tl.zeros([KP, KP], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        o_r = r0 + tl.arange(0, BLOCK_R)
        m_r = o_r < rank
        e = tl.load(w1_ptr + prev[:, None] * stride_w1 + o_r[None, :], mask=m_i[:, None] & m_r[None, :], other=0.0)
        w = tl.load(w2_ptr + ids[:, None] * stride_w2 + o_r[None, :], mask=m_j[:, None] & m_r[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(e, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(e, tl.trans(w), acc)
    if SCALED:
        acc = acc * logit_scale
    if ROUND_DOT:  # vLLM's baddbmm_ on CUDA: the scaled product rounded to the logits' dtype before the sum
        acc = acc.to(OUT_TY).to(tl.float32)
    tl.store(table_ptr + b * stride_tb + k * stride_tk + o_i[:, None] * KP + o_i[None, :], acc)
    if SAMPLED:
        if HAS_REQ:
            req = tl.load(req_ptr + b).to(tl.int64)
        else:
            req = b
        seed = tl.where(req >= 0, tl.load(seed_ptr + tl.maximum(req, 0)).to(tl.int64), 0)
        pos = tl.load(pos_ptr + b * stride_pb + k).to(tl.int64) + DRAFT_NOISE_SALT
        tl.store(noise_ptr + b * stride_nb + k * stride_nk + o_i, _gumbel_noise(_step_seed(seed, k), pos, targets))


@triton.jit
def topk_table_chain_kernel(
    values_ptr, stride_vb, stride_vk,
    cand_ptr, stride_cb, stride_ck,
    table_ptr, stride_tb, stride_tk,
    noise_ptr, stride_nb, stride_nk,
    req_ptr, temp_ptr,
    d2t_ptr,
    out_ptr, stride_ob,
    cl_ptr, stride_clb, stride_clk,
    dl_ptr, stride_dlr, stride_dlk,
    col_ptr, stride_colr, stride_colk,
    num_steps, topk, width,
    KP: tl.constexpr, NP: tl.constexpr, TILE_AHEAD: tl.constexpr,
    SAMPLED: tl.constexpr, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr,
    STORE_CORRECTED: tl.constexpr, STORE_CACHE: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program b walks batch row b through all steps by the bias table; outputs as head_walk_topk_kernel's."""
    wait_for_the_launch_before(PDL)
    b = tl.program_id(0).to(tl.int64)
    o_j = tl.arange(0, KP)
    m_k = o_j < topk
    valid, req_safe, temp, hot = _row_request(req_ptr, temp_ptr, b, HAS_REQ, SAMPLED)
    out_ty: tl.constexpr = values_ptr.dtype.element_ty
    if STORE_CACHE:
        _forget_last_walk(dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr, stride_colk, req_safe, valid,
                          num_steps, topk, width, o_j, KP, 1)

    row = tl.zeros([], dtype=tl.int32)  # the previous pick's row of the step's table (the anchor's: 0)
    table_row = table_ptr + b * stride_tb
    if TILE_AHEAD:
        o_i = tl.arange(0, KP)
        tile_next = tl.load(table_row + o_i[:, None] * KP + o_j[None, :])
    for k in range(num_steps):
        ids, vals, targets = _step_candidates(values_ptr + b * stride_vb + k * stride_vk,
                                              cand_ptr + b * stride_cb + k * stride_ck, d2t_ptr, o_j, m_k, HAS_D2T)
        if SAMPLED:
            noise = tl.load(noise_ptr + b * stride_nb + k * stride_nk + o_j)
        else:
            noise = None
        if TILE_AHEAD:
            tile = tile_next
            tile_next = tl.load(table_row + (k + 1) * stride_tk + o_i[:, None] * KP + o_j[None, :],
                                mask=o_i[:, None] * 0 + k + 1 < num_steps, other=0.0)
            # the one row of the previous pick (max: exact, -0.0 kept)
            dot = tl.max(tl.where(o_i[:, None] == row, tile, float("-inf")), axis=0)
        else:
            dot = tl.load(table_row + k * stride_tk + row * KP + o_j)
        scored, tie_ids = _corrected_scores(
            dot, vals, ids, targets, noise, o_j, m_k, b, k, valid, req_safe, hot, temp,
            cl_ptr, stride_clb, stride_clk, dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr, stride_colk,
            width, 1.0, out_ty, SAMPLED, False, False, STORE_CORRECTED, STORE_CACHE)
        # One max a step: the slot rides below the (score, -id) key (ids are distinct, so it never decides)
        key = _ordered_keys(scored, tie_ids)
        key = (key >> 32 << 32) | ((key & ID_MASK) << SLOT_BITS) | o_j
        key = tl.where(m_k, key, NO_KEY)  # lanes past K never win, even over candidates that all score -inf
        row = (tl.max(key, axis=0) & (KP - 1)).to(tl.int32)
        tl.store(out_ptr + b * stride_ob + k, row)
    # the picks' slots -> target ids, every step at once (off the chain)
    tl.debug_barrier()  # the slots, stored by other threads
    o_n = tl.arange(0, NP)
    m_n = o_n < num_steps
    slots = tl.load(out_ptr + b * stride_ob + o_n, mask=m_n, other=0)
    ids = tl.load(cand_ptr + b * stride_cb + o_n * stride_ck + slots, mask=m_n, other=0).to(tl.int64)
    targets = _target_ids(ids, d2t_ptr, m_n, HAS_D2T)
    tl.debug_barrier()  # every slot read before any is overwritten
    tl.store(out_ptr + b * stride_ob + o_n, targets, mask=m_n)


def walk_by_table(*args, **kwargs) -> None:
    """head_walk_topk's table forms on its checked arguments: `table_launches`, launched."""
    for _, launch in table_launches(*args, **kwargs):
        launch()


def table_launches(values, cand, w1, w2_rows, first_tokens, out, temperature, seeds, positions, req_indices,
                   draft_to_target, logit_scale, draft_logits, cached_columns, corrected_out, round_dot, *,
                   ahead=False, num_warps=None, pdl=None) -> list:
    """The table forms' launches in order, as (name, launch), unlaunched (the bench times them); the arguments are
    head_walk_topk's, checked (values / cand: [B, N, K], candidates contiguous)."""
    num_rows, num_steps, topk = values.shape
    rank = w1.shape[1]
    device = values.device
    sampled = temperature is not None
    store_cache = draft_logits is not None
    kp = max(16, triton.next_power_of_2(topk))  # tl.dot's smallest tile
    table = torch.empty(num_rows, num_steps, kp, kp, dtype=torch.float32, device=device)
    noise = torch.empty(num_rows, num_steps, kp, dtype=torch.float32, device=device) if sampled else table
    dummy = out
    flags = dict(SAMPLED=sampled, HAS_REQ=req_indices is not None, HAS_D2T=draft_to_target is not None)
    pdl = pdl_launch(device, pdl)
    out_ty = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[values.dtype]
    table_launch = lambda: topk_bias_table_kernel[(num_rows, num_steps)](  # noqa: E731
        cand, cand.stride(0), cand.stride(1),
        w1, w1.stride(0),
        w2_rows, w2_rows.stride(0),
        first_tokens, first_tokens.stride(0),
        draft_to_target if draft_to_target is not None else dummy,
        table, table.stride(0), table.stride(1),
        noise, noise.stride(0), noise.stride(1),
        req_indices if req_indices is not None else dummy,
        seeds if sampled else dummy,
        positions if sampled else dummy, positions.stride(0) if sampled else 0,
        logit_scale, topk, rank, w1.shape[0],
        KP=kp, BLOCK_R=min(TABLE_BLOCK_R, max(16, triton.next_power_of_2(rank))), OUT_TY=out_ty,
        SCALED=logit_scale != 1.0, ROUND_DOT=round_dot, IEEE=w1.dtype == torch.float32, **flags,
        num_warps=TABLE_NUM_WARPS, **pdl,
    )
    chain_launch = lambda: topk_table_chain_kernel[(num_rows,)](  # noqa: E731
        values, values.stride(0), values.stride(1),
        cand, cand.stride(0), cand.stride(1),
        table, table.stride(0), table.stride(1),
        noise, noise.stride(0), noise.stride(1),
        req_indices if req_indices is not None else dummy,
        temperature if sampled else dummy,
        draft_to_target if draft_to_target is not None else dummy,
        out, out.stride(0),
        *stored_outputs(out, corrected_out, draft_logits, cached_columns),
        num_steps, topk, draft_logits.shape[2] if store_cache else 0,
        KP=kp, NP=triton.next_power_of_2(num_steps), TILE_AHEAD=ahead, STORE_CORRECTED=corrected_out is not None,
        STORE_CACHE=store_cache, **flags,
        num_warps=num_warps or (SAMPLED_CHAIN_NUM_WARPS if sampled else CHAIN_NUM_WARPS), **pdl,
    )
    return [("table", table_launch), ("chain", chain_launch)]
