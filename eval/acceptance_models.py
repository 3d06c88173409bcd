"""Per-position acceptance models fitted to published acceptance lengths, and the traces drawn from them.

Model (one request, one speculative round, K drafts):
    a ~ Beta(mu * kappa, (1 - mu) * kappa)          the round's difficulty (persistent across rounds: with
                                                      probability `persistence` a request keeps last round's a)
    c_k = a * decay ** (k - 1),  k = 1..K            conditional acceptance of draft k given drafts < k accepted
    accepted drafts A = first k with u_k >= c_k (u_k uniform), minus one

so the survival probability is s_k = E[a^k] * decay^(k (k - 1) / 2) and the mean acceptance length (accepted
drafts + the bonus token) tau(K) = 1 + sum_{k<=K} s_k.

The shape parameters (kappa, decay) are fitted once to a published per-position acceptance profile of a
DFlash drafter; mu is then solved per task so that tau(K) equals the task's published acceptance length.
Every number used here is in `PUBLISHED` with its source; eval/notes/simulate.md discusses them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

# Published acceptance figures. tau = mean accepted drafts + 1 per verify step, greedy, thinking off.
PUBLISHED = {
    # z-lab/Qwen3-4B-DFlash-b16 (block 16 -> 15 drafts), SGLang, T=0, thinking off, measured by a third
    # party harness with the published checkpoint: huggingface.co/seliny2/qwen3-4b-dflash-data
    # ("z-lab M0 (target bar)" row). Cross-checks for gsm8k: 6.29 (DFlash paper, arXiv 2602.06036, as
    # tabulated by wizwand.com) and 6.35 (SGLang, B200, c1; anchors.md).
    "dflash_b16_tau": {"gsm8k": 6.27, "humaneval": 6.72, "mt-bench": 3.43},
    "dflash_b16_tau_source": "huggingface.co/seliny2/qwen3-4b-dflash-data (z-lab/Qwen3-4B-DFlash-b16, T=0, B16)",
    # Per-position survival P(draft k accepted), k = 1..7, of a DFlash drafter (Qwen3-8B, block 8) on its
    # validation set: huggingface.co/mgoin/Qwen3-8B-speculator.dflash. Used for the SHAPE (heterogeneity
    # and decay) only; its level is replaced per task by mu.
    "dflash_position_survival": [0.665, 0.474, 0.338, 0.243, 0.180, 0.141, 0.115],
    "dflash_position_survival_source": "huggingface.co/mgoin/Qwen3-8B-speculator.dflash",
}
TASKS = ("gsm8k", "humaneval", "mt-bench")


@dataclass(frozen=True)
class AcceptanceModel:
    mu: float
    kappa: float
    decay: float

    def survival(self, num_positions: int) -> list[float]:
        alpha, beta = self.mu * self.kappa, (1.0 - self.mu) * self.kappa
        out, moment = [], 1.0
        for k in range(1, num_positions + 1):
            moment *= (alpha + k - 1) / (alpha + beta + k - 1)
            out.append(moment * self.decay ** (k * (k - 1) / 2))
        return out

    def tau(self, num_drafts: int) -> float:
        return 1.0 + sum(self.survival(num_drafts))


def fit_shape(survival: list[float]) -> tuple[float, float, float]:
    """(mu, kappa, decay) minimising the squared log error to a survival profile (grid + refinement)."""
    target = [math.log(s) for s in survival]

    def loss(mu, kappa, decay):
        s = AcceptanceModel(mu, kappa, decay).survival(len(survival))
        return sum((math.log(max(a, 1e-12)) - b) ** 2 for a, b in zip(s, target))

    best = min(((loss(mu, kappa, decay), mu, kappa, decay)
                for mu in [i / 40 for i in range(4, 40)]
                for kappa in [0.25 * 1.25 ** i for i in range(30)]
                for decay in [0.80 + 0.01 * i for i in range(21)]))
    _, mu, kappa, decay = best
    step = [0.01, 0.1 * kappa, 0.005]
    for _ in range(200):
        improved = False
        for i in range(3):
            for sign in (1, -1):
                cand = [mu, kappa, decay]
                cand[i] += sign * step[i]
                if not (0.01 < cand[0] < 0.999 and cand[1] > 0.05 and 0.5 < cand[2] <= 1.0):
                    continue
                value = loss(*cand)
                if value < best[0]:
                    best, (mu, kappa, decay), improved = (value, *cand), cand, True
        if not improved:
            step = [s / 2 for s in step]
    return mu, kappa, decay


def fit_task_models(num_drafts: int = 15) -> dict[str, AcceptanceModel]:
    """Shape from the per-position profile, level per task from its published tau at `num_drafts` drafts."""
    _, kappa, decay = fit_shape(PUBLISHED["dflash_position_survival"])
    models = {}
    for task, tau in PUBLISHED["dflash_b16_tau"].items():
        lo, hi = 1e-4, 0.9999
        for _ in range(100):
            mid = (lo + hi) / 2
            if AcceptanceModel(mid, kappa, decay).tau(num_drafts) < tau:
                lo = mid
            else:
                hi = mid
        models[task] = AcceptanceModel((lo + hi) / 2, kappa, decay)
    return models


@dataclass
class Trace:
    """Pre-drawn randomness of R rounds x B requests (shared by every policy: common random numbers).

    true_conf: [R, B, K] conditional acceptance probabilities of the round.
    accepted_all: [R, B] drafts accepted if all K were verified (A); verifying n drafts accepts min(A, n).
    feature: [R, B, K] the raw score the calibrator sees (logit of the true c plus noise).
    """

    true_conf: torch.Tensor
    accepted_all: torch.Tensor
    feature: torch.Tensor
    num_drafts: int | None = None  # drafts available per round (None: all K); a recording's own K

    @property
    def rounds(self) -> int:
        return self.true_conf.shape[0]


def draw_trace(model: AcceptanceModel, rounds: int, batch: int, num_drafts: int, *, persistence: float,
               feature_noise: float, generator: torch.Generator) -> Trace:
    g = generator
    gamma = lambda conc: torch._standard_gamma(torch.full((rounds, batch), conc, dtype=torch.float64), generator=g)
    x, y = gamma(model.mu * model.kappa), gamma((1.0 - model.mu) * model.kappa)
    fresh = x / (x + y)
    keep = torch.rand(rounds, batch, generator=g, dtype=torch.float64) < persistence
    level = fresh.clone()
    for r in range(1, rounds):
        level[r] = torch.where(keep[r], level[r - 1], fresh[r])
    k = torch.arange(num_drafts, dtype=torch.float64)
    conf = (level.unsqueeze(-1) * model.decay ** k).clamp(1e-6, 1 - 1e-6)
    u = torch.rand(rounds, batch, num_drafts, generator=g, dtype=torch.float64)
    accepted_all = torch.cumprod((u < conf).long(), dim=-1).sum(-1)
    logit = torch.log(conf / (1 - conf))
    feature = logit + feature_noise * torch.randn(rounds, batch, num_drafts, generator=g, dtype=torch.float64)
    return Trace(conf.float(), accepted_all, feature.float())


def load_recorded_traces(path: str | Path, num_drafts: int) -> list[dict]:
    """Rounds recorded from real (e.g. tiny CPU) runs, JSONL, one object per request-round:
    {"drafter": name, "request": id, "accepted": drafts accepted with all K verified, "confidences": [K floats]}
    with K <= `num_drafts` (eval/record_tiny_traces.py writes them; lines holding "meta" are skipped).
    Replaying a shorter length n accepts min(accepted, n): exact under greedy verification."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if "meta" in row:
            continue
        conf = row.get("confidences")
        if not isinstance(conf, list) or not 1 <= len(conf) <= num_drafts or "accepted" not in row:
            raise ValueError(f"{path}:{i + 1}: need 'accepted' and 1..{num_drafts} 'confidences'")
        if not 0 <= int(row["accepted"]) <= len(conf):
            raise ValueError(f"{path}:{i + 1}: 'accepted' must be in 0..{len(conf)}, got {row['accepted']}")
        rows.append({"drafter": str(row.get("drafter", "recorded")), "request": row.get("request", 0),
                     "accepted": int(row["accepted"]), "confidences": [float(c) for c in conf]})
    if not rows:
        raise ValueError(f"{path}: no recorded rounds")
    return rows


def trace_from_recorded(rows: list[dict], rounds: int, batch: int, num_drafts: int) -> Trace:
    """Builds a Trace by cycling each of `batch` streams through the recorded rounds (stream b starts at an
    offset so that the streams are not in lockstep). Positions past the recording's K get confidence ~0 and
    `Trace.num_drafts` = K: a replay never verifies more drafts than were recorded."""
    k = max(len(row["confidences"]) for row in rows)
    if any(len(row["confidences"]) != k for row in rows):
        raise ValueError("recorded rounds must all have the same number of confidences")
    n = len(rows)
    conf = torch.full((rounds, batch, num_drafts), 1e-6)
    accepted = torch.empty(rounds, batch, dtype=torch.long)
    for b in range(batch):
        for r in range(rounds):
            row = rows[(r + b * max(1, n // max(batch, 1))) % n]
            conf[r, b, :k] = torch.tensor(row["confidences"], dtype=torch.float32)
            accepted[r, b] = min(row["accepted"], k)
    conf = conf.clamp(1e-6, 1 - 1e-6)
    return Trace(conf, accepted, torch.log(conf / (1 - conf)), num_drafts=k)
