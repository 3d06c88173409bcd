"""Simulated tokens/s of speculative decoding policies on a measured verify-latency profile (issue 6, part 4).

Replays acceptance traces - drawn from per-position acceptance models fitted to published DFlash acceptance
lengths (eval/acceptance_models.py), or recorded ones (--traces) - against the latency profile that
eval/bench_verify_profile.py measured, at concurrency 1, 4, 16, 64 (closed loop: c requests always decoding,
one speculative round per step for all of them). Every policy sees the same trace (common random numbers),
so ratios are side by side.

Policies (kernels = the profile variant whose T(B, L) prices the verify pass):
    ar                      autoregressive decoding: T(B, 1) per token, no drafter          (baseline kernels)
    fixed_dflash            DFlash, K = 15 drafts always verified (L = 16)                   (baseline kernels)
    fixed_dflash_ours       the same on our GDN verify kernels                               (ours)
    vllm_adaptive           vLLM 0.33's adaptive rule: budget from last round's confidences,
                            global top-budget by survival                                     (ours)
    hybridspec_host         what vllm_hybridspec/adaptive runs by default: the step's budget is the best
                            prefix of LAST round's ranking (prefix_scan_budget, min_verify_length 1), split
                            over requests by the current ranking                               (ours)
    hybridspec_neutralise   hybridspec_host + the device cut (device_verify_length): the host schedules at
                            least its budget, more where scenarios of this round's survivals (last round
                            shifted by recorded round-to-round changes) price the option above the cut tokens'
                            time (policy.cut_budget); each request verifies min(split, lookahead on the
                            current confidences, a scheduled draft priced by what verifying it costs beyond
                            neutralising it, at the host's rate); the cut tokens still run the non-MoE layers
                            and the MoE kernel's per-token compute, no expert weights           (ours)
    hybridspec              our length policy on the device: lookahead admission on the current
                            confidences, forecast from last round (choose_verify_lengths)     (ours)
    hybridspec_rc           + first-router routing correction, probe priced by the profile    (ours_probe)

Round time = drafter(B) + T_kernels(B, 1 + verified drafts / B) (vLLM packs per-request lengths), plus for
hybridspec_rc the decision kernels, per probe what a dropped one costs (non-MoE time and MoE rows of one token),
per kept probe T's next token at that round's own length shifted by the experts it adds beyond the average
(ProbeCostModel at the round's shape, as the wiring prices each step; ExpertCost from the profile's MoE time
against unique experts; new experts
per layer ~ Binomial(top_k, m / top_k) with m the profile's marginal unique-expert growth; other layers copy
layer 0's count with probability --cross-layer-corr, else draw independently). The drafter is priced by a
roofline model of a DFlash drafter (DrafterCost), since the profile measures the target only.

Acceptance estimates: the policies see calibrated probabilities from OnlineAcceptanceCalibrator fed a raw
score = logit(true conditional acceptance) + N(0, --feature-noise^2). The calibrator is fitted online over
the first --warmup rounds (verifying all K drafts, so every position up to the first rejection is labelled),
then frozen, and every adaptive policy sees the same estimates: the comparisons measure the policies, not
the calibrator's learning path (tests/policy/test_calibrator_and_latency.py covers that). Warm-up rounds
are not counted.

    python eval/simulate.py                               # measured profile -> eval/results/simulate.*
    python eval/simulate.py --profile P.json --out /tmp/s --rounds-scale 0.1
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

EVAL = Path(__file__).resolve().parent
sys.path.insert(0, str(EVAL))

import torch  # noqa: E402

import acceptance_models as am  # noqa: E402
from _results import write_results  # noqa: E402
from vllm_hybridspec.latency_profile import LatencyProfile, select_profile  # noqa: E402
from vllm_hybridspec.policy import (  # noqa: E402
    OnlineAcceptanceCalibrator,
    TransitionHistory,
    ThroughputTracker,
    VerifyLatencyModel,
    choose_verify_lengths,
    cut_budget,
    prefix_scan_budget,
    budget_rate,
    cut_saving_profile,
    device_cut_rule,
    scenario_count,
    vllm_adaptive_lengths,
)
from vllm_hybridspec.routing import ProbeCostModel, probe_worth  # noqa: E402
from vllm_hybridspec.routing.correction import fit_moe_time  # noqa: E402

BENCH = "simulate"
DEFAULT_PROFILE = EVAL / "results" / "latency_profile_qwen36_35b_a3b_h200.json"
CONCURRENCY = (1, 4, 16, 64)
NUM_DRAFTS = 15
CHUNK = 20  # rounds per calibrator refit; policies run vectorised over a chunk
POLICIES = ("ar", "fixed_dflash", "vllm_adaptive", "hybridspec_host", "hybridspec_neutralise", "hybridspec",
            "hybridspec_rc")
# What vllm_hybridspec runs inside vLLM with its default config (the system headline is chosen among these).
# hybridspec / hybridspec_rc decide the step's token count on the device, which vLLM fixes on the host before
# the forward: not wired.
WIRED = ("hybridspec_host",)
# Wired, but behind a config key that is off by default (hybridspec.device_verify_length): keys `device_cut_*`.
WIRED_OPT_IN = ("hybridspec_neutralise",)
KERNELS = ("baseline", "ours")


def _labels(rows) -> list[str]:
    present = {(r["policy"], r["kernels"]) for r in rows}
    return [f"{p}@{k}" for k in KERNELS for p in POLICIES if (p, k) in present]


@dataclass(frozen=True)
class DrafterCost:
    """Roofline time of one DFlash drafter forward for B requests x (K + 1) positions, bf16.

    Defaults: a Qwen3-style DFlash drafter of 5 layers, hidden 2048, intermediate 6144 (the z-lab
    drafters' layout), sharing the target's 248,320 x 2048 LM head (logits for every position); HBM and
    dense bf16 rates as measured on the H200 (anchors.md: 4.3 TB/s copy, ~790 TFLOP/s), the latter at 50%
    efficiency; plus a fixed launch/graph overhead.
    """

    layers: int = 5
    hidden: int = 2048
    intermediate: int = 6144
    kv_dim: int = 512
    vocab: int = 248_320
    hbm_bytes_per_us: float = 4.3e6
    flops_per_us: float = 0.5 * 790e6
    launch_us: float = 20.0

    def params(self) -> int:
        attn = self.hidden * (2 * self.hidden + 2 * self.kv_dim)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + 5 * self.hidden * self.hidden + self.vocab * self.hidden

    def time_us(self, batch: int, positions: int = NUM_DRAFTS + 1) -> float:
        bytes_read = 2 * self.params()
        flops = 2 * self.params() * batch * positions
        return self.launch_us + max(bytes_read / self.hbm_bytes_per_us, flops / self.flops_per_us)


def load_variants(path: Path) -> dict[str, LatencyProfile]:
    doc = json.loads(Path(path).read_text())
    if "profile" in doc or "profiles" in doc:
        doc = doc.get("profile", doc)
    names = [p["variant"] for p in doc["profiles"]] if "profiles" in doc else [doc["variant"]]
    return {name: select_profile(doc, name) for name in names}


@dataclass
class Outcome:
    tokens: float = 0.0
    time_us: float = 0.0
    rounds: int = 0
    verified_drafts: float = 0.0
    accepted: float = 0.0
    probes: float = 0.0
    probes_kept: float = 0.0
    neutralised: float = 0.0

    def row(self, batch: int) -> dict:
        n = max(self.rounds * batch, 1)
        return {
            "tokens_per_s": round(1e6 * self.tokens / self.time_us, 2),
            "tau": round(self.tokens / n, 3),
            "mean_verified_drafts": round(self.verified_drafts / n, 3),
            "round_us": round(self.time_us / max(self.rounds, 1), 1),
            "probes_per_round": round(self.probes / max(self.rounds, 1), 3),
            "probe_keep_rate": round(self.probes_kept / self.probes, 3) if self.probes else None,
            "neutralised_per_request": round(self.neutralised / n, 3),
        }


class Cell:
    """One (trace, concurrency): runs every policy over the same rounds.

    Policies are labelled "name@kernels": the profile variant ("baseline" = vLLM 0.33's GDN verify, "ours" =
    the block-parallel one) whose T(B, L) charges the verify pass and that the adaptive policies plan with.
    """

    def __init__(self, trace: am.Trace, batch: int, profiles: dict[str, LatencyProfile], drafter: DrafterCost,
                 args, seed: int):
        self.trace, self.batch, self.args, self.seed = trace, batch, args, seed
        self.draft_us = draft_us = drafter.time_us(batch)
        base = profiles.get("baseline") or next(iter(profiles.values()))
        self.profiles = {"baseline": base}
        if "ours" in profiles:
            self.profiles["ours"] = profiles["ours"]
        lat = lambda p, overhead, cvx=False: VerifyLatencyModel(p, batch, NUM_DRAFTS + 1, overhead_us=overhead,
                                                                convexify=cvx)
        self.lat_ar = lat(base, 0.0)
        self.lat_time = {k: lat(p, draft_us) for k, p in self.profiles.items()}
        # What the adaptive policies believe (possibly convexified); time is always charged by lat_time.
        self.lat_plan = {k: lat(p, draft_us, bool(args.convexify)) for k, p in self.profiles.items()}
        self.lat_probe_pass = None
        if "ours_probe" in profiles and "ours" in profiles:
            self.lat_probe_pass = (lat(profiles["ours_probe"], 0.0), lat(profiles["ours"], 0.0))
        self.non_moe = {}  # kernels -> (T without the MoE layers, MoE compute per routed token)
        self.cut_saving = {}  # kernels -> what verifying a scheduled draft costs beyond neutralising it
        for k, p in self.profiles.items():
            if p.per_layer_type is not None and "moe" in p.per_layer_type and p.unique_experts is not None:
                self.non_moe[k] = (lat(_without_moe(p), 0.0), fit_moe_time(p)[1])
                self.cut_saving[k] = lat(_cut_saving(p, fit_moe_time(p)[1]), 0.0)
        self._cost_models = {}
        self.estimates = self._calibrate()

    def _calibrate(self) -> torch.Tensor:
        cal = OnlineAcceptanceCalibrator(NUM_DRAFTS, refit_interval=1, min_observations=256, damping=50.0)
        trace, warmup = self.trace, min(self.args.warmup, self.trace.rounds)
        full = torch.full((self.batch,), trace.num_drafts or NUM_DRAFTS)
        for start in range(0, warmup, CHUNK):
            sl = slice(start, min(start + CHUNK, warmup))
            for feature, accepted in zip(trace.feature[sl], trace.accepted_all[sl]):
                cal.observe(feature, full, accepted)
        return cal.predict(trace.feature)

    def available(self) -> list[str]:
        out = ["ar@baseline"]
        for k, profile in self.profiles.items():
            out += [f"fixed_dflash@{k}", f"vllm_adaptive@{k}", f"hybridspec_host@{k}", f"hybridspec@{k}"]
            rc_ok = profile.per_layer_type is not None and profile.unique_experts is not None
            if k in self.non_moe:  # neutralised tokens are priced from the profile's non-MoE time
                out.append(f"hybridspec_neutralise@{k}")
            if rc_ok and (self.args.probe_cost == "integrated" or self.lat_probe_pass is not None):
                out.append(f"hybridspec_rc@{k}")
        return out

    def run(self, label: str, *, estimator_noise_free: bool = False, threshold: float = 1.0,
            long_run_rate: bool | None = None) -> Outcome:
        policy, kernels = label.split("@")
        args, batch, trace = self.args, self.batch, self.trace
        out = Outcome()
        available = trace.num_drafts or NUM_DRAFTS
        cap = torch.full((batch,), available)
        routing_gen = torch.Generator().manual_seed(self.seed + 7)
        stale_last = torch.ones(batch, NUM_DRAFTS)
        lat, plan = self.lat_time[kernels], self.lat_plan[kernels]
        long_run_rate = self.args.long_run_rate if long_run_rate is None else long_run_rate
        tracker = ThroughputTracker(ema=0.2)
        history = (TransitionHistory(NUM_DRAFTS, args.cut_history)
                   if policy == "hybridspec_neutralise" and args.cut_scenarios > 0 else None)
        cut_gen = torch.Generator().manual_seed(self.seed + 11)
        for start in range(0, trace.rounds, CHUNK):
            sl = slice(start, min(start + CHUNK, trace.rounds))
            accepted_all = trace.accepted_all[sl]
            chunk = accepted_all.shape[0]
            conf = trace.true_conf[sl] if estimator_noise_free else self.estimates[sl]
            counted = start >= args.warmup
            if policy == "ar":
                if counted:
                    out.tokens += chunk * batch
                    out.time_us += chunk * float(self.lat_ar.round_us(batch, 1.0))
                    out.rounds += chunk
                continue
            extra_us = torch.zeros(chunk, dtype=torch.float64)
            if policy == "fixed_dflash":
                n = torch.full((chunk, batch), available)
            elif policy == "vllm_adaptive":
                stale = torch.cat([stale_last.unsqueeze(0), conf[:-1]], dim=0)
                n = vllm_adaptive_lengths(conf, cap.expand(chunk, batch), plan, budget_confidences=stale).long()
            elif policy in ("hybridspec_host", "hybridspec_neutralise"):
                # vllm_hybridspec.adaptive.budget: the host fixes the step's token count from last round, the
                # device gives the budget to the best pairs of the current ranking (an infinite price admits
                # nothing beyond the floor and the forced first draft).
                stale = torch.cat([stale_last.unsqueeze(0), conf[:-1]], dim=0)
                budget = prefix_scan_budget(stale, cap.expand(chunk, batch), plan, min_drafts=1)
                if policy == "hybridspec_neutralise":
                    # the device cut prices a scheduled draft by what verifying it costs beyond neutralising it, at
                    # the host's rate; the scheduler's scenarios assume that same rule
                    host_rate = budget_rate(stale, cap.expand(chunk, batch), plan, budget, min_drafts=1)
                    rule = device_cut_rule(self.cut_saving[kernels], stale, host_rate, min_drafts=1)
                if history is not None and history.size:
                    # vllm_hybridspec.adaptive.budget.CutScheduler: schedule more when the device may use it
                    non_moe, moe_token_us = self.non_moe[kernels]
                    budget = cut_budget(stale, cap.expand(chunk, batch), plan, non_moe, moe_token_us,
                                        history.sample(scenario_count(batch, args.cut_scenarios), (chunk, batch),
                                                       cut_gen), budget, min_drafts=1,
                                        device_rule=rule if args.cut_device_model == "lookahead" else None,
                                        device_price=((self.cut_saving[kernels], host_rate)
                                                      if args.cut_device_model == "priced_prefix" else None))
                n = choose_verify_lengths(conf, cap.expand(chunk, batch), plan, min_drafts=1,
                                          rate_threshold=float("inf"), budget_floor=budget).num_drafts.long()
                if policy == "hybridspec_neutralise":
                    # vllm_hybridspec.adaptive.budget.device_verify_lengths: the lookahead on this round's confidences
                    # picks how many of the scheduled drafts are verified; the rest of the host's tokens
                    # still run (static shapes) but without expert weights.
                    device = rule(conf.unsqueeze(0), cap.expand(1, chunk, batch)).squeeze(0).long()
                    verified_n = torch.minimum(n, device)
                    neutral = (n - verified_n).sum(-1)
                    extra_us = self._neutralised_us(kernels, n, verified_n)
                    if counted:
                        out.neutralised += float(neutral.sum())
                    n = verified_n
            else:
                # Last round's confidences (the previous row of the chunk): information that does not depend on
                # this round's drafts, so the rule may use it (lossless; see length_policy's docstring).
                stale = torch.cat([stale_last.unsqueeze(0), conf[:-1]], dim=0)
                rule = args.length_rule
                decision = choose_verify_lengths(
                    conf, cap.expand(chunk, batch), plan, rate_threshold=tracker.rate if long_run_rate else None,
                    lookahead=rule != "greedy", forecast_confidences=stale if rule != "greedy" else None,
                    budget_floor=(prefix_scan_budget(stale, cap.expand(chunk, batch), plan)
                                  if rule == "lookahead_floor" else None))
                n = decision.num_drafts.long()
            if history is not None:  # the host sees each request's step-to-step change one step later
                previous = torch.cat([stale_last.unsqueeze(0), conf[:-1]], dim=0)[int(start == 0):]
                history.observe(previous.reshape(-1, NUM_DRAFTS), conf[int(start == 0):].reshape(-1, NUM_DRAFTS))
            stale_last = conf[-1]
            verified = n
            if policy == "hybridspec_rc":
                verified, extra_us, probes, kept = self._routing_correction(n, decision, routing_gen, threshold,
                                                                            kernels)
                if counted:
                    out.probes += probes
                    out.probes_kept += kept
            accepted = torch.minimum(accepted_all, verified)
            x = 1.0 + n.sum(-1).double() / batch
            time_us = lat.round_us(batch, x) + extra_us
            tracker.update((accepted + 1).sum(), time_us.sum())
            if counted:
                out.tokens += float((accepted + 1).sum())
                out.time_us += float(time_us.sum())
                out.rounds += chunk
                out.verified_drafts += float(verified.sum())
                out.accepted += float(accepted.sum())
        return out

    def _neutralised_us(self, kernels, scheduled, verified):
        """[chunk] time of the neutralised tokens (scheduled - verified drafts, [chunk, B] each) on top of
        T(B, verified): they still run every non-MoE layer (the profile's non-MoE time at the scheduled length
        minus at the verified one) and, routed at weight 0 to experts the step runs anyway, the MoE kernel's
        per-token compute (the MoE fit's token slope); no expert weights of their own."""
        non_moe, moe_token_us = self.non_moe[kernels]
        batch = self.batch
        x_sched = 1.0 + scheduled.sum(-1).double() / batch
        x_verified = 1.0 + verified.sum(-1).double() / batch
        neutral = (scheduled - verified).sum(-1).double()
        return ((non_moe.verify_us(batch, x_sched) - non_moe.verify_us(batch, x_verified)).clamp(min=0.0)
                + moe_token_us * neutral)

    def _probe_costs(self, kernels) -> ProbeCostModel:
        """The routing correction's cost model (what the wiring builds from the same profile), one per kernels."""
        if kernels not in self._cost_models:
            args = self.args
            self._cost_models[kernels] = ProbeCostModel(
                self.profiles[kernels], num_moe_layers=args.moe_layers, top_k=args.top_k,
                cross_layer_correlation=args.cross_layer_corr, dropped_token_runs=args.probe_cost == "integrated",
                anchor_to_t=args.probe_pricing == "profile")
        return self._cost_models[kernels]

    def _routing_correction(self, n, decision, gen, threshold, kernels):
        """Probe / keep / drop for one chunk; returns (verified drafts, extra time per round, probes, kept).

        Each round's probes are priced at that round's own verified length (`ProbeCostModel.at`), as the wiring
        prices each step: the probe sits where the length policy stopped, where the next token is dear.
        integrated (default): the probe is one more token of the same verify pass; with static shapes a
            dropped probe still runs the non-MoE layers and its MoE rows at weight 0 (ExpertCost.probe_token_us,
            paid by every probe) and only its experts' weights are saved; the decision kernels cost
            --decision-us per round.
        separate: the probe is the profile's own pass (ours_probe - ours: embedding + layer 0 + router on
            L + 1 tokens), paid once per round that probes; a kept probe then costs a whole token.
        """
        args, batch = self.args, self.batch
        x = 1.0 + n.sum(-1).double() / batch
        if args.probe_cost == "integrated":
            pass_us = torch.full_like(x, args.decision_us)
        else:
            with_probe, without = self.lat_probe_pass
            pass_us = (with_probe.verify_us(batch, x) - without.verify_us(batch, x)).clamp(min=0.0)
        model = self._probe_costs(kernels)
        verified, extra_us, probes, kept = [], [], 0.0, 0.0
        for i in range(n.shape[0]):
            v, e, p, k = self._probe_round(n[i], float(x[i]), decision.next_survival[i], decision.marginal_rate[i],
                                           model.at(batch, float(x[i])), float(pass_us[i]), gen, threshold, kernels)
            verified.append(v)
            extra_us.append(e)
            probes += p
            kept += k
        return torch.stack(verified), torch.stack(extra_us), probes, kept

    def _probe_round(self, n, x, next_survival, rate, cost, pass_us, gen, threshold, kernels):
        """One round of `_routing_correction`: n [B] drafts, x its verified tokens per request."""
        args, batch = self.args, self.batch
        worth = probe_worth(next_survival, rate, cost, args.top_k, threshold=threshold, overhead_us=pass_us / batch)
        probing = (n < (self.trace.num_drafts or NUM_DRAFTS)) & worth
        p_new = min(max(cost.mean_new_experts / args.top_k, 0.0), 1.0)
        shape = (batch,)
        n0 = torch.binomial(torch.full(shape, float(args.top_k)), torch.full(shape, p_new), generator=gen)
        copies = torch.binomial(torch.full(shape, float(args.moe_layers - 1)),
                                torch.full(shape, args.cross_layer_corr), generator=gen)
        independent = torch.binomial(args.top_k * (args.moe_layers - 1 - copies), torch.full(shape, p_new),
                                     generator=gen)
        total_new = n0 * (1 + copies) + independent

        value_us = next_survival / rate
        keep = probing & (value_us > threshold * cost.probe_cost_us(n0))
        fixed_us = float(probing.any()) * pass_us
        probe_us = float((probing * cost.probe_token_us).sum())
        if args.probe_pricing == "expert_fit":
            kept_us = float((keep * (cost.keep_token_us + cost.per_expert_layer_us * total_new)).sum())
        else:
            # A kept probe is one more verified token: it costs what T charges for one at this round's shape (the
            # same truth as a verified draft), shifted by how far its new experts are from the average token's -
            # the part of the cost the keep rule selects on. Pricing it from the MoE fit alone made kept probes
            # several times cheaper than drafts where T is extrapolated (c16, c64): a gain of pricing, not routing.
            lat = self.lat_time[kernels]
            num_kept = float(keep.sum())
            extra_t = float(lat.verify_us(batch, x + num_kept / batch) - lat.verify_us(batch, x))
            mean_new = cost.mean_new_experts * args.moe_layers
            shift = float((keep * cost.per_expert_layer_us * (total_new - mean_new)).sum())
            kept_us = max(extra_t * float(lat.correction()) - num_kept * cost.probe_token_us + shift, 0.0)
        extra = torch.tensor(fixed_us + probe_us + kept_us, dtype=torch.float64)
        return n + keep.long(), extra, float(probing.sum()), float(keep.sum())


def _cut_saving(profile, moe_token_us):
    """`cut_saving_profile`, with the same batch extrapolation as the profile itself."""
    if isinstance(profile, PerRequestBeyondMeasured):
        return PerRequestBeyondMeasured(_cut_saving(profile._profile, moe_token_us))
    return cut_saving_profile(profile, moe_token_us)


def _without_moe(profile):
    """The profile's time without its MoE layers (same batch extrapolation as the profile itself)."""
    if isinstance(profile, PerRequestBeyondMeasured):
        return PerRequestBeyondMeasured(_without_moe(profile._profile))
    table = [[t - m for t, m in zip(t_row, m_row)] for t_row, m_row in zip(profile.t_us, profile.per_layer_type["moe"])]
    return dataclasses.replace(profile, t_us=table, per_layer_type=None, unique_experts=None)


def batch_points(batch_sizes: list[int]) -> dict[str, str]:
    """How the profile prices each simulated concurrency: a measured batch, interpolated between two, or
    extrapolated linearly from the two outermost (LatencyProfile.interpolate)."""
    out = {}
    for c in CONCURRENCY:
        if c in batch_sizes:
            out[f"c{c}"] = "measured"
        elif len(batch_sizes) > 1 and batch_sizes[0] < c < batch_sizes[-1]:
            lo = max(b for b in batch_sizes if b < c)
            hi = min(b for b in batch_sizes if b > c)
            out[f"c{c}"] = f"interpolated between batch {lo} and {hi}"
        else:
            ends = batch_sizes[-2:] if c > batch_sizes[-1] else batch_sizes[:2]
            out[f"c{c}"] = f"EXTRAPOLATED linearly from batch {' and '.join(map(str, ends))}"
    return out


def _seed(task: str, c: int) -> int:
    return zlib.crc32(f"{task}/{c}".encode()) % 100_000


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def build_traces(args) -> dict[str, dict[int, am.Trace]]:
    traces = {}
    models = am.fit_task_models(NUM_DRAFTS)
    tasks = [t for t in am.TASKS if t in args.tasks]
    for ti, task in enumerate(tasks):
        traces[task] = {}
        for c in CONCURRENCY:
            rounds = args.warmup + max(1, int(args.rounds_scale * max(1500, 12000 // c)))
            g = torch.Generator().manual_seed(1000 * ti + c)
            traces[task][c] = am.draw_trace(models[task], rounds, c, NUM_DRAFTS, persistence=args.persistence,
                                            feature_noise=args.feature_noise, generator=g)
    if args.traces:
        rows = am.load_recorded_traces(args.traces, NUM_DRAFTS)
        rounds = args.warmup + max(1, int(args.rounds_scale * 1500))
        for drafter in dict.fromkeys(row["drafter"] for row in rows):
            mine = [row for row in rows if row["drafter"] == drafter]
            task = "recorded" if drafter == "recorded" else f"recorded_{drafter}"
            traces[task] = {c: am.trace_from_recorded(mine, rounds, c, NUM_DRAFTS) for c in CONCURRENCY}
    return traces, models


def run_all(args, profiles, drafter):
    traces, models = build_traces(args)
    points = batch_points(next(iter(profiles.values())).batch_sizes)
    rows, tputs = [], {}
    for task, by_c in traces.items():
        for c, trace in by_c.items():
            cell = Cell(trace, c, profiles, drafter, args, seed=_seed(task, c))
            results = {label: cell.run(label) for label in cell.available()}
            for label, outcome in results.items():
                tputs[(task, c, label)] = 1e6 * outcome.tokens / outcome.time_us
            for label, outcome in results.items():
                policy, kernels = label.split("@")
                row = {"task": task, "concurrency": c, "policy": policy, "kernels": kernels,
                       "profile_batch": points[f"c{c}"], **outcome.row(c)}
                row["vs_ar"] = round(tputs[(task, c, label)] / tputs[(task, c, "ar@baseline")], 3)
                row["vs_fixed_dflash"] = round(tputs[(task, c, label)] / tputs[(task, c, "fixed_dflash@baseline")], 3)
                rows.append(row)
            print(f"{task:10s} c={c:<3d} " + " ".join(f"{p}={tputs[(task, c, p)]:.0f}" for p in results), flush=True)
    return rows, tputs, traces, models


def system_choice(tputs, tasks, labels, policies=None) -> tuple[str, str]:
    """(policy, kernels) of the HybridSpec system: among `policies` (default: the WIRED ones, what the vLLM
    plugin runs), the one and the kernels (GDN verify variant, a config choice) with the highest c1 throughput."""
    policies = WIRED if policies is None else policies
    candidates = [label for label in labels if label.split("@")[0] in policies]
    if not candidates:
        raise ValueError(f"none of the policies {policies} was simulated")
    best = max(candidates, key=lambda label: geomean([tputs[(t, 1, label)] for t in tasks]))
    return tuple(best.split("@"))


def summarize(tputs, tasks, labels):
    policy, kernels = system_choice(tputs, tasks, labels)
    best, fixed_same = f"{policy}@{kernels}", f"fixed_dflash@{kernels}"
    ratio = lambda a, b, c: geomean([tputs[(t, c, a)] / tputs[(t, c, b)] for t in tasks])
    unwired = "hybridspec_rc" if any(label.startswith("hybridspec_rc@") for label in labels) else "hybridspec"
    device_policy, device_kernels = system_choice(tputs, tasks, labels, policies=(unwired,))
    device_best = f"{device_policy}@{device_kernels}"
    rc, plain = f"hybridspec_rc@{device_kernels}", f"hybridspec@{device_kernels}"
    summary = {
        # The headline: what users get from the plugin in vLLM (a WIRED policy).
        "hybridspec_system": best,
        "hybridspec_system_wired": True,
        "speedup_vs_ar_c1": round(ratio(best, "ar@baseline", 1), 3),
        "speedup_vs_fixed_c1": round(ratio(best, "fixed_dflash@baseline", 1), 3),
        "min_ratio_vs_fixed_c4_to_c64": round(min(ratio(best, "fixed_dflash@baseline", c)
                                                  for c in CONCURRENCY[1:]), 3),
        # The same comparisons with every policy on the system's kernels: what the length policy alone adds.
        "speedup_vs_fixed_same_kernels_c1": round(ratio(best, fixed_same, 1), 3),
        "min_ratio_vs_fixed_same_kernels_c4_to_c64": round(min(ratio(best, fixed_same, c)
                                                               for c in CONCURRENCY[1:]), 3),
        "vllm_adaptive_vs_fixed_same_kernels": {f"c{c}": round(ratio(f"vllm_adaptive@{kernels}", fixed_same, c), 3)
                                                for c in CONCURRENCY},
        "hybridspec_host_vs_fixed_same_kernels": {f"c{c}": round(ratio(f"hybridspec_host@{kernels}", fixed_same, c), 3)
                                                  for c in CONCURRENCY},
        "hybridspec_vs_vllm_adaptive": {f"c{c}": round(ratio(best, f"vllm_adaptive@{kernels}", c), 3)
                                        for c in CONCURRENCY},
        # NOT WIRED: the length policy deciding the step's token count on the device from this round's
        # confidences (+ routing correction on top of it). vLLM fixes the count on the host before the forward.
        "device_decided_policy": device_best,
        "device_decided_wired": False,
        "device_decided_speedup_vs_fixed_c1": round(ratio(device_best, "fixed_dflash@baseline", 1), 3),
        "device_decided_min_ratio_vs_fixed_c4_to_c64": round(min(ratio(device_best, "fixed_dflash@baseline", c)
                                                                 for c in CONCURRENCY[1:]), 3),
        "device_decided_vs_system": {f"c{c}": round(ratio(device_best, best, c), 3) for c in CONCURRENCY},
        # Routing correction as simulated: on the device-decided policy (hybridspec_rc vs hybridspec, NOT WIRED;
        # the wiring plans its probes from the host budget instead).
        "gain_from_routing_correction_c1": round(ratio(rc, plain, 1), 3) if rc in labels else None,
        "gain_from_routing_correction": ({f"c{c}": round(ratio(rc, plain, c), 3) for c in CONCURRENCY}
                                         if rc in labels else None),
        "aggregation": f"geometric mean over tasks {list(tasks)}",
    }
    neutralise = f"{WIRED_OPT_IN[0]}@{kernels}"
    if neutralise in labels:
        summary["hybridspec_neutralise_vs_host_same_kernels"] = {
            f"c{c}": round(ratio(neutralise, f"hybridspec_host@{kernels}", c), 3) for c in CONCURRENCY}
        # WIRED behind hybridspec.device_verify_length (off by default): the headline comparisons with it on
        summary["device_cut_policy"] = neutralise
        summary["device_cut_speedup_vs_ar_c1"] = round(ratio(neutralise, "ar@baseline", 1), 3)
        summary["device_cut_speedup_vs_fixed_c1"] = round(ratio(neutralise, "fixed_dflash@baseline", 1), 3)
        summary["device_cut_min_ratio_vs_fixed_c4_to_c64"] = round(min(ratio(neutralise, "fixed_dflash@baseline", c)
                                                                       for c in CONCURRENCY[1:]), 3)
    if "fixed_dflash@ours" in labels:
        summary["ours_kernels_vs_baseline_fixed_dflash"] = {
            f"c{c}": round(ratio("fixed_dflash@ours", "fixed_dflash@baseline", c), 3) for c in CONCURRENCY}
    return summary


def profiles_by_rho(profile_path: Path) -> dict[str, dict[str, LatencyProfile]]:
    """The profile at the other routing correlations, from the bench result file beside the profile."""
    result = Path(profile_path).parent / "verify_profile.json"
    if not result.is_file():
        return {}
    doc = json.loads(result.read_text())
    return {rho: {p["variant"]: LatencyProfile.from_dict(p) for p in plist}
            for rho, plist in doc.get("profiles_by_rho", {}).items()}


class PerRequestBeyondMeasured:
    """A profile whose batches beyond the largest measured one cost that batch's time per request
    (T(B, L) = T(B_max, L) * B / B_max: no further batching gain), instead of the linear extrapolation from the
    two largest measured batches, which multiplies their difference - and any kink in it - by
    (B - B_max) / (B_max - B_prev). Everything else is the wrapped profile's."""

    def __init__(self, profile: LatencyProfile):
        self._profile = profile
        self._largest = profile.batch_sizes[-1]

    def interpolate(self, batch: float, L: float) -> float:
        scale = max(1.0, batch / self._largest)
        return self._profile.interpolate(min(batch, self._largest), L) * scale

    def __getattr__(self, name):
        return getattr(self._profile, name)


def sensitivity(args, profiles, drafter, tasks, system, device_label):
    """c1, c16 and c64 ratios of the HybridSpec system (and of the device-decided policy, not wired; and at c1 of the
    device cut, wired behind a key that is off by default) under other assumptions (smaller traces)."""
    out = []
    base_args = vars(args).copy()
    by_rho = profiles_by_rho(args.profile)
    variants = [("routing_rho", rho) for rho in sorted(by_rho)]
    variants += [("feature_noise", 0.0), ("feature_noise", 2.0), ("persistence", 0.0), ("persistence", 0.9),
                ("cross_layer_corr", 0.0), ("cross_layer_corr", 1.0), ("probe_cost", "separate"),
                ("probe_pricing", "expert_fit"),
                ("long_run_rate", 1), ("convexify", 1), ("length_rule", "greedy"),
                ("length_rule", "lookahead_floor"), ("drafter_scale", 0.5),
                ("drafter_scale", 2.0), ("batch_extrapolation", "per_request")]
    for key, value in variants:
        a = argparse.Namespace(**{**base_args, "rounds_scale": args.rounds_scale * 0.5,
                                  **({} if key == "routing_rho" else {key: value})})
        cell_profiles = by_rho[value] if key == "routing_rho" else profiles
        if key == "batch_extrapolation":
            cell_profiles = {name: PerRequestBeyondMeasured(p) for name, p in profiles.items()}
        d = DrafterCost(launch_us=drafter.launch_us * a.drafter_scale,
                        hbm_bytes_per_us=drafter.hbm_bytes_per_us / a.drafter_scale,
                        flops_per_us=drafter.flops_per_us / a.drafter_scale)
        traces, _ = build_traces(argparse.Namespace(**{**vars(a), "traces": None}))
        entry = {"assumption": key, "value": value}
        for c in (1, 16, 64):
            t = {}
            for task in tasks:
                cell = Cell(traces[task][c], c, cell_profiles, d, a, seed=_seed(task, c))
                labels = cell.available()
                cut_label = f"{WIRED_OPT_IN[0]}@{system.split('@')[1]}"
                wanted = {"ar@baseline", "fixed_dflash@baseline", system, device_label,
                          f"hybridspec@{device_label.split('@')[1]}"}
                if c == 1:  # where the device cut matters (and it is the slowest policy to simulate)
                    wanted.add(cut_label)
                for label in wanted & set(labels):
                    outcome = cell.run(label)
                    t[(task, label)] = outcome.tokens / outcome.time_us
            tp = lambda task, label: t[(task, label)]
            entry[f"vs_ar_c{c}"] = round(geomean([tp(x, system) / tp(x, "ar@baseline") for x in tasks]), 3)
            entry[f"vs_fixed_c{c}"] = round(geomean([tp(x, system) / tp(x, "fixed_dflash@baseline") for x in tasks]), 3)
            entry[f"device_decided_vs_fixed_c{c}"] = round(geomean([tp(x, device_label) / tp(x, "fixed_dflash@baseline")
                                                                    for x in tasks]), 3)
            if all((x, cut_label) in t for x in tasks):
                entry[f"device_cut_vs_system_c{c}"] = round(geomean([tp(x, cut_label) / tp(x, system)
                                                                     for x in tasks]), 3)
            if device_label.startswith("hybridspec_rc"):
                plain = f"hybridspec@{device_label.split('@')[1]}"
                entry[f"rc_gain_c{c}"] = round(geomean([tp(x, device_label) / tp(x, plain) for x in tasks]), 3)
        print("sensitivity", entry, flush=True)
        out.append(entry)
    return out


def markdown(summary, rows, assumptions, device, profile_path):
    lines = [f"# simulate (SIMULATED tokens/s from the latency profile measured on {device})", "",
             f"Profile: `{profile_path}`. Acceptance: models fitted to published DFlash acceptance lengths "
             "(eval/acceptance_models.py); see eval/notes/simulate.md. `name@kernels`: kernels = the profile "
             "variant (GDN verify path) that prices the verify pass. The headline (`hybridspec_system` and the "
             "keys without a prefix) is a policy the vLLM wiring runs (`hybridspec_system_wired`). "
             "`hybridspec_host` = the wiring's host budget: the step's token count from last round's confidences, "
             "split on the device by the current ranking; `hybridspec_neutralise` = that, the host scheduling "
             "more than its budget where scenarios of this round price the option, plus the lookahead on "
             "this round's confidences picking on the device how many of the scheduled drafts are verified, the "
             "rest neutralised (run without expert weights, never accepted; they still cost their non-MoE time and "
             "MoE rows; keys `device_cut_*`); `hybridspec` / "
             "`hybridspec_rc` = the length policy deciding the step's token count on the device (NOT WIRED: vLLM "
             "fixes it on the host; keys `device_decided_*`); `recorded_*` = replayed tiny-model traces (K = 4, "
             "eval/record_tiny_traces.py). Headline candidates (what the default wiring runs): " + ", ".join(WIRED)
             + "; `hybridspec_neutralise` is wired too, behind `hybridspec.device_verify_length` (off by default).",
             "",
             "| summary | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary.items()]
    lines += ["", f"Profile batches measured: {assumptions['profile_batch_sizes']}. How each concurrency is priced: "
              + "; ".join(f"{c}: {how}" for c, how in assumptions["batch_points"].items()) + "."]
    labels = _labels(rows)
    for task in dict.fromkeys(r["task"] for r in rows):
        lines += ["", f"## {task}: tokens/s (ratio vs fixed_dflash@baseline; mean verified drafts)", "",
                  "| c | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        for c in CONCURRENCY:
            cells = []
            for label in labels:
                policy, kernels = label.split("@")
                r = next((r for r in rows if r["task"] == task and r["concurrency"] == c and r["policy"] == policy
                          and r["kernels"] == kernels), None)
                cells.append(f"{r['tokens_per_s']:.0f} ({r['vs_fixed_dflash']:.2f}; {r['mean_verified_drafts']:.1f})"
                             if r else "")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "Assumptions: " + json.dumps({k: v for k, v in assumptions.items() if k != "published"})]
    return "\n".join(lines) + "\n"


def plot(rows, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    labels = _labels(rows)
    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 8), squeeze=False)
    for j, task in enumerate(tasks):
        for label in labels:
            policy, kernels = label.split("@")
            pts = [(r["concurrency"], r["tokens_per_s"], r["vs_fixed_dflash"]) for r in rows
                   if r["task"] == task and r["policy"] == policy and r["kernels"] == kernels]
            if not pts:
                continue
            cs, tps, ratios = zip(*pts)
            style = "-" if kernels == "baseline" else "--"
            axes[0][j].plot(cs, tps, style, marker="o", label=label)
            axes[1][j].plot(cs, ratios, style, marker="o", label=label)
        axes[0][j].set_title(f"{task}: tokens/s (simulated)")
        axes[1][j].set_title(f"{task}: ratio vs fixed_dflash@baseline")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        axes[1][j].axhline(1.0, color="k", lw=0.8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Simulated from the verify-latency profile measured on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--out", type=Path, default=EVAL / "results")
    ap.add_argument("--tasks", nargs="+", default=list(am.TASKS))
    ap.add_argument("--traces", type=Path, default=None, help="recorded rounds (JSONL), replayed as task 'recorded'")
    ap.add_argument("--rounds-scale", type=float, default=1.0, help="scale the number of measured rounds")
    ap.add_argument("--warmup", type=int, default=400, help="rounds not counted (calibrator warm-up)")
    ap.add_argument("--feature-noise", type=float, default=1.0,
                    help="std of the raw acceptance score around the true log-odds")
    ap.add_argument("--persistence", type=float, default=0.5, help="P(a request keeps last round's difficulty)")
    ap.add_argument("--cross-layer-corr", type=float, default=0.5,
                    help="P(an MoE layer's new-expert count equals layer 0's) for probe tokens")
    ap.add_argument("--probe-cost", choices=("integrated", "separate"), default="integrated",
                    help="how the routing-correction probe is priced (see Cell._routing_correction)")
    ap.add_argument("--probe-pricing", choices=("profile", "expert_fit"), default="profile",
                    help="a kept probe costs T's marginal token +- its new experts vs the average (profile), or "
                         "only the MoE fit's token + expert cost (expert_fit, the first session's model)")
    ap.add_argument("--decision-us", type=float, default=5.0,
                    help="routing-correction decision kernels per probing round (integrated probe)")
    ap.add_argument("--drafter-scale", type=float, default=1.0, help="multiply the drafter time model")
    ap.add_argument("--long-run-rate", type=int, choices=(0, 1), default=0,
                    help="price tokens at the long-run achieved rate (1) or each round's own rate (0)")
    ap.add_argument("--convexify", type=int, choices=(0, 1), default=0,
                    help="policies see the lower convex hull of T(L) (VerifyLatencyModel(convexify=True))")
    ap.add_argument("--length-rule", choices=("lookahead", "greedy", "lookahead_floor"), default="lookahead",
                    help="hybridspec's admission test: lookahead (a later stop, later pairs forecast from last "
                         "round, beats stopping now), greedy (the next pair alone raises the rate), "
                         "lookahead_floor (+ at least the best prefix of last round's ranking)")
    ap.add_argument("--cut-scenarios", type=int, default=256,
                    help="hybridspec_neutralise: scenario-requests (scenarios x batch, policy.scenario_count) of "
                         "this round's survivals that price scheduling drafts beyond the host budget for the "
                         "device to cut (0: schedule the host budget only)")
    ap.add_argument("--cut-history", type=int, default=512, help="step-to-step changes the scenarios draw from")
    ap.add_argument("--cut-device-model", choices=("priced_prefix", "lookahead", "best_prefix"),
                    default="priced_prefix",
                    help="what the scenarios assume the device verifies: the prefix its pricing prefers (the "
                         "wiring's choice), its own rule (device_cut_rule, slow), or the prefix with the best T rate")
    ap.add_argument("--moe-layers", type=int, default=40)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    command = "python eval/simulate.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command.strip()}", flush=True)
    if not args.profile.is_file():
        raise SystemExit(f"latency profile not found: {args.profile} (run eval/bench_verify_profile.py first)")
    profiles = load_variants(args.profile)
    drafter = DrafterCost()
    drafter = DrafterCost(launch_us=drafter.launch_us * args.drafter_scale,
                          hbm_bytes_per_us=drafter.hbm_bytes_per_us / args.drafter_scale,
                          flops_per_us=drafter.flops_per_us / args.drafter_scale)
    device = next(iter(profiles.values())).device
    rows, tputs, traces, models = run_all(args, profiles, drafter)
    tasks = [t for t in traces if not t.startswith("recorded")]
    labels = {label for (_, _, label) in tputs}
    summary = summarize(tputs, tasks, labels)
    summary["extrapolated_concurrency"] = [c for c, how in batch_points(
        next(iter(profiles.values())).batch_sizes).items() if how.startswith("EXTRAPOLATED")]
    system = summary["hybridspec_system"]
    for task in traces:
        if task.startswith("recorded"):
            summary[f"{task}_vs_fixed"] = {f"c{c}": round(tputs[(task, c, system)]
                                                          / tputs[(task, c, "fixed_dflash@baseline")], 3)
                                           for c in CONCURRENCY}
    bench = Path(args.profile).parent / "verify_profile.json"
    bench_doc = json.loads(bench.read_text()) if bench.is_file() else {}
    assumptions = {
        "profile": str(args.profile.relative_to(EVAL.parent) if args.profile.is_relative_to(EVAL.parent)
                       else args.profile), "profile_variants": sorted(profiles),
        "profile_sha256": hashlib.sha256(Path(args.profile).read_bytes()).hexdigest()[:16],
        "profile_measured": {k: bench_doc.get(k) for k in ("commit", "date", "command")},
        "profile_summary": bench_doc.get("summary"),
        "profile_batch_sizes": next(iter(profiles.values())).batch_sizes,
        "batch_points": batch_points(next(iter(profiles.values())).batch_sizes),
        "num_drafts": NUM_DRAFTS, "drafter": asdict(drafter),
        "drafter_us": {f"c{c}": round(drafter.time_us(c), 1) for c in CONCURRENCY},
        "feature_noise": args.feature_noise, "persistence": args.persistence,
        "cross_layer_corr": args.cross_layer_corr, "probe_cost": args.probe_cost,
        "probe_pricing": args.probe_pricing,
        "decision_us": args.decision_us, "long_run_rate": bool(args.long_run_rate),
        "convexify": bool(args.convexify), "length_rule": args.length_rule,
        "moe_layers": args.moe_layers, "top_k": args.top_k,
        "warmup_rounds": args.warmup, "rounds_scale": args.rounds_scale,
        "acceptance_models": {t: asdict(m) | {"tau_15": round(m.tau(NUM_DRAFTS), 3)} for t, m in models.items()},
        "published": am.PUBLISHED,
        "packed_lengths": True,
    }
    extra = {"assumptions": assumptions}
    if not args.no_sensitivity:
        extra["sensitivity"] = sensitivity(args, profiles, drafter, tasks, system,
                                           summary["device_decided_policy"])
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(BENCH, rows, summary, command.strip(), device, out_dir=args.out, extra=extra,
                  markdown=markdown(summary, rows, assumptions, device, assumptions["profile"]))
    if not args.no_plot:
        plot(rows, args.out / f"{BENCH}.png", device)
    print(json.dumps(summary, indent=1))
    print(f"done in {time.time() - started:.0f} s: {command.strip()}")
    return summary


if __name__ == "__main__":
    main()
