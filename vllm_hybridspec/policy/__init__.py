"""Verification-length policy: per-request lengths chosen on the device from acceptance estimates and T(L)."""
from vllm_hybridspec.policy.calibrator import OnlineAcceptanceCalibrator, max_prob_log_odds
from vllm_hybridspec.policy.latency_model import ThroughputTracker, VerifyLatencyModel
from vllm_hybridspec.policy.length_policy import (
    LengthDecision,
    choose_verify_lengths,
    survival_probabilities,
    vllm_adaptive_lengths,
)
from vllm_hybridspec.policy.naive import naive_choose_verify_lengths, naive_vllm_adaptive_lengths

__all__ = [
    "LengthDecision",
    "OnlineAcceptanceCalibrator",
    "ThroughputTracker",
    "VerifyLatencyModel",
    "choose_verify_lengths",
    "max_prob_log_odds",
    "naive_choose_verify_lengths",
    "naive_vllm_adaptive_lengths",
    "survival_probabilities",
    "vllm_adaptive_lengths",
]
