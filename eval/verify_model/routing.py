"""Synthetic MoE routing for verify passes: skewed expert popularity + token-to-token correlation.

One correlation parameter `rho`: within a request, each of token t's top-k experts is, independently with
probability rho, one of token t-1's experts (each of the k previous experts is kept with probability rho);
the remaining slots are drawn without replacement from a Zipf-like popularity p_e ~ 1 / rank(e)^zipf_s
(a fresh random ranking per layer), excluding experts already chosen. rho = 0 gives independent tokens,
rho = 1 gives every token of a request the first token's expert set. Requests are independent of each other.

The ids are imposed on the MoE layers (the router GEMM still runs for its cost and gives the weights), so the
number of distinct experts a verify pass touches - the quantity that drives MoE time - is controlled.
"""
from __future__ import annotations

import numpy as np


def expert_popularity(num_layers: int, num_experts: int, zipf_s: float, rng: np.random.Generator) -> np.ndarray:
    """[num_layers, num_experts] log-probabilities; each layer ranks the experts in its own random order."""
    if zipf_s < 0:
        raise ValueError(f"zipf_s must be >= 0, got {zipf_s}")
    weights = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** zipf_s
    weights /= weights.sum()
    return np.stack([np.log(weights[rng.permutation(num_experts)]) for _ in range(num_layers)])


def synthetic_routing(num_requests: int, length: int, num_layers: int, num_experts: int, top_k: int,
                      rho: float, zipf_s: float = 0.6, seed: int = 0) -> np.ndarray:
    """Expert ids for every MoE layer of a verify pass.

    Returns:
        [num_layers, num_requests * length, top_k] int16, request-major token order (request r's tokens are
        rows r*length .. r*length+length-1), each row sorted ascending with distinct experts.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if not 0 < top_k <= num_experts or num_experts >= 32768:
        raise ValueError(f"need 0 < top_k <= num_experts < 32768, got top_k={top_k}, num_experts={num_experts}")
    if num_requests < 1 or length < 1 or num_layers < 1:
        raise ValueError("num_requests, length and num_layers must be >= 1")
    rng = np.random.default_rng(seed)
    log_p = expert_popularity(num_layers, num_experts, zipf_s, rng)           # [layers, E]
    rows = num_layers * num_requests
    log_p_rows = np.repeat(log_p, num_requests, axis=0)                       # [rows, E]
    out = np.empty((length, rows, top_k), dtype=np.int64)
    prev = None
    for t in range(length):
        # Gumbel-top-k = sampling without replacement proportionally to p.
        score = log_p_rows - np.log(-np.log(rng.random((rows, num_experts))))
        if prev is not None:
            keep = rng.random((rows, top_k)) < rho
            forced = np.where(keep, prev, num_experts)                        # num_experts: a dummy column
            score = np.concatenate([score, np.zeros((rows, 1))], axis=1)
            np.put_along_axis(score, forced, np.inf, axis=1)
            score = score[:, :num_experts]
        chosen = np.argpartition(-score, top_k - 1, axis=1)[:, :top_k]
        chosen.sort(axis=1)
        out[t] = chosen
        prev = chosen
    # [length, layers*requests, k] -> [layers, requests*length, k]
    out = out.reshape(length, num_layers, num_requests, top_k).transpose(1, 2, 0, 3)
    return np.ascontiguousarray(out.reshape(num_layers, num_requests * length, top_k)).astype(np.int16)


def unique_experts(ids: np.ndarray, num_requests: int) -> dict[str, float]:
    """Distinct experts per MoE layer, averaged over layers: over the whole batch (what the MoE kernels read)
    and per request."""
    num_layers, tokens, _ = ids.shape
    length = tokens // num_requests
    per_batch = [len(np.unique(ids[layer])) for layer in range(num_layers)]
    per_request = [
        len(np.unique(ids[layer, r * length:(r + 1) * length]))
        for layer in range(num_layers) for r in range(num_requests)
    ]
    return {"per_batch": float(np.mean(per_batch)), "per_request": float(np.mean(per_request))}
