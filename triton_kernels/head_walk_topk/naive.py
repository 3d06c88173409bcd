"""Reference for DSpark's top-k Markov walk (`dspark_draft_topk`): torch, step by step, fp64 dot products.

It follows vLLM 0.33's `DSparkSpeculator._sample_sequential_topk` + `DSparkMarkovHead.apply_bias_gathered` +
`_sample_logits`, op for op in meaning:

    base_values, candidates = U.topk(K)                       once, for all N steps (the caller's torch.topk)
    e_k       = W1[x_{k-1}]                                   (x_{-1} = first_tokens, the anchor)
    c_k[j]    = values_k[j] + scale * (W2[candidates_k[j]] . e_k)   rounded as vLLM's baddbmm_ rounds it: on CUDA
                the scaled product to U's dtype first, then the sum (round_dot=True); torch on CPU the sum once
    logits_k  = -inf everywhere, c_k scattered at candidates_k        (the row vLLM's sampler and cache see)
    x_k       = argmax(logits_k)                greedy: first of equal maxima in draft-id order, then d2t
              = argmax(logits_k / T + G)        sampled: vLLM's Gumbel-max over target ids (ties: first target id)

W2 comes in vLLM's layout, [V, r] rows (`markov_w2.weight`), since the walk gathers rows of it.
"""
import torch

from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, gumbel_noise, row_sampling, spec_step_seed


def default_round_dot(device: torch.device, topk: int) -> bool:
    """How torch's `values.clone().baddbmm_(W2[ids], e, alpha=scale)` rounds, as measured (H200, torch 2.11, bf16,
    session 21 calls 2 and 10): on CUDA with K a multiple of 8 (8, 16, 64, 128, 200, 256, 1024) the scaled product is
    rounded to the logits' dtype before the values are added; at K 100, and on CPU, the fp32 sum is rounded once. The
    vLLM wiring reads it off vLLM's own gathered bias at the engine's K instead of trusting this."""
    return device.type == "cuda" and topk % 8 == 0


def naive_head_walk_topk(
    base_values: torch.Tensor,
    candidates: torch.Tensor,
    w1: torch.Tensor,
    w2_rows: torch.Tensor,
    first_tokens: torch.Tensor,
    *,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    req_indices: torch.Tensor | None = None,
    draft_to_target: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    force_tokens: torch.Tensor | None = None,
    round_dot: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk the top-k Markov head one step at a time.

    Args:
        base_values: [B, N, K] the K largest base logits of each step (torch.topk values; their dtype sets the
            rounding point of the corrected logits).
        candidates: [B, N, K] their draft ids (torch.topk indices).
        w1: [V_target, r] Markov embedding table, indexed by target ids.
        w2_rows: [V, r] Markov projection rows (vLLM's `markov_w2.weight`).
        first_tokens: [B] target id of each row's anchor token x_{-1}.
        temperature, seeds: per request (indexed by req_indices[b], or b). None: greedy walk.
        positions: [B, N] int64 position each draw is keyed by (vLLM's sample_pos - 1).
        req_indices: [B] request-state index of each row; -1 marks a padding row (temperature 0, seed 0).
        draft_to_target: [V] vLLM's d2t offsets (target id = draft id + d2t[draft id]); None: the same ids.
        force_tokens: [B, N] walk this path instead of the proposed tokens (teacher forcing).
        round_dot: round the scaled product to base_values' dtype before adding the values (torch on CUDA for K a
            multiple of 8, measured); None: as head_walk_topk's default.

    Returns:
        tokens [B, N] int64 target ids; corrected [B, N, K] fp32, the candidates' logits (rounded to
        base_values' dtype) that vLLM's cache holds at their target columns, -inf elsewhere.
    """
    num_rows, num_steps, topk = base_values.shape
    device = base_values.device
    out_dtype = base_values.dtype
    cand = candidates.long()
    d2t = None if draft_to_target is None else draft_to_target.long()
    target = cand if d2t is None else cand + d2t[cand]
    rows = torch.arange(num_rows, device=device)
    sampled = temperature is not None
    temp, seed = row_sampling(num_rows, req_indices, temperature, seeds, device)

    if round_dot is None:
        round_dot = default_round_dot(device, topk)
    w1d, w2d = w1.double(), w2_rows.double()
    prev = first_tokens.long()
    tokens = torch.empty(num_rows, num_steps, dtype=torch.long, device=device)
    corrected = torch.empty(num_rows, num_steps, topk, device=device)
    for k in range(num_steps):
        e = w1d[prev]                                                    # [B, r]
        dot = torch.einsum("bjr,br->bj", w2d[cand[:, k]], e)            # [B, K]
        product = logit_scale * dot
        if round_dot:
            product = product.to(out_dtype).double()
        c = (base_values[:, k].double() + product).to(out_dtype).float()
        corrected[:, k] = c
        if sampled:
            hot = temp != 0.0
            noise = gumbel_noise(spec_step_seed(seed, k)[:, None], positions[:, k].long()[:, None] + DRAFT_NOISE_SALT,
                                 target[:, k])
            scored = torch.where(hot[:, None], c / torch.where(hot, temp, 1.0)[:, None] + noise, c)
            tie_ids = target[:, k]  # the sampler's row lives in target space
        else:
            scored, tie_ids = c, cand[:, k]
        # argmax of the dense row: the largest score, then the smallest id among equal ones.
        best = scored.max(dim=1, keepdim=True).values
        pick = torch.where(scored == best, tie_ids, torch.iinfo(torch.long).max).argmin(dim=1)
        x = target[rows, k, pick]
        tokens[:, k] = x
        prev = x if force_tokens is None else force_tokens[:, k].long()
    return tokens, corrected


def dense_step_logits(corrected: torch.Tensor, candidates: torch.Tensor, width: int,
                      draft_to_target: torch.Tensor | None = None) -> torch.Tensor:
    """[B, N, width] rows as vLLM's cache holds them: the corrected logits at their target columns, -inf elsewhere."""
    cand = candidates.long()
    cols = cand if draft_to_target is None else cand + draft_to_target.long()[cand]
    dense = torch.full((*corrected.shape[:2], width), float("-inf"), device=corrected.device)
    return dense.scatter_(2, cols, corrected.float())


def naive_topk_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The set torch.topk(logits, k) takes on CUDA, in `topk_candidates`' order: 16-bit logits ordered by torch's radix
    key (the bits made monotone, NaN largest, -0.0 below +0.0), equal keys by index; the first k of that order, listed
    as those above the k-th key by index, then those equal to it by index."""
    vocab = logits.shape[-1]
    bits = logits.contiguous().view(torch.int16).long() & 0xFFFF
    key = bits ^ torch.where((bits & 0x8000) != 0, 0xFFFF, 0x8000)
    key = torch.where(logits != logits, 0xFFFF, key)
    index = torch.arange(vocab, device=logits.device).expand_as(key)
    order = ((0xFFFF - key) << 20) | index  # ascending: larger key first, then smaller index
    chosen = order.sort(dim=-1).values[..., :k] & ((1 << 20) - 1)
    chosen_keys = key.gather(-1, chosen)
    threshold = chosen_keys.min(dim=-1, keepdim=True).values
    # index order within each group: above the threshold first
    rank = torch.where(chosen_keys > threshold, 0, 1 << 20) + chosen
    chosen = chosen.gather(-1, rank.argsort(dim=-1))
    return logits.gather(-1, chosen), chosen
