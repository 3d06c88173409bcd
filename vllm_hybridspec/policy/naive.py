"""Plain-Python references of the length rules, for tests (one batch, host floats, explicit loops)."""
from __future__ import annotations


def naive_choose_verify_lengths(confidences, num_drafts, round_us, *, min_drafts=0, max_drafts=None,
                                padded_weight=0.0, rate_threshold=None) -> list[int]:
    """confidences: [B][K] floats; num_drafts: [B] ints; round_us(x) -> float round time at x verified
    tokens per request. Returns drafts to verify per request."""
    batch, k = len(confidences), len(confidences[0])
    cap = [max(0, min(n, k if max_drafts is None else min(max_drafts, k))) for n in num_drafts]
    pairs = []  # (key, flat index, survival)
    for b in range(batch):
        s = 1.0
        for j in range(k):
            s *= min(max(confidences[b][j], 0.0), 1.0)
            if j < cap[b]:
                forced = j < min_drafts
                pairs.append((s + (2.0 if forced else 0.0), b * k + j, s, forced))
    pairs.sort(key=lambda p: (-p[0], p[1]))
    counts = [0] * batch
    gain, longest = float(batch), 1
    last_round = round_us(1.0)
    for admitted, (_, flat, s, forced) in enumerate(pairs, start=1):
        b, j = divmod(flat, k)
        new_gain = gain + s
        new_longest = max(longest, j + 2)
        x = (1 - padded_weight) * (1.0 + admitted / batch) + padded_weight * new_longest
        new_round = round_us(x)
        if rate_threshold is None:
            rises = s * last_round > gain * (new_round - last_round)
        else:
            rises = s > rate_threshold * (new_round - last_round)
        if not forced and not rises:
            break
        counts[b] += 1
        gain, longest, last_round = new_gain, new_longest, new_round
    return counts


def naive_vllm_adaptive_lengths(confidences, num_drafts, round_us, budget_confidences=None) -> list[int]:
    batch, k = len(confidences), len(confidences[0])
    budget_confidences = budget_confidences or confidences
    cap = [max(0, min(n, k)) for n in num_drafts]

    def survival(conf):
        out = []
        for b in range(batch):
            s = 1.0
            for j in range(cap[b]):
                s *= min(max(conf[b][j], 0.0), 1.0)
                out.append((s, b * k + j))
        return out

    scores = sorted((s for s, _ in survival(budget_confidences)), reverse=True)
    best, budget, gain = batch / round_us(1.0), 0, float(batch)
    for m, s in enumerate(scores, start=1):
        gain += s
        ratio = gain / round_us(1.0 + m / batch)
        if ratio > best:
            best, budget = ratio, m
    ranked = sorted(survival(confidences), key=lambda p: (-p[0], p[1]))
    counts = [0] * batch
    for _, flat in ranked[:budget]:
        counts[flat // k] += 1
    return counts
