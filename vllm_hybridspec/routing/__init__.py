"""First-router routing correction: keep or drop each request's probe token from its layer-0 expert ids."""
from vllm_hybridspec.routing.correction import (
    ExpertCost,
    ProbeCostModel,
    RoutingDecision,
    expert_cost_from_profile,
    neutralize_routing,
    new_experts_per_token,
    probe_worth,
    routing_keep_mask,
    verified_drafts_after_correction,
)
from vllm_hybridspec.routing.naive import naive_probe_worth, naive_routing_keep

__all__ = [
    "ExpertCost",
    "ProbeCostModel",
    "RoutingDecision",
    "expert_cost_from_profile",
    "naive_probe_worth",
    "naive_routing_keep",
    "neutralize_routing",
    "new_experts_per_token",
    "probe_worth",
    "routing_keep_mask",
    "verified_drafts_after_correction",
]
