"""The persistent walk with its batch rows in two interleaved halves (walk.py: `head_walk(halves=...)`).

A walk of many rows spends most of each step waiting: its programs publish their keys, then wait for every other
program's before the next step's W1 gather can start. Here the rows are split into two halves that take turns:
half 0 publishes its step-k keys, then half 1 scores step k (its step k - 1 exchange done a half-step ago) and
publishes, and only then does half 0 read its step-k keys, which had the whole of half 1's scoring to arrive. Each
half walks exactly as head_walk_kernel walks BP rows (same scores, same keys, same tokens); only the order of the
programs' work and the exchange slots differ: slot (k % 2) * 2 + h holds half h's keys of step k.

The restricted case the plan gives it: several rows, tagged batched exchanges (probe / poll), fully resident
shards, Markov or gated Markov heads, split keys with one key reduction a step. Greedy and sampled, d2t, draft
logits (direct or compact) and the confidence head as head_walk_kernel has them. GPU only: the exchange spins.
"""
import triton
import triton.language as tl

from .kernel import (DRAFT_NOISE_SALT, _exchange_tagged, _fold_split, _load_u_tile, _publish_tagged,
                     _resident_d2t, _resident_tile, _score_tile, _split_key, _winner_ids)


@triton.jit
def _half_rows(req_ptr, temp_ptr, seed_ptr, h, num_rows, o_b, BP: tl.constexpr, HAS_REQ: tl.constexpr,
               SAMPLED: tl.constexpr):
    """Half h's rows: (live mask, request index or 0, live-request mask, temperature, seed), each [BP]."""
    row = h * BP + o_b
    m_b = row < num_rows
    if HAS_REQ:
        req = tl.load(req_ptr + row, mask=m_b, other=-1).to(tl.int64)
    else:
        req = tl.where(m_b, row, -1).to(tl.int64)
    valid = req >= 0
    req_safe = tl.where(valid, req, 0)
    temp = tl.full([BP], 0.0, dtype=tl.float32)
    seed0 = tl.full([BP], 0, dtype=tl.int64)
    if SAMPLED:
        temp = tl.load(temp_ptr + req_safe, mask=valid, other=0.0).to(tl.float32)
        seed0 = tl.load(seed_ptr + req_safe, mask=valid, other=0).to(tl.int64)
    return m_b, req_safe, valid, temp, seed0


