"""DSpark's top-k Markov walk (`dspark_draft_topk`) in one or two launches: `head_walk_topk`.

vLLM's top-k mode keeps, at each draft step, only the K largest base logits as candidates and adds the Markov bias
to those alone (`_sample_sequential_topk`): every step gathers K rows of W2, a batched GEMV, a scatter into a row of
-inf and vLLM's sampler over the whole vocabulary, about ten launches a step. The candidates of all N steps are known
before the walk (one torch.topk), so nothing but the previous token links two steps, and one row's walk never needs
another row's: here each batch row is one program that walks all N steps alone (no grid-wide exchange, unlike
head_walk's full-vocabulary walk). A step is: W1[previous token] (the only load that waits on the chain; the K
W2 rows, base values, d2t offsets and Gumbel noise of the step do not), K dot products, one rounding to the logits'
dtype, the noise (sampled), one CTA-wide max of (score, -id) keys. That is the "loop" form. Since a step's token
is one of its K candidates, the bias of every step for every previous candidate can be computed before the walk, all
steps at once ([K, K] a step: table.py); the "table" form (the default for K <= TABLE_MAX_TOPK) then walks each row by
reading one row of that table a step, and no W1 gather or dot product waits on the chain.

The draft logits cache (probabilistic drafting) holds whole target-vocabulary rows, -inf outside the candidates.
Writing N x V entries a row every walk, as vLLM's sampler does, would cost more than the walk at a large vocabulary;
instead the cache is filled with -inf once, and every walk first puts -inf back at the columns the last walk of
that request slot wrote (`cached_columns`, as vLLM's DFlash2 candidate cache does), then writes its K.
"""
import torch
import triton
import triton.language as tl

from hybridspec_kernels.head_walk.kernel import (
    DRAFT_NOISE_SALT,
    ID_MASK,
    MAX_TOKENS,
    _gumbel_noise,
    _ordered_keys,
    _step_seed,
)

from .naive import default_round_dot

MAX_TOPK = 4096
MAX_RANK = 1024
# Candidates scored at once (a [CHUNK, r] tile of W2 rows in registers); K above it loops over chunks.
CHUNK = 64
# One program's warps. Ladder (H200, session 21 calls 1-2, K 64, walk alone, us per 15-step walk): greedy 4 / 8 /
# 16 warps 82.9-92.7 / - / 27.6-32.1; sampled 71.9-85.9 / - / 43.0-52.1; a prefetch of the next step's candidates
# (loaded as a step starts, W2 rows gathered after its dot) 30.0-32.3 / 46.4-50.8 at 16 warps: not faster, removed.
# L2 prefetches (`prefetch.global.L2`) of each step's candidates' W1 rows and the next step's W2 rows: slower warm and
# with the L2 flushed before each replay (session 22 call 16, 32k b1 greedy incl. the select: 67.3 / 73.3 us against
# 41.1 / 52.9), removed.
NUM_WARPS = 16
# A key below every candidate's: lanes past K never win a max, even over candidates that all score -inf.
NO_KEY = tl.constexpr(-(1 << 63))
FORMS = ("loop", "table", "table_ahead")
# The table forms' [B, N, K, K] bias table (K^2 dot products a step instead of K) is for small K.
TABLE_MAX_TOPK = 128


