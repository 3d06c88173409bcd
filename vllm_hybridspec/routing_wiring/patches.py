"""The three vLLM patches of the routing correction and the device cut (listed in
`vllm_hybridspec.patches.ALL_PATCHES`; applied by `step.install` when an engine turns either on, so register()
imports neither vLLM's MoE nor torch)."""
from __future__ import annotations

from typing import Any, Callable

from vllm_hybridspec.patches.base import VllmPatch


class CorrectMoeRouting(VllmPatch):
    target = "vllm.model_executor.layers.fused_moe.router.fused_moe_router:FusedMoERouter.select_experts"
    what = ("routing correction: the first MoE router decides which probe tokens to keep; every router gives "
            "dropped probes weight 0 on experts the step already runs")
    why = ("set_capture_fn only observes ids; select_experts is the one point all modular routers (CUDA and "
           "CPU) return their routing through")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        from vllm_hybridspec.routing_wiring import step

        def select_experts(self, hidden_states, router_logits, topk_indices_dtype=None, *, input_ids=None):
            topk_weights, topk_ids = original(self, hidden_states, router_logits, topk_indices_dtype,
                                              input_ids=input_ids)
            return step.correct_routing(step.current_step(), self, topk_weights, topk_ids)

        return select_experts


class RejectDroppedProbes(VllmPatch):
    target = "vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__call__"
    what = ("marks dropped probe drafts (and every non-greedy request's probe) and neutralised drafts invalid "
            "for MRV2's rejection sampler, so verification stops before them; clears the step's buffers")
    why = ("the keep decision is made inside the forward, after vLLM fixed each request's logits; invalid_drafts "
           "is vLLM's own way to stop verification at a row, but only grammars feed it")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        from vllm_hybridspec.routing_wiring import step

        def __call__(self, logits, input_batch, draft_logits=None, invalid_drafts=None):
            routing = step.current_step()
            if routing is None or not routing.planned:
                return original(self, logits, input_batch, draft_logits, invalid_drafts)
            temperature = self.sampler.sampling_states.temperature.gpu
            row_greedy = temperature[input_batch.expanded_idx_mapping.long()] == 0.0
            ours = routing.invalid_rows(input_batch.logits_indices, row_greedy)
            combined = ours if invalid_drafts is None else invalid_drafts | ours
            output = original(self, logits, input_batch, draft_logits, combined)
            draft_tokens = input_batch.input_ids[input_batch.logits_indices.long()]
            routing.count_outcomes(input_batch.logits_indices, row_greedy, draft_tokens, output.sampled_token_ids,
                                   output.num_sampled, input_batch.cu_num_logits)
            routing.clear()
            return output

        return __call__


class ObserveVerifiedDraftsOnly(VllmPatch):
    target = "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator.observe_verification"
    what = ("vLLM's online acceptance estimator learns only from drafts the target verified: a request that "
            "RejectDroppedProbes stopped at an invalid draft reports no rejection there unless it rejected an "
            "earlier, verified draft")
    why = ("vLLM counts every logit row past the sampled tokens as rejected, so the estimator would learn that "
           "drafts fail where our policy stopped and shorten later lengths; postprocessing and the drafter must "
           "keep vLLM's own count, and this is the one call that hands it to the estimator")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        from vllm_hybridspec.routing_wiring import step

        def observe_verification(self, idx_mapping, num_sampled, num_rejected):
            routing = step.current_step()
            if routing is not None and self.acceptance_estimator is not None:  # None: DSpark's confidence head
                num_rejected = routing.estimator_rejections(num_sampled, num_rejected)
            return original(self, idx_mapping, num_sampled, num_rejected)

        return observe_verification


ROUTING_PATCHES: list[type[VllmPatch]] = [CorrectMoeRouting, RejectDroppedProbes, ObserveVerifiedDraftsOnly]
