"""Plain-Python reference of the routing correction's decision, for tests."""
from __future__ import annotations


def naive_routing_keep(topk_ids, probe_mask, probe_survival, tokens_per_us, cost, num_experts, threshold=1.0,
                       eligible=None, token_valid=None) -> tuple[list[bool], list[int]]:
    n = len(topk_ids)
    eligible = eligible if eligible is not None else [True] * n
    token_valid = token_valid if token_valid is not None else [True] * n
    base = set()
    for t in range(n):
        if token_valid[t] and not probe_mask[t]:
            base.update(e for e in topk_ids[t] if 0 <= e < num_experts)
    keep, new = [], []
    r = cost.cross_layer_correlation
    for t in range(n):
        fresh = len({e for e in topk_ids[t] if 0 <= e < num_experts} - base)
        new.append(fresh)
        if not probe_mask[t]:
            keep.append(True)
            continue
        total_new = fresh + (cost.num_moe_layers - 1) * (r * fresh + (1 - r) * cost.mean_new_experts)
        cost_us = cost.keep_token_us + cost.per_expert_layer_us * total_new
        value_us = probe_survival[t] / tokens_per_us
        keep.append(bool(eligible[t] and token_valid[t] and value_us > threshold * cost_us))
    return keep, new


def naive_probe_worth(next_survival, tokens_per_us, cost, top_k, threshold=1.0, overhead_us=0.0) -> list[bool]:
    from math import comb

    p = min(max(cost.mean_new_experts / top_k, 0.0), 1.0)
    r = cost.cross_layer_correlation
    out = []
    for s in next_survival:
        value = s / tokens_per_us
        benefit = 0.0
        for j in range(top_k + 1):
            total_new = j + (cost.num_moe_layers - 1) * (r * j + (1 - r) * cost.mean_new_experts)
            keep_cost = threshold * (cost.keep_token_us + cost.per_expert_layer_us * total_new)
            benefit += comb(top_k, j) * p ** j * (1 - p) ** (top_k - j) * max(0.0, value - keep_cost)
        out.append(benefit > threshold * (cost.probe_token_us + overhead_us))
    return out
