"""Plain-Python references of the length rules, for tests (one batch, host floats, explicit loops)."""
from __future__ import annotations


def _survivals(confidences, cap):
    out = []
    for b, row in enumerate(confidences):
        s = 1.0
        for j in range(cap[b]):
            s *= min(max(row[j], 0.0), 1.0)
            out.append(s)
    return sorted(out, reverse=True)


def _worth_reaching(r, s, gain, last_round, round_us, batch, k, num_valid, forecast, rate_threshold):
    """Lookahead test of rank r (1-based) worth s: does any candidate stop m >= r beat stopping at r - 1?"""
    stops = {r, num_valid} | {j * batch for j in range(1, k + 1)}
    scale = None if forecast is None else (s / forecast[r - 1] if forecast[r - 1] > 0 else 0.0)
    for m in stops:
        if not r <= m <= num_valid:
            continue
        later = [s if forecast is None else scale * forecast[j - 1] for j in range(r + 1, m + 1)]
        added = s + sum(later)
        cost = round_us(1.0 + m / batch) - last_round
        if rate_threshold is None and added * last_round > gain * cost:
            return True
        if rate_threshold is not None and added > rate_threshold * cost:
            return True
    return False


def naive_choose_verify_lengths(confidences, num_drafts, round_us, *, min_drafts=0, max_drafts=None,
                                padded_weight=0.0, rate_threshold=None, budget_floor=None, lookahead=False,
                                forecast_confidences=None) -> list[int]:
    """confidences: [B][K] floats; num_drafts: [B] ints; round_us(x) -> float round time at x verified
    tokens per request. Returns drafts to verify per request."""
    batch, k = len(confidences), len(confidences[0])
    cap = [max(0, min(n, k if max_drafts is None else min(max_drafts, k))) for n in num_drafts]
    num_valid = sum(cap)
    forecast = None if forecast_confidences is None else _survivals(forecast_confidences, cap)
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
        if lookahead:
            rises = _worth_reaching(admitted, s, gain, last_round, round_us, batch, k, num_valid, forecast,
                                    rate_threshold)
        elif rate_threshold is None:
            rises = s * last_round > gain * (new_round - last_round)
        else:
            rises = s > rate_threshold * (new_round - last_round)
        if not forced and not rises and not (budget_floor is not None and admitted <= budget_floor):
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


def naive_prefix_scan_budget(confidences, num_drafts, round_us, *, min_drafts=0, max_drafts=None) -> int:
    """The best prefix count of the ranking (forced pairs first), by brute force over every count."""
    batch, k = len(confidences), len(confidences[0])
    cap = [max(0, min(n, k if max_drafts is None else min(max_drafts, k))) for n in num_drafts]
    forced, rest = [], []
    for b in range(batch):
        s = 1.0
        for j in range(cap[b]):
            s *= min(max(confidences[b][j], 0.0), 1.0)
            (forced if j < min_drafts else rest).append(s)
    ranked = sorted(forced, reverse=True) + sorted(rest, reverse=True)
    best, budget = None, 0
    for m in range(len(forced), len(ranked) + 1):
        rate = (batch + sum(ranked[:m])) / round_us(1.0 + m / batch)
        if best is None or rate > best:
            best, budget = rate, m
    return budget


def naive_cut_budget(stale_confidences, num_drafts, round_us, non_moe_us, cut_token_us, shifts, min_budget,
                     min_drafts=0, device_rule=None, device_price=None) -> tuple[int, list[float]]:
    """`cut_budget` for one batch: stale_confidences [B][K], num_drafts [B], round_us(x) / non_moe_us(x) -> us at x
    verified tokens per request, shifts [Q][B][K], device_rule(scenario confidences [B][K], capacities [B]) ->
    drafts admitted, device_price (saving_us(x), price) (neither: the best-rate prefix). Returns (the count,
    expected rate per count; -1 where not allowed)."""
    import math

    batch, k = len(stale_confidences), len(stale_confidences[0])
    cap = [max(0, min(n, k)) for n in num_drafts]
    num_valid, n = sum(cap), batch * k
    forced = sum(min(c, min_drafts) for c in cap)

    def logit(p):
        p = min(max(p, 1e-6), 1.0 - 1e-6)
        return math.log(p / (1.0 - p))

    tokens = [[0.0] * (n + 1) for _ in shifts]
    times = [[0.0] * (n + 1) for _ in shifts]
    for q, shift in enumerate(shifts):
        pairs, curves = [], []
        for b in range(batch):
            s, lowest, curve = 1.0, 1.0, []
            for j in range(cap[b]):
                s *= min(max(stale_confidences[b][j], 0.0), 1.0)
                moved = 1.0 / (1.0 + math.exp(-(logit(s) + shift[b][j])))
                lowest = min(lowest, moved) if s > 0 else 0.0
                curve.append(lowest)
            pairs += curve
            curves.append(curve)
        pairs.sort(reverse=True)
        gains = [batch + sum(pairs[:m]) for m in range(n + 1)]
        if device_price is not None:  # (saving_us(x), price)
            saving_us, price = device_price
            device = max(range(forced, num_valid + 1),
                         key=lambda m: (gains[m] - price * saving_us(1.0 + m / batch), -m))
        elif device_rule is None:
            device = max(range(forced, num_valid + 1), key=lambda m: (gains[m] / round_us(1.0 + m / batch), -m))
        else:
            conf = [[(c[j] / (c[j - 1] if j else 1.0) if (j == 0 or c[j - 1] > 0) else 0.0) if j < len(c) else 0.0
                     for j in range(k)] for c in curves]
            device = sum(device_rule(conf, cap))
        for m in range(n + 1):
            v = min(m, device)
            tokens[q][m] = gains[v]
            neutral_us = max(non_moe_us(1.0 + m / batch) - non_moe_us(1.0 + v / batch), 0.0) + cut_token_us * (m - v)
            times[q][m] = round_us(1.0 + v / batch) + neutral_us
    rates = [-1.0] * (n + 1)
    for m in range(min(min_budget, num_valid), num_valid + 1):
        if m >= min_budget:
            rates[m] = sum(t[m] for t in tokens) / sum(t[m] for t in times)
    best = max(range(n + 1), key=lambda m: (rates[m], -m))
    return max(best, min(min_budget, num_valid)), rates
