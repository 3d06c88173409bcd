"""Latency model of one speculative round, T(batch, verified tokens), as device tensors.

The length policy evaluates the round time for every candidate admission in one vectorised pass, so the
profile (host floats, `vllm_hybridspec.latency_profile.LatencyProfile`) is tabulated once at start-up into
a [max_batch + 1, max_len] tensor on the device and interpolated there with torch ops: no host sync, static
shapes, capturable in a CUDA graph.

Round time = overhead_us[batch] + correction * verify_us(batch, x), where x is the verified tokens per
request (fractional: vLLM packs per-request lengths, so a batch with N tokens over B requests costs about
what B requests of N / B tokens each cost). `overhead_us` is everything that does not grow with the verified
length (the drafter, sampling, scheduling); `correction` is a multiplicative EMA of measured / predicted
verify time (`observe`), kept in log space so that one outlier step cannot swing it far.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vllm_hybridspec.latency_profile import LatencyProfile

# A measured step more than this factor away from the prediction is clipped before it enters the EMA: a
# step stalled by a host hiccup should not move the model by more than a bounded amount.
_MAX_LOG_RATIO = 1.0


class VerifyLatencyModel:
    """T(batch, tokens per request) in microseconds, tabulated on `device`.

    Args:
        profile: measured verify times of the target variant that runs verification.
        max_batch: largest batch (number of requests) the table covers.
        max_len: largest verified length per request (drafts + 1) the table covers.
        overhead_us: per-round time that does not depend on the verified length: a float, a sequence
            indexed by batch (length > max_batch), or a callable batch -> us.
        ema: weight of one observation in the online correction.
        convexify: replace each batch row by its lower convex hull in L. A step in T(L) (a kernel switch,
            a tile boundary) stops a greedy admission in front of it even when the flat part behind it is
            worth reaching; the hull spreads the step so that marginal costs never decrease.
        device: where the tables live.
    """

    def __init__(
        self,
        profile: LatencyProfile,
        max_batch: int,
        max_len: int,
        *,
        overhead_us: float | Sequence[float] | Callable[[int], float] = 0.0,
        ema: float = 0.05,
        convexify: bool = False,
        device: torch.device | str | None = None,
    ):
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"max_batch and max_len must be >= 1, got {max_batch}, {max_len}")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.profile = profile
        self.max_batch = max_batch
        self.max_len = max_len
        self.ema = ema
        rows = [[profile.interpolate(max(b, 1), length) for length in range(1, max_len + 1)]
                for b in range(max_batch + 1)]
        table = torch.tensor(rows, dtype=torch.float64)
        if convexify:
            # The hull of the raw row: a dip (T(5) < T(4)) is a real point the hull can rest on, which a
            # non-decreasing clamp applied first would have erased.
            table = torch.stack([_lower_convex_hull(row) for row in table])
        # A measured table has noise; a cost that falls as L grows would make the greedy admission jump
        # over it, so the table is made non-decreasing in L (as vLLM does with its cost curves). After the
        # hull this keeps convexity (the max of two convex functions).
        table = torch.cummax(table, dim=1).values
        # float64: the policy compares rates of admissions that differ by a fraction of a microsecond at
        # batch 64; the tables are small (max_batch x max_len), so double precision costs nothing.
        self.table_us = table.to(device=device)
        self.overhead_us = torch.tensor(
            [_overhead_at(overhead_us, b) for b in range(max_batch + 1)], dtype=torch.float64, device=device
        )
        self.log_correction = torch.zeros((), dtype=torch.float64, device=device)

    @property
    def device(self) -> torch.device:
        return self.table_us.device

    def verify_us(self, batch: int, tokens_per_request: torch.Tensor | float) -> torch.Tensor:
        """Uncorrected verify time of `batch` requests of `tokens_per_request` (any shape) tokens each."""
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch {batch} outside the tabulated range 1..{self.max_batch}")
        row = self.table_us[batch]
        x = torch.as_tensor(tokens_per_request, dtype=torch.float64, device=self.device)
        x = x.clamp(1.0, float(self.max_len)) - 1.0
        lo = x.floor().long().clamp(max=self.max_len - 1)
        hi = (lo + 1).clamp(max=self.max_len - 1)
        frac = x - lo.float()
        return row[lo] * (1.0 - frac) + row[hi] * frac

    def correction(self) -> torch.Tensor:
        return self.log_correction.exp()

    def round_us(self, batch: int, tokens_per_request: torch.Tensor | float) -> torch.Tensor:
        """Predicted round time: overhead + corrected verify time."""
        return self.overhead_us[batch] + self.correction() * self.verify_us(batch, tokens_per_request)

    def observe(self, predicted_verify_us: torch.Tensor | float, measured_verify_us: torch.Tensor | float) -> None:
        """Folds one measured verify time into the correction (device ops only; accepts host floats too).

        `predicted_verify_us` is the UNcorrected prediction for the step that ran (the policy returns it as
        `LengthDecision.verify_us`).
        """
        predicted = torch.as_tensor(predicted_verify_us, dtype=torch.float64, device=self.device)
        measured = torch.as_tensor(measured_verify_us, dtype=torch.float64, device=self.device)
        log_ratio = (measured.clamp(min=1e-3) / predicted.clamp(min=1e-3)).log()
        log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).mean()
        self.log_correction.mul_(1.0 - self.ema).add_(self.ema * log_ratio)


def _lower_convex_hull(values: torch.Tensor) -> torch.Tensor:
    """Lower convex envelope of y[i] over i = 0..n-1, evaluated at every i (monotone chain)."""
    ys = values.tolist()
    hull: list[int] = []
    for i, y in enumerate(ys):
        while len(hull) >= 2:
            i0, i1 = hull[-2], hull[-1]
            if (ys[i1] - ys[i0]) * (i - i0) >= (y - ys[i0]) * (i1 - i0):
                hull.pop()
            else:
                break
        hull.append(i)
    out = list(ys)
    for i0, i1 in zip(hull, hull[1:]):
        for i in range(i0, i1 + 1):
            out[i] = ys[i0] + (ys[i1] - ys[i0]) * (i - i0) / (i1 - i0)
    return torch.tensor(out, dtype=values.dtype)


def _overhead_at(overhead_us, batch: int) -> float:
    if callable(overhead_us):
        value = float(overhead_us(max(batch, 1)))
    elif isinstance(overhead_us, (int, float)):
        value = float(overhead_us)
    else:
        if len(overhead_us) <= batch:
            raise ValueError(f"overhead_us has {len(overhead_us)} entries, needs one per batch up to {batch}")
        value = float(overhead_us[batch])
    if not value >= 0.0:
        raise ValueError(f"overhead_us must be >= 0, got {value} at batch {batch}")
    return value


class ThroughputTracker:
    """Long-run achieved rate (emitted tokens per microsecond), an EMA over steps, on the device.

    `rate` is NaN until the first `update`; `choose_verify_lengths(rate_threshold=tracker.rate)` then falls
    back to each round's own rate.
    """

    def __init__(self, ema: float = 0.05, device: torch.device | str | None = None):
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.ema = ema
        self.rate = torch.full((), float("nan"), dtype=torch.float64, device=device)

    def update(self, tokens: torch.Tensor | float, time_us: torch.Tensor | float) -> None:
        tokens = torch.as_tensor(tokens, dtype=torch.float64, device=self.rate.device).sum()
        time_us = torch.as_tensor(time_us, dtype=torch.float64, device=self.rate.device).sum().clamp(min=1e-9)
        step = tokens / time_us
        self.rate.copy_(torch.where(torch.isnan(self.rate), step, (1.0 - self.ema) * self.rate + self.ema * step))
