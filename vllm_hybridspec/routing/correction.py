"""First-router routing correction: keep the probe token only if it is worth the experts it adds.

Verification runs each request's chosen length plus ONE extra (probe) token, the next draft, up to the first
MoE router (layer 0 of Qwen3-Next / Qwen3.5 is GDN + MoE, so: embedding, layer-0 mixer, router). The
router's top-k ids of the probe tell how many experts it would add beyond those the batch's other tokens
already activate in that layer. The probe is kept when

    survival * (1 / tokens_per_us)  >  threshold * cost_us(new experts)

i.e. when its expected accepted tokens, priced at the round's current rate (microseconds per emitted token),
outweigh the time keeping it adds over dropping it: `ExpertCost.probe_cost_us`, what T charges for one more
token at the step's own shape beyond what a dropped probe costs anyway, shifted by how far its new experts
(beyond those the step's other tokens already activate) are from the average token's. `ProbeCostModel` prices
it at the step's verified length (a probe sits where the length policy stopped, i.e. where the next token is
dear). `threshold` (hybridspec.routing_correction_threshold) scales the cost side: > 1 drops more.

A dropped probe is neutralised, not removed (static shapes for CUDA graphs): `neutralize_routing` zeroes its
routing weights and points its ids at an invalid expert in every MoE layer, so it activates no expert, and
`verified_drafts_after_correction` leaves it out of the rejection sampler's per-request length, so it is
never accepted. Attention/GDN layers may still compute it; it is the last token of its request, so causally
it changes nothing for the kept tokens.

Losslessness: the keep decision reads the probe's routing, i.e. it depends on the probe draft token x_k
itself. Under greedy decoding that is harmless (any verified length yields the target's argmax chain). Under
sampling a token-dependent decision biases the output distribution (tests/policy/test_routing_correction.py
computes the bias exactly), so only requests marked `eligible` (greedy ones) may keep a probe; the others verify
the drafts their length policy admitted, without the probe and any other draft past the policy's budget
(routing_wiring's `RoutingStep.invalid_rows`: dropping the probe alone would still read it), a decision that
reads only earlier drafts and stays lossless.

All functions are torch ops on device tensors with static shapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vllm_hybridspec.latency_profile import LatencyProfile


@dataclass(frozen=True)
class ExpertCost:
    """Marginal latency of a probe token, from the latency profile.

    probe_token_us: time every probe costs, kept or dropped. With static shapes a dropped probe still runs
        through the attention / GDN layers and the MoE kernel computes its rows at weight 0 (only the expert
        weights it would bring are saved), so this is the non-MoE time of one token plus the MoE compute per
        routed token; 0 if the rest of verification skips dropped tokens.
    keep_token_us: time a KEPT probe adds beyond a dropped one, besides its experts.
    per_expert_layer_us: time one more distinct expert adds in ONE MoE layer.
    num_moe_layers: MoE layers the kept probe runs through.
    mean_new_experts: expected new experts per layer of a probe (the profile's unique-expert growth).
    cross_layer_correlation: r in [0, 1], how far layer 0's new-expert count predicts the other layers'
        (1: a probe that is novel in layer 0 is equally novel everywhere; 0: layer 0 tells nothing and the
        other layers cost `mean_new_experts` each).
    """

    probe_token_us: float
    keep_token_us: float
    per_expert_layer_us: float
    num_moe_layers: int
    mean_new_experts: float
    cross_layer_correlation: float = 1.0

    def __post_init__(self):
        if min(self.probe_token_us, self.keep_token_us, self.per_expert_layer_us, self.mean_new_experts) < 0:
            raise ValueError("ExpertCost: costs and mean_new_experts must be >= 0")
        if self.num_moe_layers < 1:
            raise ValueError(f"ExpertCost: num_moe_layers must be >= 1, got {self.num_moe_layers}")
        if not 0.0 <= self.cross_layer_correlation <= 1.0:
            raise ValueError(f"ExpertCost: cross_layer_correlation must be in [0, 1], got "
                             f"{self.cross_layer_correlation}")

    def probe_cost_us(self, new_experts_layer0: torch.Tensor) -> torch.Tensor:
        """Expected time that KEEPING a probe adds, given the experts it adds in layer 0."""
        n0 = torch.as_tensor(new_experts_layer0).float()
        r = self.cross_layer_correlation
        others = (self.num_moe_layers - 1) * (r * n0 + (1.0 - r) * self.mean_new_experts)
        return self.keep_token_us + self.per_expert_layer_us * (n0 + others)


def fit_moe_time(profile: LatencyProfile) -> tuple[float, float]:
    """(s_u, s_t) of moe_us = a + s_u * unique + s_t * tokens, least squares over every (batch, L) point;
    a negative coefficient is refitted without its term."""
    points = [(u, b * length, m)
              for b, u_row, m_row in zip(profile.batch_sizes, profile.unique_experts, profile.per_layer_type["moe"])
              for length, u, m in zip(profile.lengths, u_row, m_row)]

    def solve(features):
        n = len(features[0])
        ata = [[sum(f[i] * f[j] for f in features) for j in range(n)] for i in range(n)]
        aty = [sum(f[i] * m for f, (_, _, m) in zip(features, points)) for i in range(n)]
        for col in range(n):  # Gauss-Jordan with partial pivoting on the small normal equations
            pivot = max(range(col, n), key=lambda r: abs(ata[r][col]))
            ata[col], ata[pivot], aty[col], aty[pivot] = ata[pivot], ata[col], aty[pivot], aty[col]
            if abs(ata[col][col]) < 1e-12:
                return None
            for r in range(n):
                if r != col:
                    f = ata[r][col] / ata[col][col]
                    ata[r] = [x - f * y for x, y in zip(ata[r], ata[col])]
                    aty[r] -= f * aty[col]
        return [aty[i] / ata[i][i] for i in range(n)]

    both = solve([(1.0, u, t) for u, t, _ in points])
    if both is not None and both[1] >= 0 and both[2] >= 0:
        return both[1], both[2]
    only_u = solve([(1.0, u) for u, _, _ in points])
    only_t = solve([(1.0, t) for _, t, _ in points])
    if both is not None and both[1] < 0 and only_t is not None:
        return 0.0, max(only_t[1], 0.0)
    return (max(only_u[1], 0.0) if only_u else 0.0), 0.0


def _row_interp(xs: list[int], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def expert_cost_from_profile(
    profile: LatencyProfile,
    batch: int,
    length: float,
    *,
    num_moe_layers: int,
    top_k: int,
    cross_layer_correlation: float = 1.0,
    dropped_token_runs: bool = True,
    anchor_to_t: bool = False,
    moe_fit: tuple[float, float] | None = None,
) -> ExpertCost:
    """Fits `ExpertCost` at (batch, verified length per request) from a profile with MoE breakdown.

    MoE time (summed over layers) is fitted over all measured (batch, L) points as
        moe_us = a + s_u * unique_experts_per_layer + s_t * tokens
    (unique experts and tokens are not collinear across batch sizes): per_expert_layer_us = s_u / MoE layers
    (weights of one more distinct expert, every layer); s_t is the MoE kernel's compute per routed token. The
    non-MoE time of one token and mean_new_experts: finite differences in L at `length` of the non-MoE time
    and of the unique experts, per added token (one length step adds `batch` tokens).
    `dropped_token_runs` (static shapes, the default): a dropped probe still runs every layer - the non-MoE
    ones, and the MoE kernel computes its rows at weight 0 on experts the step runs anyway
    (routing_wiring's `neutralize_dropped`) - so the non-MoE time and s_t are `probe_token_us`, paid by every
    probe; otherwise (the rest of verification skips dropped tokens) both go to `keep_token_us`.
    `moe_fit`: (s_u, s_t) when already fitted (`fit_moe_time`), so that pricing many step shapes fits once.

    `anchor_to_t`: set keep_token_us so that a probe with the average new-expert count costs what T itself
    charges for one more verified token at (batch, length) (the fit keeps only the per-expert slope). The
    MoE fit alone can price a token far below T where T is extrapolated in batch, which makes kept probes
    look cheaper than the drafts the length policy just declined.
    """
    if profile.per_layer_type is None or "moe" not in profile.per_layer_type or profile.unique_experts is None:
        raise ValueError(
            f"profile variant {profile.variant!r} has no per_layer_type['moe'] / unique_experts: the routing "
            "correction needs the MoE time against unique experts"
        )
    if batch < 1 or length < 1 or num_moe_layers < 1 or top_k < 1:
        raise ValueError("batch, length, num_moe_layers and top_k must be >= 1")
    moe, unique, lengths = profile.per_layer_type["moe"], profile.unique_experts, profile.lengths
    per_unique_us, moe_token_us = fit_moe_time(profile) if moe_fit is None else moe_fit
    per_expert_layer_us = per_unique_us / num_moe_layers

    def at(table, b, x):
        return _row_interp(profile.batch_sizes, [_row_interp(lengths, row, x) for row in table], b)

    non_moe = [[t - m for t, m in zip(t_row, m_row)] for t_row, m_row in zip(profile.t_us, moe)]
    token_us = max(at(non_moe, batch, length + 1) - at(non_moe, batch, length), 0.0) / batch
    new_experts = (at(unique, batch, length + 1) - at(unique, batch, length)) / batch
    mean_new = min(max(new_experts, 0.0), float(top_k))
    probe_token_us = token_us + moe_token_us if dropped_token_runs else 0.0
    keep_token_us = 0.0 if dropped_token_runs else token_us + moe_token_us
    if anchor_to_t:
        t_token_us = max(profile.interpolate(batch, length + 1) - profile.interpolate(batch, length), 0.0) / batch
        keep_token_us = max(t_token_us - probe_token_us - per_expert_layer_us * mean_new * num_moe_layers, 0.0)
    return ExpertCost(
        probe_token_us=probe_token_us,
        keep_token_us=keep_token_us,
        per_expert_layer_us=per_expert_layer_us,
        num_moe_layers=num_moe_layers,
        mean_new_experts=mean_new,
        cross_layer_correlation=cross_layer_correlation,
    )


class ProbeCostModel:
    """`ExpertCost` at any step shape (batch, verified tokens per request), from one profile with MoE breakdown.

    A probe must be priced where it lands: at the step's own verified length, not at a typical one. The length
    policy stops a request exactly where the next token is dear - in front of a step of a measured T(L) (the
    H200 profile's batch-1 row is far from linear) - so the probe, the first draft it did not
    admit, sits at such a step far more often than a random length does. Priced at the mean length of the
    steps, those probes looked cheap and were kept; that is why the correction lost 0.6% at concurrency 1
    (eval/notes/simulate.md, session 3). The MoE fit is done once; each step shape is priced once and cached
    (keyed by its token count, batch x length).
    """

    def __init__(self, profile: LatencyProfile, *, num_moe_layers: int, top_k: int,
                 cross_layer_correlation: float = 1.0, dropped_token_runs: bool = True, anchor_to_t: bool = True):
        if profile.per_layer_type is None or "moe" not in profile.per_layer_type or profile.unique_experts is None:
            raise ValueError(
                f"profile variant {profile.variant!r} has no per_layer_type['moe'] / unique_experts: the routing "
                "correction needs the MoE time against unique experts"
            )
        self.profile = profile
        self._options = dict(num_moe_layers=num_moe_layers, top_k=top_k,
                             cross_layer_correlation=cross_layer_correlation, dropped_token_runs=dropped_token_runs,
                             anchor_to_t=anchor_to_t, moe_fit=fit_moe_time(profile))
        self._cache: dict[tuple[int, int], ExpertCost] = {}

    def at(self, batch: int, length: float) -> ExpertCost:
        """The cost of a probe added to a step of `batch` requests verifying `length` tokens each on average."""
        if batch < 1 or not length >= 1:
            raise ValueError(f"ProbeCostModel.at: need batch >= 1 and length >= 1, got {batch}, {length}")
        key = (int(batch), round(float(length) * batch))
        if key not in self._cache:
            self._cache[key] = expert_cost_from_profile(self.profile, key[0], key[1] / key[0], **self._options)
        return self._cache[key]


def probe_worth(
    next_survival: torch.Tensor,
    tokens_per_us: torch.Tensor | float,
    cost: ExpertCost,
    top_k: int,
    *,
    threshold: float = 1.0,
    overhead_us: float = 0.0,
) -> torch.Tensor:
    """[..., B] bool: whether to append a probe token to each request at all.

    A probe always costs `cost.probe_token_us` (+ `overhead_us`, this request's share of the decision
    kernels); it pays back only when it turns out cheap enough to keep. Its layer-0 new-expert count is
    modelled as Binomial(top_k, mean_new_experts / top_k), so the expected benefit is
        E_j[max(0, value - threshold * keep_cost(j))],   value = next_survival / tokens_per_us,
    and the request gets a probe iff that exceeds threshold * (probe_token_us + overhead_us). The decision
    reads only the prefix (survival of the next draft), so it keeps the length choice a stopping time.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    device = next_survival.device
    j = torch.arange(top_k + 1, device=device, dtype=torch.float64)
    p = min(max(cost.mean_new_experts / top_k, 0.0), 1.0)
    log_comb = (torch.lgamma(torch.tensor(top_k + 1.0, dtype=torch.float64)) - torch.lgamma(j + 1)
                - torch.lgamma(top_k - j + 1))
    pmf = torch.exp(log_comb + j * math.log(max(p, 1e-300)) + (top_k - j) * math.log(max(1 - p, 1e-300)))
    rate = torch.as_tensor(tokens_per_us, dtype=torch.float64, device=device).clamp(min=1e-12)
    value = next_survival.double() / (rate.unsqueeze(-1) if rate.dim() else rate)
    keep_cost = threshold * cost.probe_cost_us(j).double()
    benefit = ((value.unsqueeze(-1) - keep_cost).clamp(min=0.0) * pmf).sum(-1)
    return benefit > threshold * (cost.probe_token_us + overhead_us)


@dataclass
class RoutingDecision:
    """keep: [T] bool, False only for dropped probe tokens. new_experts: [T] int32, experts each token
    adds beyond the base set (non-probe valid tokens); meaningful at probe tokens."""

    keep: torch.Tensor
    new_experts: torch.Tensor


def new_experts_per_token(
    topk_ids: torch.Tensor, base_tokens: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """[T, k] expert ids, [T] bool base set -> [T] int32: distinct experts of each token outside the
    union of the base tokens' experts. Ids outside [0, num_experts) (e.g. -1) count as nothing."""
    ids = topk_ids.long()
    in_range = (ids >= 0) & (ids < num_experts)
    dump = torch.full_like(ids, num_experts)
    base_ids = torch.where(in_range & base_tokens.unsqueeze(-1), ids, dump)
    used = torch.zeros(num_experts + 1, dtype=torch.int32, device=ids.device)
    used.scatter_(0, base_ids.flatten(), torch.ones_like(base_ids.flatten(), dtype=torch.int32))
    used[num_experts] = 1
    fresh = used[torch.where(in_range, ids, dump)] == 0
    return fresh.sum(-1).to(torch.int32)


def routing_keep_mask(
    topk_ids: torch.Tensor,
    probe_mask: torch.Tensor,
    probe_survival: torch.Tensor,
    tokens_per_us: torch.Tensor | float,
    cost: ExpertCost,
    num_experts: int,
    *,
    threshold: float = 1.0,
    eligible: torch.Tensor | None = None,
    token_valid: torch.Tensor | None = None,
) -> RoutingDecision:
    """Decides, per probe token, whether to keep it (see the module docstring).

    Args:
        topk_ids: [T, k] layer-0 router top-k expert ids of all T verify tokens (packed).
        probe_mask: [T] bool, True at each request's probe token.
        probe_survival: [T] survival probability of the probe's draft (read where probe_mask): the
            policy's `LengthDecision.next_survival`, scattered to the probe positions.
        tokens_per_us: the price of a token, > 0: `LengthDecision.marginal_rate` (the round's rate, or the
            long-run rate when the policy ran with one).
        cost: `ExpertCost` for this batch.
        num_experts: routed experts per layer (ids outside [0, num_experts) are ignored).
        threshold: multiplies the cost side.
        eligible: [T] bool, probes that may be kept (greedy requests); None = all.
        token_valid: [T] bool, tokens that are real (cudagraph padding excluded from the base set); None = all.
    """
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k], got shape {tuple(topk_ids.shape)}")
    num_tokens = topk_ids.shape[0]
    for name, t in (("probe_mask", probe_mask), ("probe_survival", probe_survival)):
        if t.shape != (num_tokens,):
            raise ValueError(f"{name} must be [T={num_tokens}], got shape {tuple(t.shape)}")
    if probe_mask.dtype != torch.bool:
        raise ValueError(f"probe_mask must be bool, got {probe_mask.dtype}")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    valid = torch.ones_like(probe_mask) if token_valid is None else token_valid.bool()
    may_keep = probe_mask & valid if eligible is None else probe_mask & valid & eligible.bool()

    new = new_experts_per_token(topk_ids, valid & ~probe_mask, num_experts)
    rate = torch.as_tensor(tokens_per_us, dtype=torch.float32, device=topk_ids.device).clamp(min=1e-12)
    value_us = probe_survival.float() / rate
    keep_probe = may_keep & (value_us > threshold * cost.probe_cost_us(new))
    return RoutingDecision(keep=~probe_mask | keep_probe, new_experts=new)


def neutralize_routing(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, keep: torch.Tensor, invalid_id: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing of every MoE layer with dropped tokens sent nowhere: ids -> `invalid_id`, weights -> 0.
    Kept tokens' routing is returned unchanged."""
    if topk_ids.shape != topk_weights.shape or keep.shape != topk_ids.shape[:1]:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must be [T, k] "
            f"and keep {tuple(keep.shape)} [T]"
        )
    k = keep.bool().unsqueeze(-1)
    ids = torch.where(k, topk_ids, torch.full_like(topk_ids, invalid_id))
    weights = torch.where(k, topk_weights, torch.zeros_like(topk_weights))
    return ids, weights


def verified_drafts_after_correction(
    num_drafts: torch.Tensor, probe_index: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """[B] drafts the rejection sampler verifies: the policy's count, plus one where the request's probe
    (token index `probe_index[b]`, -1 if it had none) was kept. A dropped probe is never verified."""
    if num_drafts.shape != probe_index.shape:
        raise ValueError("num_drafts and probe_index must both be [B]")
    has_probe = probe_index >= 0
    kept = keep[probe_index.clamp(min=0).long()] & has_probe
    return num_drafts + kept.to(num_drafts.dtype)
