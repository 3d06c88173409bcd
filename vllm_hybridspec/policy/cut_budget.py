"""How many drafts the host schedules when the device may cut them (`hybridspec.device_verify_length`).

vLLM fixes a step's token count on the host, from LAST step's confidences. With the device cut, each request
then verifies only what the length policy admits on THIS step's confidences; scheduled drafts it does not admit
are neutralised: they still run the non-MoE layers and their MoE rows at weight 0, but bring no expert and are
never accepted. Scheduling more than last step's best prefix is therefore an option: it pays when this step turns
out more confident than the last one (the device verifies further), and costs the neutralised tokens' time when
it does not. How much the option is worth depends on how much a request's survival curve moves from one step
to the next, and on the batch: at batch 1 the device's extra draft is that request's next one, at batch 64 it
is the best of 64 requests' next drafts, whose survival moves far less than any single request's.

`cut_budget` prices the option by scenarios of this step's survival curves: each request's curve from last
step, shifted by a change one request showed between two consecutive earlier steps (`TransitionHistory`: the
logit of the survival at every position, so a request's positions move together). In each scenario q the device
verifies d_q drafts - the prefix of the scenario's ranking that the device cut's own pricing prefers (tokens -
rate x the time verifying them costs beyond neutralising them; or its exact rule, `device_cut_rule`), capped by
the scheduled count M; the host picks the M (at least its own budget) with the best expected rate
E[tokens] / E[time] over the scenarios:

    tokens_q(M) = B + the min(M, d_q) largest survivals of scenario q
    time_q(M)   = T(min(M, d_q)) + N(M) - N(min(M, d_q)) + s_t * (M - min(M, d_q))

with T the round time, N its non-MoE part (the neutralised tokens still run it) and s_t the MoE kernel's
compute per neutralised token.

Lossless: the count depends on last step's confidences, on earlier steps' and on independent random draws,
never on this step's draft tokens; the device's cut is a stopping rule (vllm_hybridspec/adaptive/budget.py).
"""
from __future__ import annotations

import dataclasses

import torch

from vllm_hybridspec.latency_profile import LatencyProfile
from vllm_hybridspec.policy.latency_model import VerifyLatencyModel
from vllm_hybridspec.policy.length_policy import _rank_pairs, choose_verify_lengths, survival_probabilities

# Survivals are moved in logit space; this keeps the logit of a survival of 0 or 1 finite.
_EPS = 1e-6


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.logit(p.double().clamp(_EPS, 1.0 - _EPS))


class TransitionHistory:
    """The last `capacity` step-to-step changes of one request's survival curve: logit shifts [capacity, K]."""

    def __init__(self, num_positions: int, capacity: int = 512):
        if num_positions < 1 or capacity < 1:
            raise ValueError(f"TransitionHistory: need num_positions >= 1 and capacity >= 1, got {num_positions}, "
                             f"{capacity}")
        self.shifts = torch.zeros(capacity, num_positions, dtype=torch.float64)
        self.size = 0
        self._next = 0

    def observe(self, previous: torch.Tensor, current: torch.Tensor) -> None:
        """previous, current: [n, K] conditional acceptance estimates of the same n requests on two consecutive
        steps (rows of requests that have no earlier step must be left out by the caller)."""
        k = self.shifts.shape[1]
        if previous.shape != current.shape or previous.dim() != 2 or previous.shape[1] != k:
            raise ValueError(f"previous and current must both be [n, {k}], got {tuple(previous.shape)} and "
                             f"{tuple(current.shape)}")
        shift = (_logit(torch.cumprod(current.double().clamp(0.0, 1.0), -1))
                 - _logit(torch.cumprod(previous.double().clamp(0.0, 1.0), -1)))
        capacity = self.shifts.shape[0]
        shift = shift[-capacity:]
        self.shifts[(self._next + torch.arange(shift.shape[0])) % capacity] = shift
        self._next = (self._next + shift.shape[0]) % capacity
        self.size = min(self.size + shift.shape[0], capacity)

    def sample(self, num_samples: int, shape: tuple[int, ...], generator: torch.Generator | None = None):
        """[num_samples, *shape, K] shifts drawn with replacement (one per request and scenario), or None while
        nothing has been observed."""
        if self.size == 0:
            return None
        pick = torch.randint(0, self.size, (num_samples, *shape), generator=generator)
        return self.shifts[pick]