@triton.jit
def head_walk_halves_kernel(
    u_ptr, stride_ub, stride_uk,
    w1_ptr, stride_w1,
    w2_ptr, stride_w2r, stride_w2v, w2_scale_ptr,
    first_ptr, tok_ptr, stride_tb,
    req_ptr, temp_ptr, seed_ptr, pos_ptr, stride_pb,
    d2t_ptr,
    dl_ptr, stride_dlr, stride_dlk,
    conf_h_ptr, conf_w_ptr, conf_ptr,
    gh_ptr, t1_ptr, stride_t1,
    keys_ptr, gen_ptr, err_ptr,
    num_rows, num_steps, vocab, logit_scale,
    R: tl.constexpr, BP: tl.constexpr, RT: tl.constexpr, RES_TILES: tl.constexpr, CHUNK_ROWS: tl.constexpr,
    NUM_PROGS: tl.constexpr, PP: tl.constexpr, HEAD: tl.constexpr,
    SAMPLED: tl.constexpr, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr, STORE_LOGITS: tl.constexpr,
    HAS_CONF: tl.constexpr, W2_SCALED: tl.constexpr, SPIN_LIMIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EXCHANGE: tl.constexpr, SCALED: tl.constexpr, PAIR_REDUCE: tl.constexpr, D2T_INCREASING: tl.constexpr = False,
):
    # BP: rows of one half (the walk's 2 * BP rows, num_rows of them live). The keys buffer holds 4 slots of
    # [NUM_PROGS, BP]. HEAD: 0 markov, 1 gated markov. EXCHANGE: 3 probe / 4 poll (kernel._exchange_tagged).
    KEY_BY_TARGET: tl.constexpr = SAMPLED or (HAS_D2T and D2T_INCREASING)
    ORDERED: tl.constexpr = not (HAS_D2T and KEY_BY_TARGET) or D2T_INCREASING
    pid = tl.program_id(0)
    o_b = tl.arange(0, BP)
    o_r = tl.arange(0, R)
    o_t = tl.arange(0, RT)
    shard_begin = pid * CHUNK_ROWS
    shard_end = tl.minimum(shard_begin + CHUNK_ROWS, vocab)
    w2_dot_ty = w2_ptr.dtype.element_ty
    if W2_SCALED:
        w2_dot_ty = tl.bfloat16

    # Resident tiles (and their d2t offsets): loaded once, shared by both halves for the whole walk.
    w_res0 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + o_t, shard_end, o_r)
    if RES_TILES >= 2:
        w_res1 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + RT + o_t, shard_end, o_r)
    if RES_TILES >= 3:
        w_res2 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + 2 * RT + o_t, shard_end, o_r)
    if RES_TILES >= 4:
        w_res3 = _resident_tile(w2_ptr, stride_w2r, stride_w2v, shard_begin + 3 * RT + o_t, shard_end, o_r)
    d2t_r0 = _resident_d2t(d2t_ptr, shard_begin + o_t, shard_end) if HAS_D2T else None
    d2t_r1 = _resident_d2t(d2t_ptr, shard_begin + RT + o_t, shard_end) if HAS_D2T and RES_TILES >= 2 else None
    d2t_r2 = _resident_d2t(d2t_ptr, shard_begin + 2 * RT + o_t, shard_end) if HAS_D2T and RES_TILES >= 3 else None
    d2t_r3 = _resident_d2t(d2t_ptr, shard_begin + 3 * RT + o_t, shard_end) if HAS_D2T and RES_TILES >= 4 else None
    if HAS_D2T and KEY_BY_TARGET:
        fallback_id = shard_begin + tl.load(d2t_ptr + shard_begin).to(tl.int32)
    else:
        fallback_id = shard_begin
    gen = tl.load(gen_ptr + pid)

    for ph in range(0, 2 * num_steps):
        k = ph // 2
        h = ph % 2
        row0 = h * BP
        m_b, req_safe, valid, temp, seed0 = _half_rows(req_ptr, temp_ptr, seed_ptr, h, num_rows, o_b, BP, HAS_REQ,
                                                       SAMPLED)
        rows_live = num_rows - row0
        # Base logits first: their loads travel while this half's previous exchange is read.
        u_h = u_ptr + row0 * stride_ub
        u_res0 = _load_u_tile(u_h, stride_ub, stride_uk, k, shard_begin + o_t, shard_end, o_b, m_b, False)
        if RES_TILES >= 2:
            u_res1 = _load_u_tile(u_h, stride_ub, stride_uk, k, shard_begin + RT + o_t, shard_end, o_b, m_b, False)
        if RES_TILES >= 3:
            u_res2 = _load_u_tile(u_h, stride_ub, stride_uk, k, shard_begin + 2 * RT + o_t, shard_end, o_b, m_b,
                                  False)
        if RES_TILES >= 4:
            u_res3 = _load_u_tile(u_h, stride_ub, stride_uk, k, shard_begin + 3 * RT + o_t, shard_end, o_b, m_b,
                                  False)
        if k == 0:
            x = tl.load(first_ptr + row0 + o_b, mask=m_b, other=0).to(tl.int64)
        else:
            # This half's step k - 1 keys, published before the other half's whole step k - 1 ran.
            tag_prev = (((gen + k - 1) % 16383) + 1).to(tl.int32)
            winners = _exchange_tagged(keys_ptr, ((k - 1) % 2) * 2 + h, pid, o_b, tag_prev, None, err_ptr, rows_live,
                                       w1_ptr, stride_w1, NUM_PROGS, PP, BP, BP, EXCHANGE, False, R, SPIN_LIMIT)
            x = _winner_ids(None, winners, o_b, m_b, d2t_ptr, HAS_D2T, KEY_BY_TARGET, BP)
            if pid == 0:
                tl.store(tok_ptr + (row0 + o_b) * stride_tb + (k - 1), x, mask=m_b)
        # [R, BP]: W1[x] of every row of the half, transposed for the [rows, r] @ [r, BP] products.
        e = tl.load(w1_ptr + x[None, :] * stride_w1 + o_r[:, None], mask=m_b[None, :], other=0.0).to(tl.float32)
        if HAS_CONF:
            if pid == 0:
                wc = tl.load(conf_w_ptr + o_r)
                ch = tl.load(conf_h_ptr + (row0 + o_b) * num_steps + k, mask=m_b, other=0.0)
                tl.store(conf_ptr + (row0 + o_b) * num_steps + k, tl.sigmoid(ch + tl.sum(e * wc[:, None], axis=0)),
                         mask=m_b)
        if HEAD == 0:
            m = e
        else:
            gh = tl.load(gh_ptr + ((row0 + o_b)[None, :] * num_steps + k) * R + o_r[:, None], mask=m_b[None, :],
                         other=0.0)
            ge = tl.load(t1_ptr + x[None, :] * stride_t1 + o_r[:, None]).to(tl.float32)
            m = tl.sigmoid(gh + ge) * e
        m_dot = m.to(w2_dot_ty)

        pos = tl.full([BP], 0, dtype=tl.int64)
        seed = seed0
        if SAMPLED:
            pos = tl.load(pos_ptr + (row0 + o_b) * stride_pb + k, mask=m_b, other=0).to(tl.int64) + DRAFT_NOISE_SALT
            seed = seed0 ^ (tl.cast(k, tl.int64) << 32)
        # A compact draft-logits buffer is indexed by batch row (the direct cache by request, req_safe).
        dl_h = dl_ptr + row0 * stride_dlr if STORE_LOGITS == 2 else dl_ptr
        keys, ids = _score_tile(
            w_res0, u_res0, None, m_dot, shard_begin + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos, u_h,
            stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_h, stride_dlr, stride_dlk, logit_scale, shard_end,
            SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, False, SCALED, True,
            d2t_rows=d2t_r0)
        res_v = keys
        res_id = ids[:, None] + tl.zeros([RT, BP], dtype=tl.int32)
        if RES_TILES >= 2:
            keys, ids = _score_tile(
                w_res1, u_res1, None, m_dot, shard_begin + RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed, pos,
                u_h, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_h, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, False, SCALED,
                True, d2t_rows=d2t_r1)
            res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
        if RES_TILES >= 3:
            keys, ids = _score_tile(
                w_res2, u_res2, None, m_dot, shard_begin + 2 * RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed,
                pos, u_h, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_h, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, False, SCALED,
                True, d2t_rows=d2t_r2)
            res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
        if RES_TILES >= 4:
            keys, ids = _score_tile(
                w_res3, u_res3, None, m_dot, shard_begin + 3 * RT + o_t, k, o_b, m_b, valid, req_safe, temp, seed,
                pos, u_h, stride_ub, stride_uk, w2_scale_ptr, d2t_ptr, dl_h, stride_dlr, stride_dlk, logit_scale,
                shard_end, SAMPLED, HAS_D2T, STORE_LOGITS, W2_SCALED, KEY_BY_TARGET, DOT_PRECISION, False, SCALED,
                True, d2t_rows=d2t_r3)
            res_v, res_id = _fold_split(res_v, res_id, keys, ids, ORDERED)
        best = _split_key(res_v, res_id, fallback_id, PAIR_REDUCE)
        tag = (((gen + k) % 16383) + 1).to(tl.int32)
        _publish_tagged(keys_ptr, (k % 2) * 2 + h, pid, best, tag, NUM_PROGS, BP)

    # The last step's tokens, half by half.
    tag_last = (((gen + num_steps - 1) % 16383) + 1).to(tl.int32)
    for h in tl.static_range(2):
        m_b = h * BP + o_b < num_rows
        winners = _exchange_tagged(keys_ptr, ((num_steps - 1) % 2) * 2 + h, pid, o_b, tag_last, None, err_ptr,
                                   num_rows - h * BP, w1_ptr, stride_w1, NUM_PROGS, PP, BP, BP, EXCHANGE, False, R,
                                   SPIN_LIMIT)
        x = _winner_ids(None, winners, o_b, m_b, d2t_ptr, HAS_D2T, KEY_BY_TARGET, BP)
        if pid == 0:
            tl.store(tok_ptr + (h * BP + o_b) * stride_tb + (num_steps - 1), x, mask=m_b)
    tl.store(gen_ptr + pid, gen + num_steps)