@triton.jit
def head_walk_topk_kernel(
    values_ptr, stride_vb, stride_vk,
    cand_ptr, stride_cb, stride_ck,
    w1_ptr, stride_w1,
    w2_ptr, stride_w2,
    first_ptr, stride_first,
    req_ptr, temp_ptr, seed_ptr, pos_ptr, stride_pb,
    d2t_ptr,
    out_ptr, stride_ob,
    cl_ptr, stride_clb, stride_clk,
    dl_ptr, stride_dlr, stride_dlk,
    col_ptr, stride_colr, stride_colk,
    logit_scale, num_steps, topk, rank, width, target_vocab,
    R: tl.constexpr, KC: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    SAMPLED: tl.constexpr, HAS_REQ: tl.constexpr, HAS_D2T: tl.constexpr, SCALED: tl.constexpr,
    ROUND_DOT: tl.constexpr, STORE_CORRECTED: tl.constexpr, STORE_CACHE: tl.constexpr,
):
    """Program b walks batch row b through all steps.

    values [B, N, K] / cand [B, N, K]: the steps' top-k base logits and draft ids; w1 [V_t, r]; w2 [V, r] rows;
    out [B, N] int64 target ids; cl [B, N, K] corrected logits (STORE_CORRECTED); dl [reqs, N, width] the draft
    logits cache and col [reqs, N, K] the target columns its slot's last walk wrote (STORE_CACHE).
    """
    b = tl.program_id(0).to(tl.int64)
    o_r = tl.arange(0, R)
    m_r = o_r < rank
    o_j = tl.arange(0, KC)
    valid, req_safe, temp, hot = _row_request(req_ptr, temp_ptr, b, HAS_REQ, SAMPLED)
    seed = req_safe * 0
    if SAMPLED:
        seed = tl.where(valid, tl.load(seed_ptr + req_safe).to(tl.int64), 0)
    out_ty: tl.constexpr = values_ptr.dtype.element_ty
    if STORE_CACHE:
        _forget_last_walk(dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr, stride_colk, req_safe, valid,
                          num_steps, topk, width, o_j, KC, NUM_CHUNKS)

    # The anchor of a padding row may be anything: kept inside W1 (every later token is a candidate's).
    prev = tl.minimum(tl.maximum(tl.load(first_ptr + b * stride_first).to(tl.int64), 0), target_vocab - 1)
    for k in range(num_steps):
        e = tl.load(w1_ptr + prev * stride_w1 + o_r, mask=m_r, other=0.0).to(tl.float32)
        if SAMPLED:
            step_seed = _step_seed(seed, k)
            pos = tl.load(pos_ptr + b * stride_pb + k).to(tl.int64) + DRAFT_NOISE_SALT
        for c in tl.static_range(NUM_CHUNKS):
            o_k = c * KC + o_j
            m_k = o_k < topk
            ids, vals, targets = _step_candidates(values_ptr + b * stride_vb + k * stride_vk,
                                                  cand_ptr + b * stride_cb + k * stride_ck, d2t_ptr, o_k, m_k, HAS_D2T)
            w = tl.load(w2_ptr + ids[:, None] * stride_w2 + o_r[None, :], mask=m_k[:, None] & m_r[None, :],
                        other=0.0)
            if SAMPLED:  # written before the dot: it does not wait on W1[previous token]
                noise = _gumbel_noise(step_seed, pos, targets)
            else:
                noise = None
            dot = tl.sum(w.to(tl.float32) * e[None, :], axis=1)
            scored, tie_ids = _corrected_scores(
                dot, vals, ids, targets, noise, o_k, m_k, b, k, valid, req_safe, hot, temp,
                cl_ptr, stride_clb, stride_clk, dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr, stride_colk,
                width, logit_scale, out_ty, SAMPLED, SCALED, ROUND_DOT, STORE_CORRECTED, STORE_CACHE)
            keys = tl.where(m_k, _ordered_keys(scored, tie_ids), NO_KEY)  # lanes past K never win
            chunk_best = tl.max(keys, axis=0)
            chunk_target = tl.max(tl.where(keys == chunk_best, targets, -1), axis=0)
            if c == 0:
                best, best_target = chunk_best, chunk_target
            else:
                best_target = tl.where(chunk_best > best, chunk_target, best_target)
                best = tl.maximum(best, chunk_best)
        tl.store(out_ptr + b * stride_ob + k, best_target)
        prev = best_target


@triton.jit
def _target_ids(ids, d2t_ptr, mask, HAS_D2T: tl.constexpr):
    """Target ids of draft ids: id + d2t[id] (vLLM's d2t), or the ids themselves."""
    if HAS_D2T:
        return ids + tl.load(d2t_ptr + ids, mask=mask, other=0).to(tl.int64)
    return ids


@triton.jit
def _step_candidates(values_row, cand_row, d2t_ptr, o_k, m_k, HAS_D2T: tl.constexpr):
    """Slots o_k (m_k: below K) of one (row, step)'s candidates: draft ids, base values (fp32), target ids."""
    ids = tl.load(cand_row + o_k, mask=m_k, other=0).to(tl.int64)
    vals = tl.load(values_row + o_k, mask=m_k, other=0.0).to(tl.float32)
    return ids, vals, _target_ids(ids, d2t_ptr, m_k, HAS_D2T)