def scenario_count(batch: int, scenario_requests: int = 256) -> int:
    """Scenarios per step: each scenario already draws every request of the batch, so the expected rate is as
    precise with fewer of them at a large batch (the host's cost grows with scenarios x batch); 4 to 32."""
    if batch < 1 or scenario_requests < 1:
        raise ValueError(f"scenario_count: need batch >= 1 and scenario_requests >= 1, got {batch}, "
                         f"{scenario_requests}")
    return max(4, min(32, -(-scenario_requests // batch)))


def non_moe_profile(profile: LatencyProfile) -> LatencyProfile:
    """The profile without its MoE layers (what a neutralised token still runs); needs `per_layer_type['moe']`."""
    if profile.per_layer_type is None or "moe" not in profile.per_layer_type:
        raise ValueError(f"profile variant {profile.variant!r} has no per_layer_type['moe']")
    table = [[t - m for t, m in zip(t_row, m_row)] for t_row, m_row in zip(profile.t_us, profile.per_layer_type["moe"])]
    return dataclasses.replace(profile, t_us=table, per_layer_type=None, unique_experts=None)


def cut_saving_profile(profile: LatencyProfile, moe_token_us: float) -> LatencyProfile:
    """What verifying a SCHEDULED draft costs beyond neutralising it: T minus what a neutralised token runs as well
    (the non-MoE layers and its MoE rows, `moe_token_us` per token), i.e. the MoE time minus the rows' compute.
    The device cut prices its choice with it: a scheduled token costs its non-MoE time either way, so cutting it
    saves only its experts; priced with the whole T, the cut gave up drafts worth more than that saving."""
    if profile.per_layer_type is None or "moe" not in profile.per_layer_type:
        raise ValueError(f"profile variant {profile.variant!r} has no per_layer_type['moe']")
    if not moe_token_us >= 0:
        raise ValueError(f"moe_token_us must be >= 0, got {moe_token_us}")
    table = [[m - moe_token_us * b * length for m, length in zip(m_row, profile.lengths)]
             for b, m_row in zip(profile.batch_sizes, profile.per_layer_type["moe"])]
    return dataclasses.replace(profile, t_us=table, per_layer_type=None, unique_experts=None)


def budget_rate(stale_confidences: torch.Tensor, num_drafts: torch.Tensor, latency: VerifyLatencyModel,
                budget: torch.Tensor | int, *, min_drafts: int = 0) -> torch.Tensor:
    """[...] float64: expected emitted tokens per microsecond of the host's `budget` best pairs of last step's
    ranking (`prefix_scan_budget`'s objective at its count): the price of a token for the device cut."""
    *lead, batch, k = stale_confidences.shape
    *_, survival_sorted = _rank_pairs(stale_confidences, num_drafts, min_drafts, None)
    gains = batch + torch.cat([torch.zeros_like(survival_sorted[..., :1]), torch.cumsum(survival_sorted, -1)], -1)
    count = torch.as_tensor(budget, device=gains.device).long().expand(lead).clamp(0, batch * k)
    return gains.gather(-1, count.unsqueeze(-1)).squeeze(-1) / latency.round_us(batch, 1.0 + count.double() / batch)


def device_cut_rule(saving_latency: VerifyLatencyModel, stale_confidences: torch.Tensor,
                    rate: torch.Tensor | float, *, min_drafts: int = 0, max_drafts: int | None = None):
    """The device cut's admission (vllm_hybridspec/adaptive/budget.py `device_verify_lengths`) as `cut_budget`'s
    `device_rule`: the lookahead on a scenario's confidences, forecast from last step, each draft priced by what
    verifying it costs beyond neutralising it (`cut_saving_profile`) at the host's `rate` (`budget_rate`)."""
    *lead, batch, k = stale_confidences.shape

    def rule(confidences: torch.Tensor, capacities: torch.Tensor) -> torch.Tensor:
        scenarios = confidences.shape[0]
        forecast = stale_confidences.expand(scenarios, *stale_confidences.shape).reshape(-1, batch, k)
        price = torch.as_tensor(rate, dtype=torch.float64).expand(scenarios, *lead).reshape(-1)
        decision = choose_verify_lengths(confidences.reshape(-1, batch, k), capacities.reshape(-1, batch),
                                         saving_latency, min_drafts=min_drafts, max_drafts=max_drafts, lookahead=True,
                                         forecast_confidences=forecast.to(confidences.dtype), rate_threshold=price)
        return decision.num_drafts.view(capacities.shape)

    return rule


def cut_budget(
    stale_confidences: torch.Tensor,
    num_drafts: torch.Tensor,
    latency: VerifyLatencyModel,
    cut_latency: VerifyLatencyModel,
    cut_token_us: float,
    shifts: torch.Tensor,
    min_budget: torch.Tensor | int,
    *,
    min_drafts: int = 0,
    device_rule=None,
    device_price: tuple[VerifyLatencyModel, torch.Tensor | float] | None = None,
) -> torch.Tensor:
    """[...] int64: drafts to schedule for the device to cut (>= min_budget), by the rule of the module docstring.

    Args:
        stale_confidences: [..., B, K] LAST step's conditional acceptance estimates.
        num_drafts: [..., B] integer, drafts each request may verify (its scheduled drafts, capped).
        latency: the round-time model (its batch is B).
        cut_latency: the non-MoE part of the verify time (`non_moe_profile`), no overhead.
        cut_token_us: MoE compute of one neutralised token (the MoE fit's per-token slope), >= 0.
        shifts: [Q, ..., B, K] survival logit shifts, one per scenario and request (`TransitionHistory.sample`).
        min_budget: [...] or scalar, the host's own budget (`prefix_scan_budget` of last step).
        min_drafts: drafts per request the device verifies whatever they are worth.
        device_rule: (scenario confidences [Q, ..., B, K], capacities [Q, ..., B]) -> [Q, ..., B] drafts the device
            admits in each scenario (`device_cut_rule`: the wired lookahead itself; slow at a large batch).
        device_price: (saving latency, rate [...] or scalar): the device verifies the prefix of each scenario's
            ranking with the most tokens - rate x time, the time from `cut_saving_profile` (what the device cut
            weighs; the wiring's choice: as good as `device_cut_rule` in the simulator, at a fraction of the host's
            time). Neither: the prefix with the best rate tokens / T.
    """
    if stale_confidences.dim() < 2 or not stale_confidences.is_floating_point():
        raise ValueError(f"stale_confidences must be a float [..., B, K], got {tuple(stale_confidences.shape)}")
    if num_drafts.shape != stale_confidences.shape[:-1] or num_drafts.is_floating_point():
        raise ValueError(f"num_drafts must be an integer [..., B] = {tuple(stale_confidences.shape[:-1])}, got "
                         f"{tuple(num_drafts.shape)} {num_drafts.dtype}")
    if shifts.dim() != stale_confidences.dim() + 1 or shifts.shape[1:] != stale_confidences.shape:
        raise ValueError(f"shifts must be [Q, {', '.join(map(str, stale_confidences.shape))}], got "
                         f"{tuple(shifts.shape)}")
    if not cut_token_us >= 0:
        raise ValueError(f"cut_token_us must be >= 0, got {cut_token_us}")
    *lead, batch, k = stale_confidences.shape
    capacity = num_drafts.long().clamp(0, k)
    survival = survival_probabilities(stale_confidences, capacity).double()
    scenario = torch.sigmoid(_logit(survival) + shifts.double())
    scenario = torch.where(survival > 0, scenario, torch.zeros_like(scenario))
    scenario = torch.cummin(scenario, dim=-1).values  # a shifted curve may rise; a survival curve never does
    # ranked on float32 keys (the sort is the host's main cost at large batch), summed in float64
    flat = scenario.flatten(-2)
    ranked = flat.gather(-1, torch.sort(flat.float(), dim=-1, descending=True).indices)         # [Q, ..., N]
    gains = batch + torch.cat([torch.zeros_like(ranked[..., :1]), torch.cumsum(ranked, dim=-1)], dim=-1)

    counts = torch.arange(batch * k + 1, device=stale_confidences.device)
    x = 1.0 + counts.double() / batch
    round_us = latency.round_us(batch, x)                                                      # [N + 1]
    non_moe_us = cut_latency.verify_us(batch, x)
    num_valid = capacity.sum(-1)                                                               # [...]
    forced = capacity.clamp(max=min_drafts).sum(-1)
    feasible = counts <= num_valid.unsqueeze(-1)                                               # [..., N + 1]
    if device_price is not None:
        saving, price = device_price
        price = torch.as_tensor(price, dtype=torch.float64).reshape(*lead, 1) if lead else torch.as_tensor(price)
        value = gains - price * saving.verify_us(batch, x)
        value = torch.where(feasible & (counts >= forced.unsqueeze(-1)), value, torch.full_like(value, -1e30))
        device_count = torch.argmax(value, dim=-1, keepdim=True)
    elif device_rule is None:
        rate = torch.where(feasible & (counts >= forced.unsqueeze(-1)), gains / round_us, torch.full_like(gains, -1.0))
        device_count = torch.argmax(rate, dim=-1, keepdim=True)                                # [Q, ..., 1]
    else:
        # the scenario's conditional acceptances (its survival curves' ratios), as the device would estimate them
        previous = torch.cat([torch.ones_like(scenario[..., :1]), scenario[..., :-1]], dim=-1)
        confidences = torch.where(previous > 0, scenario / previous.clamp(min=1e-300), torch.zeros_like(scenario))
        admitted = device_rule(confidences.to(stale_confidences.dtype), capacity.expand(scenario.shape[:-1]))
        device_count = admitted.long().sum(-1, keepdim=True)

    verified = torch.minimum(counts, device_count)                                             # [Q, ..., N + 1]
    tokens = gains.gather(-1, verified)
    time_us = (round_us[verified] + (non_moe_us - non_moe_us[verified]).clamp(min=0.0)
               + cut_token_us * (counts - verified))
    expected_rate = tokens.mean(0) / time_us.mean(0)                                           # [..., N + 1]
    floor = torch.as_tensor(min_budget, device=stale_confidences.device).long()
    floor = floor.reshape(floor.shape + (1,)) if floor.dim() else floor
    allowed = (counts >= floor) & feasible
    best = torch.argmax(torch.where(allowed, expected_rate, torch.full_like(expected_rate, -1.0)), dim=-1)
    return torch.maximum(best, torch.as_tensor(min_budget, device=best.device).long().clamp(max=num_valid))
