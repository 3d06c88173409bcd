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
     ranks), never on lower-ranked ones - that is why the scan stops at the FIRST drop instead of taking
     the best prefix overall. Those pairs are (b, j <= k), functions of x_{b,<k}, and other requests'
     drafts, which are independent of request b's draft tokens given the contexts.
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


def choose_verify_lengths(
    confidences: torch.Tensor,
    num_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    min_drafts: int = 0,
    max_drafts: int | None = None,
    padded_weight: float = 0.0,
    rate_threshold: torch.Tensor | float | None = None,
) -> LengthDecision:
    """Batch-aware verification lengths (greedy admission by survival, stop at the first drop).

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

    Returns a `LengthDecision`.
    """
    _check_inputs(confidences, num_drafts, latency)
    if not 0.0 <= padded_weight <= 1.0:
        raise ValueError(f"padded_weight must be in [0, 1], got {padded_weight}")
    if min_drafts < 0 or (max_drafts is not None and max_drafts < min_drafts):
        raise ValueError(f"need 0 <= min_drafts <= max_drafts, got {min_drafts}, {max_drafts}")
    *lead, batch, k = confidences.shape
    device = confidences.device
    capacity = num_drafts.long().clamp(min=0, max=k if max_drafts is None else min(max_drafts, k))
    survival = survival_probabilities(confidences, capacity)
    positions = torch.arange(k, device=device)
    valid = positions < capacity.unsqueeze(-1)
    forced = valid & (positions < min_drafts)

    key = torch.where(valid, survival + _FORCED_BONUS * forced, torch.full_like(survival, _INVALID_KEY))
    key_sorted, order = torch.sort(key.flatten(-2), dim=-1, descending=True, stable=True)
    survival_sorted = survival.flatten(-2).gather(-1, order).double()
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
    rises = survival_sorted * previous_round > previous_gain * added_us
    if rate_threshold is not None:
        rho = torch.as_tensor(rate_threshold, dtype=torch.float64, device=device)
        rho = rho.reshape(rho.shape + (1,)) if rho.dim() else rho
        rises = torch.where(torch.isnan(rho), rises, survival_sorted > rho * added_us)
    step_ok = valid_sorted & (forced_sorted | rises)
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
