"""Per-request verification lengths that maximise expected accepted tokens per second over the batch.

Objective (one speculative round, batch of B requests, request b verifies n_b of its K drafts):

    rate(n) = (B + sum_b sum_{k <= n_b} s[b, k]) / (overhead(B) + T(B, 1 + sum_b n_b / B))

s[b, k] = prod_{j <= k} c[b, j] is the survival probability of draft k (all drafts up to k accepted), so the
numerator is the expected number of emitted tokens (accepted drafts plus one corrected/bonus token per
request) and the denominator the round time (`VerifyLatencyModel`; vLLM packs per-request lengths, so T
depends on the total verified tokens; `padded_weight` > 0 moves it towards the longest request instead).

`choose_verify_lengths` is the hardware-aware prefix scheduler of DSpark with the hybrid target's T(L): rank
all (request, position) pairs by survival probability, admit them one by one while the rate rises, stop at
the first pair that would lower it. Everything runs as torch ops on the device with static shapes.

A measured T(L) is neither smooth nor convex: MoE kernel heuristics make T(4) > T(5) at batch 1, a batch
row extrapolated from two measured ones amplifies such kinks, and the growth of unique experts makes T
concave in L at large batch (each extra token costs less than the one before). "Does the NEXT pair raise the
rate?" then stops in front of a step whose flat part behind it is worth reaching (the c64 collapse to ~3
drafts per request in eval/results/simulate.md before the lookahead existed). With `lookahead=True` the test
at rank r is instead "does SOME later stopping count m >= r beat stopping at r - 1?", with the pairs ranked
r + 1..m forecast from what is lossless to know at rank r: s_r * f_j / f_r, where f is the descending
survival curve of `forecast_confidences` - LAST round's confidences, which do not depend on this round's
drafts: last round's shape at this round's level (never above s_r, which bounds every later pair since the
ranking descends; without a forecast, s_r itself: optimistic). Candidate stops are r, every count where the
mean verified length is an integer (the profile's own points, T is linear in between) and the last pair.

"The rate rises" means s_r > rho * (T_r - T_{r-1}): the pair's expected token is worth more than the time it
adds, priced at rho tokens/us. By default rho is this round's own rate G_{r-1} / T_{r-1} (the per-round
objective above). Passing `rate_threshold` = the long-run achieved rate (`ThroughputTracker`) instead
maximises tokens per second over many rounds (sum of tokens / sum of time; Dinkelbach's parametric form of
a ratio objective): a hard round then stops earlier and an easy one verifies further than its own ratio
would suggest.

Why the result is lossless (the output distribution is exactly the target's under standard speculative
rejection sampling):
  1. c[b, k] must be computed from the prefix only: the draft distribution at position k (or DSpark's
     confidence head, which reads x_{k-1} and the backbone state h_k), never the drafted token x_k itself.
     Then s[b, k] depends on x_{b,<k} only.
  2. Ranking is a stable descending sort of s; s is non-increasing along a request, so a request's own
     later pairs (b, j > k) never rank above (b, k).
  3. Whether (b, k) is admitted depends only on the pairs ranked at or above it (the rate at each of those
     ranks), never on lower-ranked ones - that is why the scan stops at the FIRST failed test instead of
     taking the best prefix overall. Those pairs are (b, j <= k), functions of x_{b,<k}, and other
     requests' drafts, which are independent of request b's draft tokens given the contexts. The
     lookahead keeps this: its test at rank r reads s_r, the gain and time of ranks < r, T, and last
     round's confidences (`forecast_confidences`) - never a pair ranked below r. A `budget_floor` (pairs
     admitted by rank whatever the test says) must likewise come from last round (`prefix_scan_budget`).
  Hence "verify position k" is a stopping time of the draft sequence: it is decided by x_{<k} (and
  independent randomness) alone. Conditioned on x_{<k} having been accepted and on the decision to verify
  k, x_k is still distributed as q(. | x_{<k}), so the accept/residual step at k emits a token from
  p(. | x_{<k}); if k is not verified, the bonus token is drawn from p(. | x_{<k}) directly. Either way
  every emitted token is distributed as the target's, position by position (Leviathan et al. 2023, with a
  stopping-time length; DSpark's early-stopping rule). tests/policy/test_lossless.py checks it empirically,
  and checks that a rule which peeks at x_k is caught by the same test.
  Under greedy decoding any length rule is lossless (the output is the target's argmax chain).

`vllm_adaptive_lengths` is vLLM's rule (adaptive_verification.py), kept as a baseline for the simulator:
a token budget = argmax over all prefixes of the globally sorted survival probabilities (from the previous
step's confidences, which is why vLLM may take the best prefix), then a global top-`budget` assignment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_hybridspec.policy.latency_model import VerifyLatencyModel

# Sort keys: forced positions (min_drafts) rank above any survival probability (<= 1), slots beyond a
# request's drafts below any (>= 0).
_FORCED_BONUS = 2.0
_INVALID_KEY = -1.0


@dataclass
class LengthDecision:
    """What `choose_verify_lengths` decided, all device tensors; leading dims as the inputs'.

    num_drafts: [..., B] int32, drafts to verify per request (verified tokens = num_drafts + 1).
    tokens_per_us: [...] the objective at the chosen lengths: expected emitted tokens per microsecond.
    expected_tokens: [...] expected emitted tokens of the round.
    round_us: [...] predicted round time (overhead + corrected verify).
    verify_us: [...] UNcorrected verify-time prediction (feed it back to `VerifyLatencyModel.observe`).
    next_survival: [..., B] survival probability of the first draft NOT verified (0 where none is left):
        what the routing correction's probe token would be worth.
    marginal_rate: [...] tokens/us at which the last admission was priced (`rate_threshold` if given,
        else the round's rate): the price of a token for the routing correction.
    """

    num_drafts: torch.Tensor
    tokens_per_us: torch.Tensor
    expected_tokens: torch.Tensor
    round_us: torch.Tensor
    verify_us: torch.Tensor
    next_survival: torch.Tensor
    marginal_rate: torch.Tensor


def _check_inputs(confidences: torch.Tensor, num_drafts: torch.Tensor, latency: VerifyLatencyModel) -> None:
    if confidences.dim() < 2:
        raise ValueError(f"confidences must be [..., B, K], got shape {tuple(confidences.shape)}")
    if not confidences.is_floating_point():
        raise ValueError(f"confidences must be floating point, got {confidences.dtype}")
    if num_drafts.shape != confidences.shape[:-1]:
        raise ValueError(
            f"num_drafts must be [..., B] = {tuple(confidences.shape[:-1])}, got {tuple(num_drafts.shape)}"
        )
    if num_drafts.is_floating_point():
        raise ValueError(f"num_drafts must be an integer tensor, got {num_drafts.dtype}")
    batch, k = confidences.shape[-2:]
    if batch > latency.max_batch:
        raise ValueError(f"batch {batch} exceeds the latency model's max_batch {latency.max_batch}")
    if k + 1 > latency.max_len:
        raise ValueError(f"K + 1 = {k + 1} verified tokens exceed the latency model's max_len {latency.max_len}")


def survival_probabilities(confidences: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """[..., B, K] prod_{j<=k} c[b, j], zero at slots k >= num_drafts[b]."""
    k = confidences.shape[-1]
    valid = torch.arange(k, device=confidences.device) < num_drafts.unsqueeze(-1)
    survival = torch.cumprod(confidences.float().clamp(0.0, 1.0), dim=-1)
    return torch.where(valid, survival, torch.zeros_like(survival))


def _rank_pairs(confidences, num_drafts, min_drafts, max_drafts):
    """The one ranking every rule here shares: pairs forced by min_drafts first, then by survival (stable, so
    a request's earlier draft precedes its later one on ties), invalid slots last.

    Returns capacity [..., B], survival / valid / forced [..., B, K], and over the flattened [..., B*K]
    ranking: key_sorted, order (flat index b * K + k) and survival_sorted (float64).
    """
    k = confidences.shape[-1]
    capacity = num_drafts.long().clamp(min=0, max=k if max_drafts is None else min(max_drafts, k))
    survival = survival_probabilities(confidences, capacity)
    positions = torch.arange(k, device=confidences.device)
    valid = positions < capacity.unsqueeze(-1)
    forced = valid & (positions < min_drafts)
    key = torch.where(valid, survival + _FORCED_BONUS * forced, torch.full_like(survival, _INVALID_KEY))
    key_sorted, order = torch.sort(key.flatten(-2), dim=-1, descending=True, stable=True)
    survival_sorted = survival.flatten(-2).gather(-1, order).double()
    return capacity, survival, valid, forced, key_sorted, order, survival_sorted


def choose_verify_lengths(
    confidences: torch.Tensor,
    num_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    min_drafts: int = 0,
    max_drafts: int | None = None,
    padded_weight: float = 0.0,
    rate_threshold: torch.Tensor | float | None = None,
    budget_floor: torch.Tensor | int | None = None,
    lookahead: bool = False,
    forecast_confidences: torch.Tensor | None = None,
) -> LengthDecision:
    """Batch-aware verification lengths (admission by survival, stop at the first pair that fails the test).

    Args:
        confidences: [..., B, K] conditional acceptance probability of draft k given drafts < k accepted;
            a function of the prefix x_{<k} only (see the module docstring: this is what makes it lossless).
        num_drafts: [..., B] integer, drafts available per request (0 for a row without drafts).
        latency: the round-time model; its batch is B (the rows of `confidences`).
        min_drafts: verify at least this many drafts per request (capped by its available drafts), whatever
            they are worth.
        max_drafts: verify at most this many (None: K).
        padded_weight: 0 = verified tokens are packed (vLLM), 1 = every request costs as much as the longest.
        rate_threshold: price of a token in tokens/us (scalar or [...]); None or NaN = this round's rate.
        budget_floor: admit at least this many pairs by rank (scalar or [...] integer), whatever the stopping
            rule says - e.g. `prefix_scan_budget` of LAST round's confidences. It must not depend on this
            round's drafts (see the module docstring).
        lookahead: admit a pair when some later stopping count beats stopping before it (robust to a
            non-convex or concave T; see the module docstring), instead of when the pair alone raises the
            rate. Needs padded_weight = 0.
        forecast_confidences: [..., B, K] LAST round's confidences, the lookahead's forecast of the pairs
            ranked below the one tested (None: each is forecast at the tested pair's survival).

    Returns a `LengthDecision`.
    """
    _check_inputs(confidences, num_drafts, latency)
    if not 0.0 <= padded_weight <= 1.0:
        raise ValueError(f"padded_weight must be in [0, 1], got {padded_weight}")
    if lookahead and padded_weight != 0.0:
        raise ValueError("lookahead prices admitted counts on the packed curve: it needs padded_weight = 0")
    if forecast_confidences is not None and forecast_confidences.shape != confidences.shape:
        raise ValueError(f"forecast_confidences must match confidences {tuple(confidences.shape)}, "
                         f"got {tuple(forecast_confidences.shape)}")
    if min_drafts < 0 or (max_drafts is not None and max_drafts < min_drafts):
        raise ValueError(f"need 0 <= min_drafts <= max_drafts, got {min_drafts}, {max_drafts}")
    *lead, batch, k = confidences.shape
    device = confidences.device
    capacity, survival, valid, forced, key_sorted, order, survival_sorted = _rank_pairs(
        confidences, num_drafts, min_drafts, max_drafts)

    valid_sorted = key_sorted > _INVALID_KEY
    forced_sorted = key_sorted >= _FORCED_BONUS
    position_sorted = order % k

    rank = torch.arange(1, batch * k + 1, device=device, dtype=torch.float64)
    gains = batch + torch.cumsum(survival_sorted, dim=-1)
    mean_len = 1.0 + rank / batch
    longest = 1.0 + torch.cummax((position_sorted + 1) * valid_sorted, dim=-1).values.double()
    tokens_per_request = (1.0 - padded_weight) * mean_len + padded_weight * longest
    round_us = latency.round_us(batch, tokens_per_request)

    # Admitting rank r raises the rate iff s_r / (T_r - T_{r-1}) > G_{r-1} / T_{r-1}: compared in this
    # marginal form, the decision does not hinge on the difference of two nearly equal rates.
    round0_us = latency.round_us(batch, 1.0).expand(*lead, 1)
    previous_round = torch.cat([round0_us, round_us[..., :-1]], dim=-1)
    previous_gain = torch.cat([torch.full_like(round0_us, float(batch)), gains[..., :-1]], dim=-1)
    added_us = round_us - previous_round
    rho = None
    if rate_threshold is not None:
        rho = torch.as_tensor(rate_threshold, dtype=torch.float64, device=device)
        rho = rho.reshape(rho.shape + (1,)) if rho.dim() else rho
    if lookahead:
        rises = _worth_reaching(survival_sorted, valid_sorted, previous_gain, previous_round, latency, batch, k,
                                rho, forecast_confidences, capacity)
    else:
        rises = survival_sorted * previous_round > previous_gain * added_us
        if rho is not None:
            rises = torch.where(torch.isnan(rho), rises, survival_sorted > rho * added_us)
    step_ok = valid_sorted & (forced_sorted | rises)
    if budget_floor is not None:
        floor = torch.as_tensor(budget_floor, device=device).long()
        floor = floor.reshape(floor.shape + (1,)) if floor.dim() else floor
        step_ok = step_ok | (valid_sorted & (rank <= floor))
    admitted = torch.cumprod(step_ok.to(torch.int32), dim=-1).to(torch.int32)

    counts = torch.zeros(*lead, batch, dtype=torch.int32, device=device)
    counts.scatter_add_(-1, torch.div(order, k, rounding_mode="floor"), admitted)

    num_admitted = admitted.sum(-1, keepdim=True).long()
    last = (num_admitted - 1).clamp(min=0)
    has_any = num_admitted > 0
    chosen_gain = torch.where(has_any, gains.gather(-1, last), torch.full_like(last, batch, dtype=gains.dtype))
    chosen_x = torch.where(has_any, tokens_per_request.gather(-1, last), torch.ones_like(last, dtype=torch.float64))
    chosen_round = latency.round_us(batch, chosen_x)

    round_rate = (chosen_gain / chosen_round).squeeze(-1)
    if rate_threshold is None:
        marginal_rate = round_rate
    else:
        rho = torch.as_tensor(rate_threshold, dtype=torch.float64, device=device).expand_as(round_rate)
        marginal_rate = torch.where(torch.isnan(rho), round_rate, rho)

    next_index = counts.long().clamp(max=k - 1).unsqueeze(-1)
    next_survival = survival.gather(-1, next_index).squeeze(-1)
    next_survival = torch.where(counts.long() < capacity, next_survival, torch.zeros_like(next_survival))
    return LengthDecision(
        num_drafts=counts,
        tokens_per_us=round_rate.float(),
        expected_tokens=chosen_gain.squeeze(-1).float(),
        round_us=chosen_round.squeeze(-1).float(),
        verify_us=latency.verify_us(batch, chosen_x).squeeze(-1).float(),
        next_survival=next_survival,
        marginal_rate=marginal_rate.float(),
    )


def vllm_adaptive_lengths(
    confidences: torch.Tensor,
    num_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    budget_confidences: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM 0.33's adaptive verification rule, as a baseline (not lossless-by-construction on its own:
    vLLM keeps it lossless by choosing the budget from the PREVIOUS step's confidences).

    budget = argmax_m (B + sum of the m best survival probabilities) / (overhead + T(B, 1 + m / B)) over
    all m, using `budget_confidences` (vLLM: last step's, stale); then each request gets as many drafts as
    it has among the global top-`budget` pairs ranked by the current `confidences`.

    Returns [..., B] int32 drafts to verify.
    """
    _check_inputs(confidences, num_drafts, latency)
    if budget_confidences is None:
        budget_confidences = confidences
    if budget_confidences.shape != confidences.shape:
        raise ValueError(
            f"budget_confidences must match confidences {tuple(confidences.shape)}, "
            f"got {tuple(budget_confidences.shape)}"
        )
    *lead, batch, k = confidences.shape
    device = confidences.device
    capacity = num_drafts.long().clamp(0, k)
    num_valid = capacity.sum(-1, keepdim=True)

    stale = survival_probabilities(budget_confidences, capacity).flatten(-2).double()
    scores = torch.sort(stale, dim=-1, descending=True).values
    rank = torch.arange(1, batch * k + 1, device=device, dtype=torch.float64)
    ratios = (batch + torch.cumsum(scores, -1)) / latency.round_us(batch, 1.0 + rank / batch)
    ratios = torch.where(rank <= num_valid, ratios, torch.full_like(ratios, -1.0))
    ratio0 = (batch / latency.round_us(batch, 1.0)).expand(*lead, 1)
    budget = torch.argmax(torch.cat([ratio0, ratios], dim=-1), dim=-1, keepdim=True)

    positions = torch.arange(k, device=device)
    valid = positions < capacity.unsqueeze(-1)
    current = torch.where(valid, survival_probabilities(confidences, capacity),
                          torch.full(confidences.shape, _INVALID_KEY, device=device))
    order = torch.sort(current.flatten(-2), dim=-1, descending=True, stable=True).indices
    admitted = (torch.arange(batch * k, device=device) < budget).to(torch.int32)
    counts = torch.zeros(*lead, batch, dtype=torch.int32, device=device)
    counts.scatter_add_(-1, torch.div(order, k, rounding_mode="floor"), admitted)
    return counts


def prefix_scan_budget(
    confidences: torch.Tensor,
    num_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    min_drafts: int = 0,
    max_drafts: int | None = None,
) -> torch.Tensor:
    """[...] int64: the number m of best-ranked pairs that maximises the round's expected rate, scanned over
    EVERY prefix m (not stopped at the first drop), so a step or a dip in T(L) cannot trap it.

    Ranking and objective are `choose_verify_lengths`'s (forced pairs first, then survival). The best prefix
    of a round depends on all of its pairs, later drafts included: admitting the top m of the SAME round's
    ranking is not lossless. Use it on confidences that do not depend on this round's drafts - last round's
    (vLLM's rule, `vllm_hybridspec.adaptive.budget`), or as `choose_verify_lengths(budget_floor=...)`.
    """
    _check_inputs(confidences, num_drafts, latency)
    if min_drafts < 0 or (max_drafts is not None and max_drafts < min_drafts):
        raise ValueError(f"need 0 <= min_drafts <= max_drafts, got {min_drafts}, {max_drafts}")
    *lead, batch, k = confidences.shape
    device = confidences.device
    capacity, survival, valid, forced, key_sorted, order, survival_sorted = _rank_pairs(
        confidences, num_drafts, min_drafts, max_drafts)
    rank = torch.arange(1, batch * k + 1, device=device, dtype=torch.float64)
    rates = (batch + torch.cumsum(survival_sorted, dim=-1)) / latency.round_us(batch, 1.0 + rank / batch)
    num_forced = forced.flatten(-2).sum(-1, keepdim=True)
    eligible = (key_sorted > _INVALID_KEY) & (rank >= num_forced)
    rates = torch.where(eligible, rates, torch.full_like(rates, -1.0))
    rate0 = (batch / latency.round_us(batch, 1.0)).expand(*lead, 1)
    rate0 = torch.where(num_forced > 0, torch.full_like(rate0, -1.0), rate0)
    return torch.argmax(torch.cat([rate0, rates], dim=-1), dim=-1)


def _worth_reaching(survival_sorted, valid_sorted, previous_gain, previous_round, latency, batch, k, rho,
                    forecast_confidences, capacity):
    """[..., N] bool: rank r is admitted iff SOME stopping count m >= r beats stopping at r - 1, with the pairs
    ranked r + 1..m forecast from what is known at rank r (see `choose_verify_lengths`, lookahead).

    Forecast of the pair at global rank j > r: s_r * f_j / f_r, f = the descending survival curve of
    `forecast_confidences` (last round's: it does not depend on this round's drafts) - last round's shape,
    scaled to this round's level at rank r, and never above s_r since f descends; s_r itself without a
    forecast (optimistic). Candidate stops m: r itself, every count at which the mean verified length is an
    integer (the profile's own points; T is linear in m between them) and the last valid pair.
    """
    device = survival_sorted.device
    lead = survival_sorted.shape[:-1]
    n = batch * k
    rank = torch.arange(1, n + 1, device=device)
    curve = latency.round_us(batch, 1.0 + torch.arange(n + 1, device=device, dtype=torch.float64) / batch)
    num_valid = valid_sorted.sum(-1, keepdim=True)                                       # [..., 1]
    knots = torch.arange(1, k + 1, device=device) * batch                                # [k]
    # [..., N, k + 2]: r, the knots, the last valid pair.
    stops = torch.cat([rank.unsqueeze(-1).expand(*lead, n, 1), knots.expand(*lead, n, k),
                       num_valid.unsqueeze(-1).expand(*lead, n, 1)], dim=-1)
    usable = (stops >= rank.unsqueeze(-1)) & (stops <= num_valid.unsqueeze(-1))
    stops = torch.where(usable, stops, rank.unsqueeze(-1).expand_as(stops))

    s_r = survival_sorted.unsqueeze(-1)                                                  # [..., N, 1]
    later = (stops - rank.unsqueeze(-1)).double()                                        # pairs r + 1..m
    if forecast_confidences is None:
        forecast_gain = s_r * later
    else:
        forecast = survival_probabilities(forecast_confidences, capacity).flatten(-2).double()
        forecast = torch.sort(forecast, dim=-1, descending=True).values                  # [..., N]
        cum = torch.cat([torch.zeros_like(forecast[..., :1]), torch.cumsum(forecast, dim=-1)], dim=-1)
        at_r = forecast.unsqueeze(-1)                                                    # f_r, [..., N, 1]
        scale = torch.where(at_r > 0, s_r / at_r.clamp(min=1e-300), torch.zeros_like(at_r))
        cum_rows = cum.unsqueeze(-2).expand(*lead, n, n + 1)
        forecast_gain = scale * (cum_rows.gather(-1, stops) - cum[..., 1:].unsqueeze(-1))
    added_gain = s_r + forecast_gain.clamp(min=0.0)
    stop_us = curve[stops]
    if rho is None:
        better = added_gain * previous_round.unsqueeze(-1) > previous_gain.unsqueeze(-1) * (
            stop_us - previous_round.unsqueeze(-1))
    else:
        own = added_gain * previous_round.unsqueeze(-1) > previous_gain.unsqueeze(-1) * (
            stop_us - previous_round.unsqueeze(-1))
        priced = added_gain > rho.unsqueeze(-1) * (stop_us - previous_round.unsqueeze(-1))
        better = torch.where(torch.isnan(rho.unsqueeze(-1)), own, priced)
    return (better & usable).any(-1)