@triton.jit
def _row_request(req_ptr, temp_ptr, b, HAS_REQ: tl.constexpr, SAMPLED: tl.constexpr):
    """Row b's request slot: (valid: not a padding row, the slot clamped to >= 0, its temperature (0: greedy; a
    padding row's too), temperature != 0)."""
    if HAS_REQ:
        req = tl.load(req_ptr + b).to(tl.int64)
    else:
        req = b
    valid = req >= 0
    req_safe = tl.maximum(req, 0)
    temp = 0.0
    if SAMPLED:
        temp = tl.where(valid, tl.load(temp_ptr + req_safe).to(tl.float32), 0.0)
    return valid, req_safe, temp, temp != 0.0


@triton.jit
def _forget_last_walk(dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr, stride_colk, req_safe, valid, num_steps,
                      topk, width, o_j, KC: tl.constexpr, NUM_CHUNKS: tl.constexpr):
    """-inf back in the draft-logits cache where this slot's last walk wrote, before any of this walk's stores
    (another thread of the program may write the same column after: the barrier orders them)."""
    for k in range(num_steps):
        for c in tl.static_range(NUM_CHUNKS):
            o_k = c * KC + o_j
            m_old = tl.where(valid, o_k < topk, False)  # where: the interpreter rejects block & scalar
            old = tl.load(col_ptr + req_safe * stride_colr + k * stride_colk + o_k, mask=m_old, other=-1)
            m_old = m_old & (old >= 0) & (old < width)
            tl.store(dl_ptr + req_safe * stride_dlr + k * stride_dlk + old, float("-inf"), mask=m_old)
    tl.debug_barrier()


@triton.jit
def _corrected_scores(dot, vals, ids, targets, noise, o_k, m_k, b, k, valid, req_safe, hot, temp,
                      cl_ptr, stride_clb, stride_clk, dl_ptr, stride_dlr, stride_dlk, col_ptr, stride_colr,
                      stride_colk, width, logit_scale, out_ty: tl.constexpr, SAMPLED: tl.constexpr,
                      SCALED: tl.constexpr, ROUND_DOT: tl.constexpr, STORE_CORRECTED: tl.constexpr,
                      STORE_CACHE: tl.constexpr):
    """Candidates' corrected logits (rounded as vLLM's baddbmm_) and their stores; returns what the pick maximises
    (-inf off the candidates) and the ids that break its ties (the sampler's row: target ids; greedy: draft ids)."""
    if SCALED:
        dot = dot * logit_scale
    if ROUND_DOT:  # CUDA: the (scaled) product is rounded to the logits' dtype, then the values added and rounded
        dot = dot.to(out_ty).to(tl.float32)
    corrected = (vals + dot).to(out_ty).to(tl.float32)
    if STORE_CORRECTED:
        tl.store(cl_ptr + b * stride_clb + k * stride_clk + o_k, corrected, mask=m_k)
    if STORE_CACHE:
        m_store = tl.where(valid, m_k & (targets < width), False)  # where: the interpreter rejects block & scalar
        tl.store(dl_ptr + req_safe * stride_dlr + k * stride_dlk + targets, corrected.to(dl_ptr.dtype.element_ty),
                 mask=m_store)
        tl.store(col_ptr + req_safe * stride_colr + k * stride_colk + o_k, targets, mask=m_store)
    if SAMPLED:
        scored = tl.where(hot, corrected / tl.where(hot, temp, 1.0) + noise, corrected)
        return tl.where(m_k, scored, float("-inf")), targets
    else:
        return tl.where(m_k, corrected, float("-inf")), ids


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"head_walk_topk: {msg}")


