"""Reference for the DSpark serial head walk: torch, step by step, fp32.

It follows vLLM 0.33's `DSparkSpeculator._sample_sequential` (Markov head) and DeepSpec's
`GatedMarkovHead` / `RNNHead` (`deepspec/modeling/dspark/markov_head.py`) for the other two heads:

    e_k    = W1[x_{k-1}]                                   (x_{-1} = first_tokens, the anchor)
    markov:       m_k = e_k
    gated_markov: m_k = sigmoid(Wg [h_k; e_k] + bg) * e_k  (gate_weights = (Wg [r, d+r], bg [r]))
    rnn:          [g; c; o] = Wj [s_{k-1}; e_k; h_k] + bj  (rnn_weights = (Wj [3r, 2r+d], bj [3r]), s_{-1} = 0)
                  s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c);  m_k = tanh(o)
    bias_k   = scale * (m_k @ W2)                  rounded to base_logits' dtype, as vLLM's GEMV output is
    logits_k = U_k + bias_k                        rounded to base_logits' dtype, as a torch add is
    x_k      = argmax(logits_k)                    greedy (first of equal maxima, as torch.argmax)
             = argmax(logits_k / T + G)            sampled: vLLM's Gumbel-max draw `gumbel_noised_argmax`
    confidence_k = sigmoid(wc . [h_k; e_k] + bc)   (DSparkConfidenceHead; [h_k] only without the Markov part)

A reduced draft vocabulary maps draft id i to target id i + draft_to_target[i] (vLLM's d2t): the walk proposes
target ids, W1 is indexed by target ids, Gumbel noise is keyed by target ids and greedy ties break on draft ids,
exactly as vLLM's two paths do.
"""
import torch

# vLLM's gumbel.py constants: the salt that keeps draft noise apart from the target's, and the murmur3 mixing.
DRAFT_NOISE_SALT = 1 << 30
_MASK32 = 0xFFFFFFFF


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for int64 tensors holding uint32 values, without int64 overflow."""
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def _rotl32(v: torch.Tensor, shift: int) -> torch.Tensor:
    return ((v << shift) | (v >> (32 - shift))) & _MASK32


def _murmur3_mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _mul32(key, 0xCC9E2D51)
    key = _rotl32(key, 15)
    key = _mul32(key, 0x1B873593)
    h = h ^ key
    h = _rotl32(h, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _MASK32


def _murmur3_fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def gumbel_uniform(seed: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """vLLM's `murmur3_uniform32(seed, pos, keys)`: fp32 uniforms in (0, 1).

    seed, pos: int64 tensors broadcastable against keys (int64 token ids).
    """
    seed, pos, keys = torch.broadcast_tensors(seed.long(), pos.long(), keys.long())
    h = torch.zeros_like(keys)
    h = _murmur3_mix(h, seed & _MASK32)
    h = _murmur3_mix(h, (seed >> 32) & _MASK32)
    h = _murmur3_mix(h, pos & _MASK32)
    h = _murmur3_mix(h, keys & _MASK32)
    bits = _murmur3_fmix32(h ^ 16)
    hi16 = (bits >> 16).to(torch.float32)
    lo16 = (bits & 0xFFFF).to(torch.float32)
    return hi16 * 1.52587890625e-05 + (lo16 + 0.5) * 2.3283064365386963e-10


def _log1p_neg(u: torch.Tensor) -> torch.Tensor:
    """log(1 - u) as vLLM's `_log1p_neg_stable`: a degree-8 series below 0.25, a direct log above."""
    poly = torch.full_like(u, 1.0 / 8.0)
    for c in (1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0):
        poly = c + u * poly
    series = -u * poly
    direct = torch.log(torch.clamp(1.0 - u, min=5.960464477539063e-08))
    return torch.where(u < 0.25, series, direct)


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The fp32 Gumbel noise vLLM adds to a drafting step's logits (after the temperature divide)."""
    return -torch.log(-_log1p_neg(gumbel_uniform(seed, pos, keys)))


def spec_step_seed(seed: torch.Tensor, step: int) -> torch.Tensor:
    """vLLM's `spec_step_seed`: the draft step mixed into the request seed's high bits."""
    return seed.long() ^ (step << 32)


