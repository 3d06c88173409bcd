"""Verification-length policy: per-request lengths chosen on the device from acceptance estimates and T(L).

Runtime flow per step (all device tensors, no host sync; see each function's docstring):

    latency = VerifyLatencyModel(LatencyProfile.load(path), max_batch, K + 1, overhead_us=draft_us)  # start-up
    calibrator = OnlineAcceptanceCalibrator(K)          # when the drafter has no confidence head
    tracker = ThroughputTracker()                       # optional: price tokens at the long-run rate

    features = max_prob_log_odds(draft_logits)          # [B, K], prefix-only scores (or DSpark's conf logits)
    conf = calibrator.predict(features)                 # [B, K] conditional acceptance estimates
    decision = choose_verify_lengths(conf, num_drafts, latency, min_drafts=..., max_drafts=...,
                                     lookahead=True, forecast_confidences=last_round_conf)
    ... verify decision.num_drafts[b] drafts per request (+ a probe, see vllm_hybridspec.routing) ...
    calibrator.observe(features, num_verified, num_accepted)
    latency.observe(decision.verify_us, measured_verify_us)
"""
from vllm_hybridspec.policy.cut_budget import (
    TransitionHistory,
    budget_rate,
    cut_budget,
    cut_saving_profile,
    device_cut_rule,
    non_moe_profile,
    scenario_count,
)
from vllm_hybridspec.policy.calibrator import OnlineAcceptanceCalibrator, max_prob_log_odds
from vllm_hybridspec.policy.latency_model import ThroughputTracker, VerifyLatencyModel
from vllm_hybridspec.policy.length_policy import (
    LengthDecision,
    choose_verify_lengths,
    prefix_scan_budget,
    survival_probabilities,
    vllm_adaptive_lengths,
)
from vllm_hybridspec.policy.naive import (
    naive_choose_verify_lengths,
    naive_cut_budget,
    naive_prefix_scan_budget,
    naive_vllm_adaptive_lengths,
)

__all__ = [
    "LengthDecision",
    "OnlineAcceptanceCalibrator",
    "ThroughputTracker",
    "TransitionHistory",
    "VerifyLatencyModel",
    "budget_rate",
    "choose_verify_lengths",
    "cut_budget",
    "cut_saving_profile",
    "device_cut_rule",
    "max_prob_log_odds",
    "naive_choose_verify_lengths",
    "naive_cut_budget",
    "naive_prefix_scan_budget",
    "naive_vllm_adaptive_lengths",
    "non_moe_profile",
    "prefix_scan_budget",
    "scenario_count",
    "survival_probabilities",
    "vllm_adaptive_lengths",
]