def head_walk_topk(
    base_values: torch.Tensor,
    candidates: torch.Tensor,
    w1: torch.Tensor,
    w2_rows: torch.Tensor,
    first_tokens: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    req_indices: torch.Tensor | None = None,
    draft_to_target: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    draft_logits: torch.Tensor | None = None,
    cached_columns: torch.Tensor | None = None,
    corrected_out: torch.Tensor | None = None,
    chunk: int = CHUNK,
    num_warps: int | None = None,
    round_dot: bool | None = None,
    form: str = "auto",
    pdl: bool | None = None,
) -> torch.Tensor:
    """Walk DSpark's top-k Markov head for B rows x N steps (one launch, or two by the bias table); proposes vLLM's
    drafts.

    Args:
        base_values: [B, N, K] the K largest base logits of each step (torch.topk values; fp32 / fp16 / bf16, the
            dtype vLLM's corrected logits are rounded to).
        candidates: [B, N, K] int64 their draft ids (torch.topk indices), each < V.
        w1: [V_target, r] Markov embedding table (indexed by target ids); w2_rows: [V, r] Markov projection rows
            (vLLM's `markov_w2.weight`), the same dtype. r <= 1024; rows contiguous.
        first_tokens: [B] target id of each row's anchor token.
        temperature, seeds: per request (float / int64, indexed by req_indices[b] or b): a sampled walk (vLLM's
            seeded Gumbel-max, step-keyed); None: greedy. positions: [B, N] int64 keys of the draws (sampled).
        req_indices: [B] each row's request slot, -1 for padding rows (temperature 0, no cache store).
        draft_to_target: [V] int64 vLLM's d2t (target id = draft id + d2t[draft id]); None: the same ids.
        draft_logits: [slots, >= N, width] the cache vLLM's rejection sampler reads: this walk writes the K
            corrected logits of each valid row's slot at their target columns and puts -inf back at the columns
            in cached_columns ([slots, >= N, K] int64, -1 = none), which it then updates. The rest of the cache must
            hold -inf (fill it once); then every row reads as vLLM's dense top-k row.
        corrected_out: [B, N, K] fp32 receives the corrected candidate logits (optional).
        out: [B, N] int64 receives the drafts (target ids).
        round_dot: how vLLM's `values.clone().baddbmm_(W2[ids], e, alpha=scale)` rounds where it runs: True (the
            scaled product rounded to the logits' dtype, then the values added and rounded again), False (one rounding
            of the fp32 sum); None: `default_round_dot` (measured: True on CUDA for K a multiple of 8).
        form: "loop" (each step gathers W1[previous token] and scores its K candidates), "table" (first every
            step's [K, K] bias table for every pair of candidates, one program a row and step, then a chain that
            reads the previous pick's row of it), "table_ahead" (the chain holds the next step's whole table while
            it picks), or "auto" (`default_form`). The table forms need K <= TABLE_MAX_TOPK.
        chunk, num_warps: launch options (loop: candidates scored at once; warps of a program, None: the form's).
        pdl: the table forms' two launches by programmatic dependent launch (select.pdl_launch; None: its default).

    Returns:
        out.
    """
    _check(base_values.dim() == 3 and candidates.shape == base_values.shape,
           f"base_values {tuple(base_values.shape)} and candidates {tuple(candidates.shape)} must be the same [B, N, K]")
    num_rows, num_steps, topk = base_values.shape
    _check(1 <= topk <= MAX_TOPK, f"top-k {topk} outside 1..{MAX_TOPK}")
    _check(base_values.dtype in (torch.float32, torch.float16, torch.bfloat16),
           f"base_values in {base_values.dtype} (float32, float16 or bfloat16)")
    _check(candidates.dtype in (torch.int64, torch.int32), f"candidates in {candidates.dtype} (int64 or int32)")
    _check(w1.dim() == 2 and w2_rows.dim() == 2 and w1.shape[1] == w2_rows.shape[1],
           f"w1 {tuple(w1.shape)} and w2_rows {tuple(w2_rows.shape)} must be [V_target, r] and [V, r]")
    rank = w1.shape[1]
    _check(1 <= rank <= MAX_RANK, f"rank {rank} outside 1..{MAX_RANK}")
    _check(w1.dtype == w2_rows.dtype and w1.dtype in (torch.float32, torch.float16, torch.bfloat16),
           f"w1 / w2_rows in {w1.dtype} / {w2_rows.dtype}: one float dtype")
    _check(w1.stride(1) == 1 and w2_rows.stride(1) == 1, "w1 and w2_rows rows must be contiguous")
    _check(max(w1.shape[0], w2_rows.shape[0]) <= MAX_TOKENS, f"vocabularies above {MAX_TOKENS} tokens")
    device = base_values.device
    _check(first_tokens.shape == (num_rows,), f"first_tokens {tuple(first_tokens.shape)} must be [{num_rows}]")
    if draft_to_target is None:  # the drafts are draft ids, and W1 is indexed by them
        _check(w1.shape[0] >= w2_rows.shape[0], f"w1 has {w1.shape[0]} rows for a {w2_rows.shape[0]}-token vocabulary")
    else:
        _check(draft_to_target.shape == (w2_rows.shape[0],) and not draft_to_target.is_floating_point(),
               f"draft_to_target {tuple(draft_to_target.shape)} {draft_to_target.dtype} must be integer "
               f"[{w2_rows.shape[0]}]")
        draft_to_target = draft_to_target.contiguous()
    sampled = temperature is not None
    _check(sampled == (seeds is not None) and (not sampled or positions is not None),
           "a sampled walk takes temperature, seeds and positions together")
    # Per-request vectors are indexed by req_indices[b] (or b).
    slots = num_rows if req_indices is None else None
    if sampled:
        _check(positions.shape == (num_rows, num_steps) and not positions.is_floating_point(),
               f"positions {tuple(positions.shape)} {positions.dtype} must be integer [B, N]")
        for name, t in (("temperature", temperature), ("seeds", seeds)):
            _check(t.dim() == 1 and (slots is None or t.shape[0] >= slots),
                   f"{name} {tuple(t.shape)} must be one entry a request (>= {slots or 1})")
        _check(not seeds.is_floating_point(), f"seeds in {seeds.dtype} (integers)")
        positions = positions if positions.stride(1) == 1 else positions.contiguous()
    if req_indices is not None:
        _check(req_indices.shape == (num_rows,) and not req_indices.is_floating_point(),
               f"req_indices {tuple(req_indices.shape)} {req_indices.dtype} must be integer [{num_rows}]")
    store_cache = draft_logits is not None
    if store_cache:
        _check(cached_columns is not None, "draft_logits needs cached_columns (the columns its last walk wrote)")
        _check(draft_logits.dim() == 3 and draft_logits.shape[1] >= num_steps and draft_logits.stride(2) == 1,
               f"draft_logits {tuple(draft_logits.shape)} must be [slots, >= {num_steps}, width], rows contiguous")
        width = w1.shape[0] if draft_to_target is not None else w2_rows.shape[0]
        _check(draft_logits.shape[2] >= width, f"draft_logits rows of {draft_logits.shape[2]} columns for {width} "
                                               f"{'target' if draft_to_target is not None else 'draft'} ids")
        _check(slots is None or draft_logits.shape[0] >= slots, f"draft_logits has {draft_logits.shape[0]} slots "
                                                                f"for {num_rows} rows")
        _check(cached_columns.dtype == torch.int64 and cached_columns.shape[0] == draft_logits.shape[0]
               and cached_columns.shape[1] >= num_steps and cached_columns.shape[2] >= topk
               and cached_columns.stride(2) == 1,
               f"cached_columns {tuple(cached_columns.shape)} {cached_columns.dtype} must be int64 "
               f"[{draft_logits.shape[0]}, >= {num_steps}, >= {topk}]")
    if out is None:
        out = torch.empty(num_rows, num_steps, dtype=torch.int64, device=device)
    _check(out.shape == (num_rows, num_steps) and out.dtype == torch.int64 and out.stride(1) == 1,
           f"out {tuple(out.shape)} {out.dtype} must be int64 [B, N], contiguous steps")
    if corrected_out is not None:
        _check(corrected_out.shape == base_values.shape and corrected_out.dtype == torch.float32
               and corrected_out.stride(2) == 1, "corrected_out must be fp32 [B, N, K], contiguous candidates")
    others = (out, corrected_out, draft_logits, cached_columns, temperature, seeds, positions, req_indices,
              draft_to_target)
    devices = {t.device for t in others if t is not None} | {device}
    _check(len(devices) == 1, f"tensors on several devices {sorted(map(str, devices))}")
    if num_rows == 0 or num_steps == 0:
        return out
    # One-element-a-row vectors are read with unit stride (first_tokens, a column of the drafts, with its own).
    req_indices, temperature, seeds = (t if t is None or t.stride(0) == 1 else t.contiguous()
                                       for t in (req_indices, temperature, seeds))
    values = base_values if base_values.stride(2) == 1 else base_values.contiguous()
    cand = candidates if candidates.stride(2) == 1 else candidates.contiguous()
    if round_dot is None:
        round_dot = default_round_dot(device, topk)
    if form == "auto":
        form = default_form(topk)
    _check(form in FORMS, f"form {form!r} (one of {', '.join(FORMS)} or auto)")
    if form != "loop":
        _check(topk <= TABLE_MAX_TOPK, f"form {form} for top-k {topk} (at most {TABLE_MAX_TOPK})")
        from .table import walk_by_table
        walk_by_table(values, cand, w1, w2_rows, first_tokens, out, temperature, seeds, positions, req_indices,
                      draft_to_target, float(logit_scale), draft_logits, cached_columns, corrected_out,
                      bool(round_dot), ahead=form == "table_ahead", num_warps=num_warps, pdl=pdl)
        return out
    kc = min(triton.next_power_of_2(topk), triton.next_power_of_2(chunk))
    num_chunks = triton.cdiv(topk, kc)
    dummy = out
    head_walk_topk_kernel[(num_rows,)](
        values, values.stride(0), values.stride(1),
        cand, cand.stride(0), cand.stride(1),
        w1, w1.stride(0),
        w2_rows, w2_rows.stride(0),
        first_tokens, first_tokens.stride(0),
        req_indices if req_indices is not None else dummy,
        temperature if sampled else dummy,
        seeds if sampled else dummy,
        positions if sampled else dummy, positions.stride(0) if sampled else 0,
        draft_to_target if draft_to_target is not None else dummy,
        out, out.stride(0),
        *stored_outputs(out, corrected_out, draft_logits, cached_columns),
        float(logit_scale), num_steps, topk, rank, draft_logits.shape[2] if store_cache else 0, w1.shape[0],
        R=triton.next_power_of_2(rank), KC=kc, NUM_CHUNKS=num_chunks,
        SAMPLED=sampled, HAS_REQ=req_indices is not None, HAS_D2T=draft_to_target is not None,
        SCALED=float(logit_scale) != 1.0, STORE_CORRECTED=corrected_out is not None, STORE_CACHE=store_cache,
        ROUND_DOT=bool(round_dot),
        num_warps=num_warps or NUM_WARPS,
    )
    return out


