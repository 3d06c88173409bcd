"""Where the adaptive policy's T(batch, verified tokens) comes from.

`hybridspec.latency_profile`:
  - a path: that `LatencyProfile` file (eval/bench_verify_profile.py writes them on the GPU).
  - "auto" on a CUDA GPU: vLLM's own start-up profile. With adaptive verification on, vLLM times the target
    forward over token counts while it captures CUDA graphs; once it has, T(b, L) = forward(b * L tokens) and
    the drafter curve becomes the round overhead (`TokenCurveProfile`).
  - "auto" without a measured curve (CPU: no graph capture, so vLLM measures nothing; or a GPU run before
    capture): a FLAT profile, with a warning. A flat T makes every draft with a nonzero survival estimate
    worth verifying, so the lengths are then bounded only by min/max_verify_length and the estimates: on
    CPU pass a profile file to exercise the trade-off (the tests do).

The tables live on the host, where the budget half of the policy runs (vLLM decides the step's token count
there); with `device_verify_length` a second copy lives on the device for the per-request cut.
"""
from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence

from vllm_hybridspec.latency_profile import LatencyProfile
from vllm_hybridspec.policy import VerifyLatencyModel

logger = logging.getLogger("vllm.hybridspec")


class TokenCurveProfile:
    """T(batch, L) = curve(batch * L): a verify cost measured per token count (vLLM's start-up timings, ms)."""

    def __init__(self, curve_ms: Sequence[tuple[int, float]], source: str):
        points = sorted((int(n), float(ms) * 1000.0) for n, ms in curve_ms)
        if not points:
            raise ValueError("TokenCurveProfile needs at least one (tokens, ms) point")
        self.tokens = [n for n, _ in points]
        self.us = [us for _, us in points]
        self.source = source

    def interpolate(self, batch: float, L: float) -> float:
        x = batch * L
        if len(self.tokens) == 1:
            return self.us[0]
        j = min(max(bisect.bisect_right(self.tokens, x), 1), len(self.tokens) - 1)
        x0, x1, y0, y1 = self.tokens[j - 1], self.tokens[j], self.us[j - 1], self.us[j]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


class FlatProfile:
    """T(batch, L) = 1 us whatever L: verify everything the estimates do not rule out (see module docstring)."""

    source = "flat default"

    def interpolate(self, batch: float, L: float) -> float:
        return 1.0


def load_profile(latency_profile: str) -> LatencyProfile | FlatProfile:
    if latency_profile != "auto":
        profile = LatencyProfile.load(latency_profile)
        logger.info("hybridspec adaptive verification: latency profile %s (%s, %s, %s)",
                    latency_profile, profile.device, profile.model, profile.variant)
        return profile
    logger.warning(
        "hybridspec.latency_profile=auto: no measured verify curve in this engine (vLLM measures one only while "
        "it captures CUDA graphs); using a flat profile until it exists, so every draft with a nonzero "
        "acceptance estimate is verified. Pass hybridspec.latency_profile=<file.json> to plan with a profile."
    )
    return FlatProfile()


def latency_model(profile, max_batch: int, max_len: int, overhead_us=0.0, device="cpu") -> VerifyLatencyModel:
    return VerifyLatencyModel(profile, max_batch, max_len, overhead_us=overhead_us, device=device)
