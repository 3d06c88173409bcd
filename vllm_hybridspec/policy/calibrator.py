"""Online calibration of draft-side acceptance estimates: per-position Platt scaling, fitted while serving.

    c[b, k] = sigmoid(slope[k] * f[b, k] + bias[k])

f is a raw per-position score that is a function of the prefix only (what keeps the length policy lossless):
for a drafter without a confidence head, the log-odds of the draft distribution's largest probability
(vLLM's OnlineAcceptanceEstimator uses the same feature; `max_prob_log_odds` computes it); for DSpark, the
confidence head's logit. Positions get their own slope and intercept because a parallel drafter's
reliability decays with depth at a rate a single shared slope does not capture.

Labels come from verification: for a request that verified n drafts and accepted a of them, positions
k < a are accepted (1), position a is the first rejection (0) when a < n, later positions are unobserved.
That is exactly the conditional event "draft k accepted given drafts < k accepted" that c predicts.

Fitting: damped Newton (IRLS) steps on the Bernoulli log-likelihood, with the sufficient statistics of each
position's 2x2 system accumulated on the device between refits; a refit solves all positions at once. All
torch ops on device tensors, no host sync; `observe` counts steps on the host only to decide when to refit.
"""
from __future__ import annotations

import torch

# Log-odds of a one-hot draft distribution are infinite; clamp them symmetrically (as vLLM does).
MAX_LOG_ODDS = 40.0


def max_prob_log_odds(draft_logits: torch.Tensor, temperature: torch.Tensor | float | None = None) -> torch.Tensor:
    """[..., V] draft logits -> [...] log(q_max / (1 - q_max)) of the (temperature-scaled) draft distribution.

    It scores the distribution, not the drawn token, so it is a function of the prefix alone.
    """
    logits = draft_logits.float()
    if temperature is not None:
        t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
        t = torch.where(t > 0, t, torch.ones_like(t))
        logits = logits / t.reshape(t.shape + (1,) * (logits.dim() - t.dim()))
    top = logits.max(dim=-1, keepdim=True).values
    rest = torch.logsumexp(logits - top, dim=-1)
    # log sum_{z != argmax} exp(z - top) = log(exp(rest) - 1), computed stably.
    complement = torch.log(torch.expm1(rest).clamp(min=1e-30))
    return (-complement).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


class OnlineAcceptanceCalibrator:
    """Per-position Platt scaling of raw acceptance scores, refitted online from verification outcomes.

    Args:
        num_positions: K, drafts per round.
        init_slope, init_bias: starting coefficients (slope 1, bias 0 = trust the raw score's log-odds).
        refit_interval: observe() calls between Newton steps.
        min_observations: a position refits only once it has gathered this many labelled outcomes; until
            then it keeps accumulating (deep positions are reached rarely, and a Newton step from a handful
            of outcomes is mostly noise).
        damping: a position with n observations moves n / (n + damping) of a full Newton step.
        l2: ridge on the Newton system.
    """

    def __init__(
        self,
        num_positions: int,
        *,
        init_slope: float = 1.0,
        init_bias: float = 0.0,
        refit_interval: int = 20,
        min_observations: int = 128,
        damping: float = 50.0,
        l2: float = 1e-3,
        device: torch.device | str | None = None,
    ):
        if num_positions < 1:
            raise ValueError(f"num_positions must be >= 1, got {num_positions}")
        if refit_interval < 1 or damping < 0 or l2 < 0:
            raise ValueError("refit_interval must be >= 1 and damping, l2 >= 0")
        self.num_positions = num_positions
        self.refit_interval = refit_interval
        self.min_observations = min_observations
        self.damping = damping
        self.l2 = l2
        self.slope = torch.full((num_positions,), float(init_slope), device=device)
        self.bias = torch.full((num_positions,), float(init_bias), device=device)
        # Per position: [sum w f^2, sum w f, sum w, sum r f, sum r, n] of the round since the last refit.
        self.stats = torch.zeros(num_positions, 6, device=device)
        self._steps = 0

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """[..., K] raw scores -> [..., K] calibrated conditional acceptance probabilities."""
        if features.shape[-1] != self.num_positions:
            raise ValueError(f"features must end in K={self.num_positions}, got shape {tuple(features.shape)}")
        return torch.sigmoid(self.slope * features.float() + self.bias)

    def observe(self, features: torch.Tensor, num_verified: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Folds one step's outcomes in.

        features: [B, K] the raw scores the step's decision used; num_verified: [B] drafts verified;
        num_accepted: [B] drafts accepted (<= num_verified).
        """
        if features.dim() != 2 or features.shape[-1] != self.num_positions:
            raise ValueError(f"features must be [B, K={self.num_positions}], got {tuple(features.shape)}")
        if num_verified.shape != features.shape[:1] or num_accepted.shape != features.shape[:1]:
            raise ValueError("num_verified and num_accepted must be [B]")
        f = features.float()
        pred = torch.sigmoid(self.slope * f + self.bias)
        k = torch.arange(self.num_positions, device=f.device)
        accepted = num_accepted.long().unsqueeze(-1)
        verified = num_verified.long().unsqueeze(-1)
        observed = (k <= accepted) & (k < verified)
        label = (k < accepted).float()
        w = torch.where(observed, pred * (1.0 - pred), torch.zeros_like(pred))
        r = torch.where(observed, label - pred, torch.zeros_like(pred))
        step = torch.stack(
            [(w * f * f).sum(0), (w * f).sum(0), w.sum(0), (r * f).sum(0), r.sum(0), observed.float().sum(0)],
            dim=-1,
        )
        self.stats.add_(step)
        self._steps += 1
        if self._steps % self.refit_interval == 0:
            self.refit()

    def refit(self) -> None:
        """One damped Newton step for each position with enough observations; clears their statistics."""
        a, b, c, g0, g1, n = self.stats.unbind(-1)
        ready = n >= self.min_observations
        a = a + self.l2
        c = c + self.l2
        det = (a * c - b * b).clamp(min=1e-12)
        d_slope = (c * g0 - b * g1) / det
        d_bias = (a * g1 - b * g0) / det
        damp = n / (n + self.damping)
        d_slope = torch.where(ready, torch.nan_to_num(d_slope * damp), torch.zeros_like(d_slope))
        d_bias = torch.where(ready, torch.nan_to_num(d_bias * damp), torch.zeros_like(d_bias))
        # A negative slope would rank confident drafts below unconfident ones; hold it at zero instead.
        self.slope.copy_((self.slope + d_slope).clamp(min=0.0))
        self.bias.add_(d_bias)
        self.stats.mul_((~ready).unsqueeze(-1).to(self.stats.dtype))
