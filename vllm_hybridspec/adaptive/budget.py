"""The decisions of one adaptive step: the batch's draft budget (host), its split over requests (device) and,
with `device_verify_length`, how many of each request's scheduled drafts are really verified (device).

vLLM fixes the number of tokens of a step on the host before the forward (every shape depends on it), so the
policy runs in two halves, as vLLM's own adaptive verification does:

1. `draft_budget` (host, at scheduling): `prefix_scan_budget` on the PREVIOUS step's confidences (the copy
   vLLM already brings to the host without a sync) gives the number of drafts the batch verifies: the best
   prefix of the survival ranking over EVERY count, so a step, a dip or a concave stretch of T(L) cannot
   stop it early (a global scan is lossless here because its input is last step's).
2. `assign_drafts` (device, no sync): the budget goes to the best (request, position) pairs ranked by the
   CURRENT survival probabilities - the order in which `choose_verify_lengths` admits pairs - with each
   request's first `min_drafts` drafts forced in and nothing past `max_drafts`.

3. `device_verify_lengths` (device, no sync; `hybridspec.device_verify_length`): the shapes are fixed, but
   the length policy (`choose_verify_lengths`, lookahead, forecast from last step) still reads THIS step's
   confidences and may verify fewer drafts than the split gave a request. The drafts past its choice are
   neutralised (vllm_hybridspec/routing_wiring: no experts in any MoE layer, invalid for the rejection
   sampler) - a cut only: a request never verifies more than the host scheduled. So that the device can also
   verify MORE than last step suggested, `CutScheduler` (host) schedules drafts beyond the budget of 1. when
   scenarios of this step's survivals say the option is worth the neutralised tokens' time
   (vllm_hybridspec/policy/cut_budget.py).

Lossless: the budget is a function of last step's confidences (and, with the cut, of earlier steps' and of
independent random draws), independent of this step's draft tokens; the
ranking by survival is prefix-consistent (a request's later pairs never outrank its earlier ones), so whether
draft k is verified depends on x_{<k} and on other requests only - a stopping time, as in
`vllm_hybridspec.policy.length_policy`'s argument. The device cut keeps this: it is the smaller of two such
stopping rules (the split, and the lookahead run on the scheduled capacities, not on the split - a request's
split count depends on its later drafts), so "verify draft k" still depends on x_{<k} only. A neutralised
draft is never accepted, and it lies after every draft its request verifies, so what the verified tokens
compute does not depend on it. Under greedy decoding any length is lossless.
"""
from __future__ import annotations

import numpy as np
import torch

from vllm_hybridspec.policy import (
    TransitionHistory,
    VerifyLatencyModel,
    budget_rate,
    choose_verify_lengths,
    cut_budget,
    cut_saving_profile,
    non_moe_profile,
    prefix_scan_budget,
    scenario_count,
)

# Forced positions rank above any survival probability (<= 1); out-of-range slots below any (>= 0).
_FORCED_BONUS = 2.0


def draft_budget(
    stale_confidences: torch.Tensor,
    scheduled_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    min_drafts: int,
    max_drafts: int,
    max_budget: int,
) -> torch.Tensor:
    """Per-request verify lengths from stale confidences (best prefix, split by rank); their sum is the budget.

    stale_confidences: [B, K] float, last step's conditional acceptance estimates (1.0 for new requests).
    scheduled_drafts: [B] int, drafts the scheduler gave each request.
    Returns [B] int32 drafts per request, capped so that the sum is at most `max_budget`
    (vLLM's single-chunk logits limit).
    """
    budget = int(prefix_scan_budget(stale_confidences, scheduled_drafts, latency, min_drafts=min_drafts,
                                    max_drafts=max_drafts))
    capacities = scheduled_drafts.long().clamp(min=0, max=max_drafts)
    lengths = assign_drafts(stale_confidences, capacities, budget, min_drafts=min_drafts)
    total = int(lengths.sum())
    if total > max_budget:  # rare: trim the longest requests first (the tail positions are worth least)
        excess = total - max_budget
        while excess > 0:
            longest = int(torch.argmax(lengths))
            lengths[longest] -= 1
            excess -= 1
    return lengths


