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
        cost_us = cost.per_token_us + cost.per_expert_layer_us * total_new
        value_us = probe_survival[t] / tokens_per_us
        keep.append(bool(eligible[t] and token_valid[t] and value_us > threshold * cost_us))
    return keep, new