def row_sampling(num_rows: int, req_indices: torch.Tensor | None, temperature: torch.Tensor | None,
                 seeds: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Each batch row's (temperature, seed) from its request (req_indices[b], or b); padding rows (-1) get 0 and 0.
    (None, None) for a greedy walk."""
    if temperature is None:
        return None, None
    rows = torch.arange(num_rows, device=device)
    req = rows if req_indices is None else req_indices.long()
    valid = req >= 0
    safe_req = torch.where(valid, req, torch.zeros_like(req))
    temp = torch.where(valid, temperature.float()[safe_req], torch.zeros(num_rows, device=device))
    seed = torch.where(valid, seeds.long()[safe_req], torch.zeros(num_rows, dtype=torch.long, device=device))
    return temp, seed


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


def naive_head_walk(
    base_logits: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    first_tokens: torch.Tensor,
    *,
    head: str = "markov",
    hidden: torch.Tensor | None = None,
    gate_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    rnn_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    req_indices: torch.Tensor | None = None,
    draft_to_target: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    confidence_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    force_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Walk the serial head one step at a time.

    Args:
        base_logits: U [B, N, V] backbone logits (draft vocabulary V); its dtype sets the rounding points.
        w1: [V_target, r] Markov embedding table, indexed by target ids.
        w2: [r, V] Markov projection (vLLM's `markov_w2.weight` is [V, r]: pass its `.t()`).
        first_tokens: [B] target id of each row's anchor token x_{-1}.
        temperature, seeds: per request (indexed by req_indices[b], or b). None: greedy walk.
        positions: [B, N] int64 position each draw is keyed by (vLLM's sample_pos - 1).
        req_indices: [B] request-state index of each row; -1 marks a padding row (temperature 0, seed 0).
        force_tokens: [B, N] walk this path instead of the proposed tokens (teacher forcing, for checks that
            tolerate rounding: the returned logits are then those seen along the forced path).

    Returns:
        tokens [B, N] int64 target ids; logits [B, N, V] fp32 step logits before temperature (the values
        vLLM caches for its rejection sampler); confidence [B, N] fp32 or None.
    """
    num_rows, num_steps, vocab = base_logits.shape
    rank = w1.shape[1]
    device = base_logits.device
    out_dtype = base_logits.dtype
    w1f, w2f = w1.float(), w2.float()
    d2t = None if draft_to_target is None else draft_to_target.long()
    sampled = temperature is not None
    temp, seed = row_sampling(num_rows, req_indices, temperature, seeds, device)
    draft_ids = torch.arange(vocab, device=device)
    target_ids = draft_ids if d2t is None else draft_ids + d2t

    state = torch.zeros(num_rows, rank, device=device)
    prev = first_tokens.long()
    tokens = torch.empty(num_rows, num_steps, dtype=torch.long, device=device)
    all_logits = torch.empty(num_rows, num_steps, vocab, device=device)
    confidence = None if confidence_weights is None else torch.empty(num_rows, num_steps, device=device)
    for k in range(num_steps):
        e = w1f[prev]
        h = None if hidden is None else hidden[:, k].float()
        if head == "markov":
            m = e
        elif head == "gated_markov":
            wg, bg = gate_weights
            m = torch.sigmoid(torch.cat([h, e], -1) @ wg.float().t() + bg.float()) * e
        elif head == "rnn":
            wj, bj = rnn_weights
            gate, cand, outp = (torch.cat([state, e, h], -1) @ wj.float().t() + bj.float()).chunk(3, -1)
            gate = torch.sigmoid(gate)
            state = gate * state + (1.0 - gate) * torch.tanh(cand)
            m = torch.tanh(outp)
        else:
            raise ValueError(f"unknown head {head!r}")
        if confidence is not None:
            wc, bc = confidence_weights
            feats = torch.cat([h, e], -1) if wc.numel() == h.shape[-1] + rank else h
            confidence[:, k] = torch.sigmoid(feats @ wc.float().reshape(-1) + bc.float().reshape(()))
        bias = _round(_round(m @ w2f, out_dtype) * logit_scale, out_dtype)
        logits = _round(base_logits[:, k].float() + bias, out_dtype)
        all_logits[:, k] = logits
        if sampled:
            hot = temp != 0.0
            noise = gumbel_noise(spec_step_seed(seed, k)[:, None], positions[:, k].long()[:, None] + DRAFT_NOISE_SALT,
                                 target_ids[None, :])
            scored = torch.where(hot[:, None], logits / torch.where(hot, temp, 1.0)[:, None] + noise, logits)
            # vLLM's noised argmax keys ties by target id (the logits live in target space there).
            if d2t is not None:
                order = torch.argsort(target_ids)
                pick = order[scored[:, order].argmax(-1)]
            else:
                pick = scored.argmax(-1)
        else:
            pick = logits.argmax(-1)
        x = target_ids[pick]
        tokens[:, k] = x
        prev = x if force_tokens is None else force_tokens[:, k].long()
    return tokens, all_logits, confidence