def rank_draft_pairs(
    confidences: torch.Tensor, capacities: torch.Tensor, *, min_drafts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(survival [B, K], order [B*K]): every (request, position) pair ranked best first on the device.

    Forced pairs (the first `min_drafts` of each request) come first, then the rest by survival; pairs past a
    request's capacity come last. Ties keep (request, position) order, so a request's later draft never ranks
    above its earlier one (survival does not grow along a request).
    """
    k = confidences.shape[-1]
    positions = torch.arange(k, device=confidences.device)
    valid = positions < capacities.unsqueeze(-1)
    forced = valid & (positions < min_drafts)
    survival = torch.cumprod(confidences.float().clamp(0.0, 1.0), dim=-1)
    key = torch.where(valid, survival + _FORCED_BONUS * forced, torch.full_like(survival, -1.0))
    return survival, torch.sort(key.flatten(), descending=True, stable=True).indices


def assign_drafts(
    confidences: torch.Tensor,
    capacities: torch.Tensor,
    budget: int,
    *,
    min_drafts: int,
) -> torch.Tensor:
    """[B] int32 drafts per request: the `budget` best pairs by current survival, on the device.

    confidences: [B, K] float, this step's conditional acceptance estimates (rows of the batch).
    capacities: [B] int, drafts each request may verify (scheduled, capped at max_drafts).
    `budget` must be at most capacities.sum() and at least the forced pairs' count (the host half guarantees
    both: it used the same capacities and min_drafts).
    """
    batch, k = confidences.shape
    _, order = rank_draft_pairs(confidences, capacities, min_drafts=min_drafts)
    admitted = (torch.arange(batch * k, device=confidences.device) < budget).to(torch.int32)
    counts = torch.zeros(batch, dtype=torch.int32, device=confidences.device)
    counts.scatter_add_(0, torch.div(order, k, rounding_mode="floor"), admitted)
    return counts


def device_verify_lengths(
    confidences: torch.Tensor,
    stale_confidences: torch.Tensor,
    capacities: torch.Tensor,
    scheduled: torch.Tensor,
    latency: VerifyLatencyModel,
    *,
    min_drafts: int,
    max_drafts: int,
    rate_threshold: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """[B] int32 drafts each request really verifies: min(scheduled, the length policy's choice), on the device.

    confidences: [B, K] this step's conditional acceptance estimates; stale_confidences: [B, K] last step's
    (the lookahead's forecast). capacities: [B] drafts each request may verify (scheduled by vLLM, capped at
    max_drafts); scheduled: [B] the host budget's split (`assign_drafts`), <= capacities.
    The policy runs on `capacities`, not on `scheduled`: a request's split count depends on the survival
    of its later drafts, which the decision about an earlier draft must not read (module docstring).
    With `CutScheduler`, `latency` is what verifying a scheduled draft costs beyond neutralising it
    (`cut_saving_profile`) and `rate_threshold` the host's rate (`CutScheduler.budget`): a scheduled token runs
    either way, so the cut weighs a draft against the expert time it would save, not against a whole token.
    """
    if confidences.shape != stale_confidences.shape or confidences.dim() != 2:
        raise ValueError(f"confidences and stale_confidences must both be [B, K], got {tuple(confidences.shape)} "
                         f"and {tuple(stale_confidences.shape)}")
    if capacities.shape != scheduled.shape or capacities.shape != confidences.shape[:1]:
        raise ValueError(f"capacities and scheduled must both be [B] = [{confidences.shape[0]}], got "
                         f"{tuple(capacities.shape)} and {tuple(scheduled.shape)}")
    decision = choose_verify_lengths(confidences, capacities, latency, min_drafts=min_drafts, max_drafts=max_drafts,
                                     lookahead=True, forecast_confidences=stale_confidences.to(confidences.dtype),
                                     rate_threshold=rate_threshold)
    return torch.minimum(scheduled.to(torch.int32), decision.num_drafts)


class CutScheduler:
    """Host half of the device cut: the drafts to schedule, at least the host budget, priced by scenarios of this
    step's survivals (`vllm_hybridspec.policy.cut_budget`).

    It remembers each running request's last stale confidences (by slot and request id) so that every step adds
    the requests' step-to-step changes to its `TransitionHistory`. Needs a profile with MoE breakdown: the
    neutralised tokens are priced by its non-MoE time and the MoE fit's per-token compute.
    """

    def __init__(self, profile, latency: VerifyLatencyModel, max_num_reqs: int, num_positions: int, *,
                 min_drafts: int = 0, max_drafts: int | None = None, history: int = 512, seed: int = 0) -> None:
        from vllm_hybridspec.routing.correction import fit_moe_time

        self.latency = latency
        self.min_drafts, self.max_drafts = min_drafts, max_drafts
        self.cut_latency = VerifyLatencyModel(non_moe_profile(profile), latency.max_batch, latency.max_len)
        self.cut_token_us = fit_moe_time(profile)[1]
        # the device cut's own price of a scheduled draft; the manager keeps a device copy of the same profile
        self.saving_profile = cut_saving_profile(profile, self.cut_token_us)
        self.saving_latency = VerifyLatencyModel(self.saving_profile, latency.max_batch, latency.max_len)
        self.history = TransitionHistory(num_positions, history)
        self.generator = torch.Generator().manual_seed(seed)
        self._rows = np.ones((max_num_reqs, num_positions), dtype=np.float32)
        self._owners: list = [None] * max_num_reqs

    def observe(self, slots: np.ndarray, req_ids: list, stale: np.ndarray) -> None:
        """slots [B] int, req_ids [B], stale [B, K]: this step's stale confidences of the scheduled requests."""
        previous = self._rows[slots]
        same = np.fromiter((self._owners[s] == r for s, r in zip(slots.tolist(), req_ids)), dtype=bool,
                           count=len(req_ids))
        # a new request's row is all 1.0 (vLLM's reset) until its first drafts' confidences arrive
        moved = same & (stale != previous).any(1) & (stale != 1.0).any(1) & (previous != 1.0).any(1)
        if moved.any():
            self.history.observe(torch.from_numpy(previous[moved]), torch.from_numpy(stale[moved]))
        self._rows[slots] = stale
        for s, r in zip(slots.tolist(), req_ids):
            self._owners[s] = r

    def budget(self, stale: torch.Tensor, capacities: torch.Tensor, host_budget: int) -> tuple[int, float]:
        """(drafts to schedule >= host_budget, the host's rate for the device cut) for stale [B, K] and capacities
        [B] (scheduled drafts, capped at max_drafts)."""
        batch = stale.shape[0]
        if batch == 0:
            return host_budget, 0.0
        rate = float(budget_rate(stale, capacities, self.latency, host_budget, min_drafts=self.min_drafts))
        if self.history.size == 0:
            return host_budget, rate
        shifts = self.history.sample(scenario_count(batch), (batch,), self.generator)
        count = cut_budget(stale, capacities, self.latency, self.cut_latency, self.cut_token_us, shifts, host_budget,
                           min_drafts=self.min_drafts, device_price=(self.saving_latency, rate))
        return int(count), rate