def stored_outputs(dummy, corrected_out, draft_logits, cached_columns) -> tuple:
    """The walk kernels' optional outputs as launch arguments: corrected_out and its two strides, the draft-logits
    cache and its two, the cached columns and theirs (dummy and 0 where absent; the cache and columns go together)."""
    store_cache = draft_logits is not None
    return (corrected_out if corrected_out is not None else dummy,
            corrected_out.stride(0) if corrected_out is not None else 0,
            corrected_out.stride(1) if corrected_out is not None else 0,
            draft_logits if store_cache else dummy,
            draft_logits.stride(0) if store_cache else 0, draft_logits.stride(1) if store_cache else 0,
            cached_columns if store_cache else dummy,
            cached_columns.stride(0) if store_cache else 0, cached_columns.stride(1) if store_cache else 0)


def default_form(topk: int) -> str:
    """The walk's form where the caller does not choose: the bias table (1-warp chain) for K <= TABLE_MAX_TOPK, the
    loop above. Measured (H200, session 23 call 1, K 64, block 15, select + walk, us, warm / L2 flushed): 32k b1 greedy
    loop 41.3 / 52.5, table 26.3 / 30.5; sampled 57.9 / 76.1 against 30.6 / 37.9; 152k b1 51.3 -> 36.4, b8 66.6 ->
    48.8, b32 sampled 149.7 -> 121.5; 248k b64 greedy 242.8 -> 239.5, sampled 268.8 -> 250.7 (the select's share
    grows with B x V). The next step's whole table held ahead (table_ahead) was slower at 1, 2 and 4 warps."""
    return "table" if topk <= TABLE_MAX_TOPK else "loop"
