"""How far can a length policy move issue 6's speedup_vs_fixed_c1? An upper bound on simulate.py's own inputs.

Rebuilds exactly the traces, latency tables and drafter cost that produced eval/results/simulate.json (its recorded
command and assumptions; the profile's sha256 is checked, and the re-run fixed-K and wired-policy throughputs must
equal the committed rows) and replays them with a CLAIRVOYANT length oracle that knows, before verifying, how many
drafts each request will have accepted (A_b):
- `oracle`: every request verifies exactly its accepted drafts: the A_b + 1 tokens fixed K = 15 also emits, for
  drafter + T(B, 1 + sum A_b / B) instead of drafter + T(B, 16);
- `oracle_best_count`: the best drafts count N per round given the A_b (maximises the ratio of sums over all
  rounds, Dinkelbach); a round then emits min(N, sum A_b) + B tokens. No policy of any kind, lossless or not,
  beats it on these traces: every simulated policy's round emits at most that for the same T;
- `oracle_rc` (concurrency 1): the routing correction's best case as simulate.py prices it. Beyond the oracle's
  length a probe is a known rejected draft (nothing to keep), so the only room is to verify the last accepted
  draft AS the probe: simulate charges a kept probe T's next token shifted by how far its new experts are from
  the average token's. The oracle probes a round only when the drawn experts make that cheaper.
A clairvoyant oracle is not lossless. The tight bound for LOSSLESS policies is `lossless_optimum`: the best count
per round chosen on the true conditional acceptance probabilities (in simulate's acceptance model no lossless
policy can know more; see lossless_optimum_outcome). Beside them, simulate's own policies: the wired one
(`hybridspec_host`), the device-decided one (`hybridspec`) and both told the true probabilities
(`*_exact_estimates`, simulate's estimator_noise_free). Every tokens/s is simulated.

Kernel / policy split (as eval/notes/simulate.md): speedup over fixed K = 15 on vLLM's kernels = [policy on our
kernels / fixed K = 15 on our kernels] x [fixed K = 15 on ours / on vLLM's]. `gdn_free` kernels: our profile with
every GDN layer's time removed (eval/verify_profile_bounds.py's idealisation), for the kernel part's own ceiling.
`gdn_verify_free` kernels: our profile less only the plugin's own GDN kernels (gdn_verify + reconstruction, as
measured per layer in eval/results/gdn_verify.json, times the model's GDN layers); the projections, norms and
gating GEMMs around them are the target's vLLM layers and stay: the most any better GDN kernel of ours could give.

    PYTHONSAFEPATH=1 .venv/bin/python eval/simulate_bounds.py
writes eval/results/simulate_bounds.{json,md}.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

EVAL = Path(__file__).resolve().parent
REPO = EVAL.parent
sys.path.insert(0, str(EVAL))

import torch  # noqa: E402

import simulate as sim  # noqa: E402
from _results import _markdown, write_results  # noqa: E402
from verify_model.shapes import SHAPES  # noqa: E402

BENCH = "simulate_bounds"
GOAL_SPEEDUP_VS_FIXED_C1 = 1.4
WIRED = f"{sim.WIRED[0]}@ours"
BASELINE_FIXED = "fixed_dflash@baseline"
ORACLES = ("oracle", "oracle_best_count", "oracle_rc")
# simulate's policies replayed beside the oracle (label, exact estimates?)
REFERENCE_POLICIES = (("fixed_dflash", False), (sim.WIRED[0], False), ("hybridspec", False),
                      (sim.WIRED[0], True), ("hybridspec", True))


def counted_rounds(rounds: int, warmup: int) -> torch.Tensor:
    """[R] bool: the rounds simulate.Cell.run counts (whole chunks of simulate.CHUNK starting after the warm-up)."""
    return (torch.arange(rounds) // sim.CHUNK) * sim.CHUNK >= warmup


def round_times_by_count(cell: sim.Cell, kernels: str) -> torch.Tensor:
    """[B * K + 1] drafter + T(B, 1 + N / B) for N = 0 .. B * K verified drafts in the round, as Cell.run charges."""
    available = cell.trace.num_drafts or sim.NUM_DRAFTS
    counts = torch.arange(cell.batch * available + 1, dtype=torch.float64)
    return cell.lat_time[kernels].round_us(cell.batch, 1.0 + counts / cell.batch)


def best_counts(tokens: torch.Tensor, round_us: torch.Tensor) -> torch.Tensor:
    """[R] the drafts count per round that maximises sum_r tokens[r, N_r] / sum_r round_us[N_r].

    tokens: [R, N + 1] what round r emits (or is expected to) when it verifies 0..N drafts; round_us: [N + 1].
    Dinkelbach's iteration: each step takes every round's exact argmax of tokens - rate x time at the current
    rate; the rate only rises, and stops rising at the optimum of the ratio of sums.
    """
    rate = float(tokens[:, -1].sum() / (round_us[-1] * tokens.shape[0]))
    chosen = torch.full((tokens.shape[0],), tokens.shape[1] - 1)
    for _ in range(100):
        candidate = (tokens - rate * round_us.unsqueeze(0)).argmax(-1)
        better = float(tokens.gather(1, candidate.unsqueeze(1)).sum() / round_us[candidate].sum())
        if better <= rate * (1 + 1e-12):
            break
        chosen, rate = candidate, better
    return chosen


def oracle_outcome(cell: sim.Cell, kernels: str, *, best_count: bool = False) -> sim.Outcome:
    """Counted rounds of `cell`'s trace under the clairvoyant oracle on `kernels` (see the module docstring):
    each round verifies its accepted total A (best_count False) or the count `best_counts` picks knowing A."""
    counted = counted_rounds(cell.trace.rounds, cell.args.warmup)
    accepted = cell.trace.accepted_all[counted].clamp(max=cell.trace.num_drafts or sim.NUM_DRAFTS).sum(-1)
    round_us = round_times_by_count(cell, kernels)
    if best_count:
        counts = torch.arange(round_us.shape[0])
        n = best_counts(torch.minimum(counts.unsqueeze(0), accepted.unsqueeze(1)).double() + cell.batch, round_us)
    else:
        n = accepted
    emitted = torch.minimum(n, accepted)
    return sim.Outcome(tokens=float((emitted + cell.batch).sum()), time_us=float(round_us[n].sum()),
                       rounds=int(counted.sum()), verified_drafts=float(n.sum()), accepted=float(emitted.sum()))


def accepted_by_count(survival: torch.Tensor, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected and realized accepted drafts [R, B * K + 1] of a round that verifies N = 0 .. B * K drafts, the N
    of highest survival (the allocation that maximises the expected ones).

    survival: [R, B, K] P(draft k of request b accepted), non-increasing in k; accepted: [R, B] drafts accepted.
    """
    rounds, batch, drafts = survival.shape
    flat = survival.reshape(rounds, batch * drafts)
    hit = (torch.arange(1, drafts + 1) <= accepted.unsqueeze(-1)).reshape(rounds, batch * drafts).double()
    # stable: equal survivals keep each request's draft order, so every top-N set stays a prefix per request
    order = torch.sort(flat, dim=1, descending=True, stable=True).indices
    zero = torch.zeros(rounds, 1, dtype=torch.float64)
    return (torch.cat([zero, flat.gather(1, order).cumsum(1)], 1),
            torch.cat([zero, hit.gather(1, order).cumsum(1)], 1))


def lossless_optimum_outcome(cell: sim.Cell, kernels: str) -> sim.Outcome:
    """Counted rounds under the best LOSSLESS length choice told the true conditional acceptance probabilities.

    In simulate's acceptance model a round's outcomes, given its true conditional probabilities c [B, K], are
    independent of everything a lossless policy may read (the estimator's features are c plus noise; the drafts
    themselves it may not read), so no lossless policy knows more. For a total of N verified drafts the expected
    tokens are largest when the N drafts of highest survival prod_{j<=k} c_j are verified (survival falls along
    each request's drafts, so these are prefixes); `best_counts` picks N per round on the EXPECTED tokens and the
    round is charged with its REALIZED ones (the optimum in expectation, replayed on the same outcomes).
    """
    counted = counted_rounds(cell.trace.rounds, cell.args.warmup)
    available = cell.trace.num_drafts or sim.NUM_DRAFTS
    survival = torch.cumprod(cell.trace.true_conf[counted][..., :available].double(), -1)
    expected, realized = accepted_by_count(survival, cell.trace.accepted_all[counted].clamp(max=available))
    round_us = round_times_by_count(cell, kernels)
    n = best_counts(expected + cell.batch, round_us)
    tokens = realized.gather(1, n.unsqueeze(1)).squeeze(1) + cell.batch
    return sim.Outcome(tokens=float(tokens.sum()), time_us=float(round_us[n].sum()), rounds=int(counted.sum()),
                       verified_drafts=float(n.sum()), accepted=float((tokens - cell.batch).sum()))


def oracle_with_routing_correction(cell: sim.Cell, kernels: str) -> sim.Outcome:
    """Concurrency 1: the oracle, with the last accepted draft verified as simulate's routing-correction probe
    wherever its drawn experts make it cheaper than a plain token (Cell._routing_correction prices both)."""
    if cell.batch != 1:
        raise ValueError("the routing-correction best case is a per-request choice: concurrency 1 only")
    counted = counted_rounds(cell.trace.rounds, cell.args.warmup)
    accepted = cell.trace.accepted_all[counted].clamp(max=cell.trace.num_drafts or sim.NUM_DRAFTS)  # [R, 1]
    plain_us = round_times_by_count(cell, kernels)[accepted.squeeze(1)]
    before_probe = (accepted - 1).clamp(min=0)
    # A survival of 1 at a vanishing token price: probe_worth and the keep rule admit every probe there is.
    certain = SimpleNamespace(next_survival=(accepted >= 1).double(),
                              marginal_rate=torch.full((accepted.shape[0],), 1e-12, dtype=torch.float64))
    gen = torch.Generator().manual_seed(cell.seed + 7)
    verified, extra_us, _, _ = cell._routing_correction(before_probe, certain, gen, 1.0, kernels)
    if not torch.equal(torch.where(accepted >= 1, verified, accepted), accepted):
        raise AssertionError("the forced probe did not land on the last accepted draft")
    probed_us = cell.lat_time[kernels].round_us(1, 1.0 + before_probe.squeeze(1).double()) + extra_us
    time_us = torch.where(accepted.squeeze(1) >= 1, torch.minimum(plain_us, probed_us), plain_us)
    return sim.Outcome(tokens=float((accepted + 1).sum()), time_us=float(time_us.sum()), rounds=int(counted.sum()),
                       verified_drafts=float(accepted.sum()), accepted=float(accepted.sum()),
                       probes=float((probed_us < plain_us).sum()), probes_kept=float((probed_us < plain_us).sum()))


def _profile_less(profile, removed, suffix: str):
    """`profile` with `removed` ([batch][length] us) taken off every T(batch, L); its per-layer breakdown no longer
    applies, so it is dropped."""
    table = [[t - r for t, r in zip(t_row, r_row)] for t_row, r_row in zip(profile.t_us, removed)]
    return dataclasses.replace(profile, variant=f"{profile.variant}_{suffix}", t_us=table, per_layer_type=None,
                               unique_experts=None)


def without_gdn(profile):
    """`profile` with every GDN layer's time removed (projections, norms and gates included)."""
    return _profile_less(profile, profile.per_layer_type["gdn"], "gdn_free")


def gdn_kernel_us_per_layer(gdn_verify_doc: dict, batch: int, length: float) -> float:
    """Our GDN verify + reconstruction time of ONE layer (us) at `batch` requests x `length` tokens each.

    Per measured (L, B) row the larger of the combined launch pair (`ours_us_all`) and the sum of its separately
    timed verify and reconstruction, so the saving stays an upper bound. Linear in L between measured lengths;
    below the first measured L its time (the kernels get no cheaper with fewer tokens in the data, so this
    overstates the saving: still a bound); above the last, linear extrapolation from the last two. The batch
    must be one that gdn_verify.json measured.
    """
    by_len = sorted((r["L"], max(r["ours_us_all"], r["ours_verify_us"] + r["ours_reconstruct_us"]))
                    for r in gdn_verify_doc["rows"] if r["B"] == batch)
    if not by_len:
        raise SystemExit(f"gdn_verify.json has no rows at batch {batch}")
    if len(by_len) == 1 or length <= by_len[0][0]:
        return float(by_len[0][1])
    upper = next((i for i, (measured, _) in enumerate(by_len) if measured >= length), len(by_len) - 1)
    (l0, t0), (l1, t1) = by_len[upper - 1], by_len[upper]
    return float(t0 + (t1 - t0) * (length - l0) / (l1 - l0))


def gdn_layer_count(profile) -> int:
    """GDN layers of the profiled target: its shape's layer pattern over the profile's full layer count."""
    shape = SHAPES[profile.model]
    return shape.with_layers(int(profile.meta.get("layers_full", shape.num_layers))).layer_types.count("gdn")


def without_gdn_kernels(profile, gdn_verify_doc: dict):
    """`profile` less our GDN verify + reconstruction kernels' time in every GDN layer (the rest of the layers,
    projections, norms and gates included, stays)."""
    shape, bench_shape = SHAPES[profile.model], gdn_verify_doc["gdn_shape"]
    if (bench_shape["num_k_heads"], bench_shape["num_v_heads"], bench_shape["head_k_dim"], bench_shape["head_v_dim"]) \
            != (shape.gdn_k_heads, shape.gdn_v_heads, shape.gdn_head_dim, shape.gdn_head_dim):
        raise SystemExit(f"gdn_verify.json's GDN shape {bench_shape} is not {profile.model}'s")
    layers = gdn_layer_count(profile)
    removed = [[layers * gdn_kernel_us_per_layer(gdn_verify_doc, b, length) for length in profile.lengths]
               for b in profile.batch_sizes]
    gdn = profile.per_layer_type["gdn"]
    if any(r > g for r_row, g_row in zip(removed, gdn) for r, g in zip(r_row, g_row)):
        raise SystemExit("our GDN kernels would take more than the profile's whole GDN layers")
    return _profile_less(profile, removed, "gdn_verify_free")


def simulate_args(simulate_doc: dict) -> argparse.Namespace:
    """simulate.py's arguments as its committed result file records them, paths resolved against the repo."""
    words = shlex.split(simulate_doc["command"])
    args = sim.parse_args(words[words.index("eval/simulate.py") + 1:] if "eval/simulate.py" in words else words[2:])
    for name in ("profile", "traces", "out"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_absolute():
            setattr(args, name, REPO / value)
    recorded = simulate_doc["assumptions"]
    if hashlib.sha256(Path(args.profile).read_bytes()).hexdigest()[:16] != recorded["profile_sha256"]:
        raise SystemExit(f"{args.profile} is not the profile simulate.json was made with (sha256 differs)")
    for name in ("feature_noise", "persistence", "warmup_rounds", "rounds_scale", "probe_cost", "decision_us"):
        mine = getattr(args, "warmup" if name == "warmup_rounds" else name)
        if mine != recorded[name]:
            raise SystemExit(f"simulate.json's {name} {recorded[name]} differs from its command's {mine}")
    return args


def _tokens_per_s(outcome: sim.Outcome) -> float:
    return 1e6 * outcome.tokens / outcome.time_us


def _row(task, c, policy, kernels, outcome, fixed_tps):
    tps = _tokens_per_s(outcome)
    n = max(outcome.rounds * c, 1)
    return {"task": task, "concurrency": c, "policy": policy, "kernels": kernels, "tokens_per_s": round(tps, 2),
            "vs_fixed_dflash": round(tps / fixed_tps, 4), "tau": round(outcome.tokens / n, 3),
            "mean_verified_drafts": round(outcome.verified_drafts / n, 3),
            "round_us": round(outcome.time_us / max(outcome.rounds, 1), 1),
            "probed_rounds": round(outcome.probes / max(outcome.rounds, 1), 3) if policy == "oracle_rc" else ""}


def run_cells(args, profiles, drafter, concurrency, tasks, gdn_verify_doc):
    """(rows, tokens/s by (task, c, "policy@kernels")) of every oracle and reference policy on simulate's cells."""
    traces, _ = sim.build_traces(args)
    idealised = {"gdn_free": without_gdn(profiles["ours"]),
                 "gdn_verify_free": without_gdn_kernels(profiles["ours"], gdn_verify_doc)}
    rows, tputs = [], {}
    for task, by_c in traces.items():
        recorded = task.startswith("recorded")
        if task not in tasks and not recorded:
            continue
        for c in concurrency:
            cell = sim.Cell(by_c[c], c, profiles, drafter, args, seed=sim._seed(task, c))
            outcomes = {}
            for policy, exact in REFERENCE_POLICIES:
                if exact and recorded:  # a recording's confidences are not its true acceptance probabilities
                    continue
                name = f"{policy}_exact_estimates" if exact else policy
                for kernels in ("baseline", "ours") if policy == "fixed_dflash" else ("ours",):
                    outcomes[(name, kernels)] = cell.run(f"{policy}@{kernels}", estimator_noise_free=exact)
            for kernels in ("baseline", "ours"):
                outcomes[("oracle", kernels)] = oracle_outcome(cell, kernels)
                outcomes[("oracle_best_count", kernels)] = oracle_outcome(cell, kernels, best_count=True)
                if not recorded:
                    outcomes[("lossless_optimum", kernels)] = lossless_optimum_outcome(cell, kernels)
            if c == 1:
                outcomes[("oracle_rc", "ours")] = oracle_with_routing_correction(cell, "ours")
            for name, ours in idealised.items():  # charged as "ours" on the idealised table
                free = sim.Cell(by_c[c], c, {"baseline": profiles["baseline"], "ours": ours}, drafter, args,
                                seed=sim._seed(task, c))
                outcomes[("fixed_dflash", name)] = free.run("fixed_dflash@ours")
                outcomes[(sim.WIRED[0], name)] = free.run(f"{sim.WIRED[0]}@ours")
                outcomes[("oracle_best_count", name)] = oracle_outcome(free, "ours", best_count=True)
                if not recorded:
                    outcomes[("lossless_optimum", name)] = lossless_optimum_outcome(free, "ours")
            fixed_tps = _tokens_per_s(outcomes[("fixed_dflash", "baseline")])
            for (policy, kernels), outcome in outcomes.items():
                rows.append(_row(task, c, policy, kernels, outcome, fixed_tps))
                tputs[(task, c, f"{policy}@{kernels}")] = _tokens_per_s(outcome)
            print(f"{task:16s} c={c:<3d} vs fixed K=15: " + " ".join(
                f"{p}@{k}={_tokens_per_s(o) / fixed_tps:.3f}" for (p, k), o in outcomes.items()), flush=True)
    return rows, tputs


def bound_label(tputs, task, c, kernels="ours"):
    """The best oracle on `kernels` in that cell (the bound is the best of them)."""
    return max((f"{o}@{kernels}" for o in ORACLES if (task, c, f"{o}@{kernels}") in tputs),
               key=lambda label: tputs[(task, c, label)])


def summarize(tputs, tasks, concurrency, simulate_doc, reproduced, gdn_verify_removed):
    """Summary keys, aggregated as simulate.json's (geometric mean over the fitted tasks).

    gdn_verify_removed: what the gdn_verify_free scenario takes off ours' profile (`removed_gdn_kernel_time`)."""
    def ratio(num, den, c):  # num / den may be a label or a function task -> label
        pick = lambda x, t: x(t) if callable(x) else x
        return sim.geomean([tputs[(t, c, pick(num, t))] / tputs[(t, c, pick(den, t))] for t in tasks])

    r4 = lambda v: round(v, 4)
    bound = lambda c: (lambda t: bound_label(tputs, t, c))
    committed = simulate_doc["summary"]
    oracle_c1 = ratio(bound(1), BASELINE_FIXED, 1)
    policy_c1 = ratio(bound(1), "fixed_dflash@ours", 1)
    kernels_c1 = ratio("fixed_dflash@ours", BASELINE_FIXED, 1)
    wired_c1 = ratio(WIRED, BASELINE_FIXED, 1)
    host_exact, device_exact = f"{sim.WIRED[0]}_exact_estimates@ours", "hybridspec_exact_estimates@ours"
    summary = {
        "source": (f"eval/results/simulate.json (commit {simulate_doc['commit'][:12]}, {simulate_doc['date']}): "
                   f"its command, traces, profile and drafter"),
        "inputs_reproduce_simulate_json": reproduced,
        "aggregation": f"geometric mean over tasks {list(tasks)} (as simulate.json)",
        "goal_speedup_vs_fixed_c1": f">= {GOAL_SPEEDUP_VS_FIXED_C1}",
        # The bound: the best clairvoyant oracle per task on our kernels against fixed K = 15 on vLLM's.
        "oracle_speedup_vs_fixed_c1": r4(oracle_c1),
        "goal_reachable_by_a_clairvoyant_oracle": oracle_c1 >= GOAL_SPEEDUP_VS_FIXED_C1,
        "oracle_verify_accepted_speedup_vs_fixed_c1": r4(ratio("oracle@ours", BASELINE_FIXED, 1)),
        "oracle_best_count_vs_verify_accepted_c1": r4(ratio("oracle_best_count@ours", "oracle@ours", 1)),
        "routing_correction_best_case_gain_c1": r4(ratio("oracle_rc@ours", "oracle@ours", 1)),
        # The split of the bound, as the notes split speedup_vs_fixed_c1.
        "oracle_policy_vs_fixed_same_kernels_c1": r4(policy_c1),
        "kernels_fixed_ours_vs_baseline_c1": r4(kernels_c1),
        "policy_part_needed_for_goal_c1": r4(GOAL_SPEEDUP_VS_FIXED_C1 / kernels_c1),
        "oracle_on_baseline_kernels_vs_fixed_c1": r4(ratio(lambda t: bound_label(tputs, t, 1, "baseline"),
                                                           BASELINE_FIXED, 1)),
        "gdn_free_kernels_fixed_vs_baseline_c1": r4(ratio("fixed_dflash@gdn_free", BASELINE_FIXED, 1)),
        "oracle_gdn_free_speedup_vs_fixed_c1": r4(ratio("oracle_best_count@gdn_free", BASELINE_FIXED, 1)),
        "wired_policy_gdn_free_speedup_vs_fixed_c1": r4(ratio(f"{sim.WIRED[0]}@gdn_free", BASELINE_FIXED, 1)),
        # The best LOSSLESS choice, told the true acceptance probabilities (no lossless policy knows more here).
        "lossless_optimum_speedup_vs_fixed_c1": r4(ratio("lossless_optimum@ours", BASELINE_FIXED, 1)),
        "goal_reachable_by_a_lossless_length_policy": ratio("lossless_optimum@ours", BASELINE_FIXED, 1)
        >= GOAL_SPEEDUP_VS_FIXED_C1,
        "lossless_optimum_policy_vs_fixed_same_kernels_c1": r4(ratio("lossless_optimum@ours", "fixed_dflash@ours", 1)),
        "lossless_optimum_on_baseline_kernels_vs_fixed_c1": r4(ratio("lossless_optimum@baseline", BASELINE_FIXED, 1)),
        "lossless_optimum_gdn_free_speedup_vs_fixed_c1": r4(ratio("lossless_optimum@gdn_free", BASELINE_FIXED, 1)),
        # Only our own GDN kernels free (gdn_verify + reconstruction); vLLM's projections, norms and gates stay.
        "gdn_verify_free_removed": gdn_verify_removed,
        "gdn_verify_free_kernels_fixed_vs_baseline_c1": r4(ratio("fixed_dflash@gdn_verify_free", BASELINE_FIXED, 1)),
        "oracle_gdn_verify_free_speedup_vs_fixed_c1": r4(ratio("oracle_best_count@gdn_verify_free",
                                                               BASELINE_FIXED, 1)),
        "wired_policy_gdn_verify_free_speedup_vs_fixed_c1": r4(ratio(f"{sim.WIRED[0]}@gdn_verify_free",
                                                                     BASELINE_FIXED, 1)),
        "lossless_optimum_gdn_verify_free_speedup_vs_fixed_c1": r4(ratio("lossless_optimum@gdn_verify_free",
                                                                         BASELINE_FIXED, 1)),
        "goal_reachable_by_a_lossless_length_policy_gdn_verify_free": ratio(
            "lossless_optimum@gdn_verify_free", BASELINE_FIXED, 1) >= GOAL_SPEEDUP_VS_FIXED_C1,
        "kernel_part_needed_with_lossless_optimum_c1": r4(GOAL_SPEEDUP_VS_FIXED_C1 / ratio(
            "lossless_optimum@ours", "fixed_dflash@ours", 1)),
        # Where the wired policy stands, from the same replay.
        "wired_policy": WIRED,
        "wired_speedup_vs_fixed_c1": r4(wired_c1),
        "committed_speedup_vs_fixed_c1": committed["speedup_vs_fixed_c1"],
        "wired_share_of_oracle_c1": r4(wired_c1 / oracle_c1),
        "device_decided_speedup_vs_fixed_c1": r4(ratio("hybridspec@ours", BASELINE_FIXED, 1)),
        "exact_estimates_host_speedup_vs_fixed_c1": r4(ratio(host_exact, BASELINE_FIXED, 1)),
        "exact_estimates_device_decided_speedup_vs_fixed_c1": r4(ratio(device_exact, BASELINE_FIXED, 1)),
        # oracle / wired at c1 as a product of three steps (each a ratio of two replays of the same rounds).
        "gap_c1_estimator_noise_host": r4(ratio(host_exact, WIRED, 1)),
        "gap_c1_host_fixed_count_exact_estimates": r4(ratio(device_exact, host_exact, 1)),
        "gap_c1_our_rule_vs_lossless_optimum": r4(ratio("lossless_optimum@ours", device_exact, 1)),
        "gap_c1_clairvoyance": r4(ratio(bound(1), "lossless_optimum@ours", 1)),
        "lossless_optimum_vs_fixed": {f"c{c}": r4(ratio("lossless_optimum@ours", BASELINE_FIXED, c))
                                      for c in concurrency},
        "oracle_vs_fixed": {f"c{c}": r4(ratio(bound(c), BASELINE_FIXED, c)) for c in concurrency},
        "oracle_policy_vs_fixed_same_kernels": {f"c{c}": r4(ratio(bound(c), "fixed_dflash@ours", c))
                                               for c in concurrency},
        "wired_vs_fixed": {f"c{c}": r4(ratio(WIRED, BASELINE_FIXED, c)) for c in concurrency},
        "lossless_optimum_gdn_verify_free_vs_fixed": {
            f"c{c}": r4(ratio("lossless_optimum@gdn_verify_free", BASELINE_FIXED, c)) for c in concurrency},
        "oracle_gdn_verify_free_vs_fixed": {
            f"c{c}": r4(ratio("oracle_best_count@gdn_verify_free", BASELINE_FIXED, c)) for c in concurrency},
    }
    later = [c for c in concurrency if c > 1]
    if later:
        summary["oracle_min_ratio_vs_fixed_c4_to_c64"] = min(summary["oracle_vs_fixed"][f"c{c}"] for c in later)
    for task in sorted({t for (t, _, _) in tputs if t.startswith("recorded")}):
        summary[f"{task}_oracle_vs_fixed"] = {
            f"c{c}": r4(tputs[(task, c, bound_label(tputs, task, c))] / tputs[(task, c, "fixed_dflash@baseline")])
            for c in concurrency}
    return summary


def removed_gdn_kernel_time(profile, gdn_verify_path: Path, gdn_verify_doc: dict) -> dict:
    """Provenance and size of the gdn_verify_free saving at batch 1 (the c1 goal's batch)."""
    idealised = without_gdn_kernels(profile, gdn_verify_doc)
    b1 = profile.batch_sizes.index(1)
    at = lambda table, length: table[b1][profile.lengths.index(length)]
    lengths = [length for length in (1, 4, 16) if length in profile.lengths]
    return {
        "source": (f"{gdn_verify_path.relative_to(REPO) if gdn_verify_path.is_relative_to(REPO) else gdn_verify_path}"
                   f" (commit {gdn_verify_doc['commit'][:12]}, {gdn_verify_doc['date']}): per layer max(ours_us_all, "
                   "ours_verify_us + ours_reconstruct_us), linear in L, L below the measured grid at its first L "
                   "(overstates the saving), above it extrapolated from the last two"),
        "gdn_layers": gdn_layer_count(profile),
        "removed_us_b1": {f"L{n}": round(at(profile.t_us, n) - at(idealised.t_us, n), 1) for n in lengths},
        "share_of_gdn_layers_b1": {f"L{n}": round((at(profile.t_us, n) - at(idealised.t_us, n))
                                                  / at(profile.per_layer_type["gdn"], n), 4) for n in lengths},
        "share_of_verify_pass_b1": {f"L{n}": round(1 - at(idealised.t_us, n) / at(profile.t_us, n), 4)
                                    for n in lengths},
    }


def reproduces(rows, simulate_doc) -> bool:
    """Whether the replayed fixed-K and wired-policy rows equal simulate.json's (same traces, same tables)."""
    committed = {(r["task"], r["concurrency"], r["policy"], r["kernels"]): r["tokens_per_s"]
                 for r in simulate_doc["rows"]}
    checked = [(r, committed.get((r["task"], r["concurrency"], r["policy"], r["kernels"]))) for r in rows
               if r["policy"] in ("fixed_dflash", sim.WIRED[0], "hybridspec") and r["kernels"] in ("baseline", "ours")]
    return bool(checked) and all(want is not None and abs(r["tokens_per_s"] - want) <= 0.01 for r, want in checked)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", type=Path, default=EVAL / "results" / "simulate.json",
                        help="simulate.py's result file: its command and assumptions fix the inputs")
    parser.add_argument("--gdn-verify", type=Path, default=EVAL / "results" / "gdn_verify.json",
                        help="bench_gdn_verify.py's result file: our GDN kernels' per-layer times (gdn_verify_free)")
    parser.add_argument("--out", type=Path, default=EVAL / "results")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(sim.CONCURRENCY))
    args = parser.parse_args(argv)
    if 1 not in args.concurrency:
        parser.error("--concurrency must include 1 (the bound is at concurrency 1)")
    torch.set_num_threads(1)
    started = time.time()
    simulate_doc = json.loads(args.simulate.read_text())
    sim_args = simulate_args(simulate_doc)
    profiles = sim.load_variants(sim_args.profile)
    base = sim.DrafterCost()
    drafter = sim.DrafterCost(launch_us=base.launch_us * sim_args.drafter_scale,
                              hbm_bytes_per_us=base.hbm_bytes_per_us / sim_args.drafter_scale,
                              flops_per_us=base.flops_per_us / sim_args.drafter_scale)
    tasks = [t for t in sim.am.TASKS if t in sim_args.tasks]
    gdn_verify_doc = json.loads(args.gdn_verify.read_text())
    rows, tputs = run_cells(sim_args, profiles, drafter, args.concurrency, tasks, gdn_verify_doc)
    summary = summarize(tputs, tasks, args.concurrency, simulate_doc, reproduces(rows, simulate_doc),
                        removed_gdn_kernel_time(profiles["ours"], args.gdn_verify.resolve(), gdn_verify_doc))
    command = "python eval/simulate_bounds.py" + "".join(f" {shlex.quote(w)}" for w in (argv or sys.argv[1:]))
    title, tables = _markdown(BENCH, rows, summary).split("\n\n", 1)
    markdown = "\n\n".join([
        title,
        f"SIMULATED, derived (no new measurement) from {summary['source']}; device {simulate_doc['device']}. "
        "A clairvoyant length oracle (knows each round's accepted drafts) on the same rounds: the most any length "
        "policy, lossless or not, could get on these inputs; `*_exact_estimates` = simulate's policies told the "
        f"true acceptance probabilities (not the outcomes). Command: `{command}`.",
        tables])
    write_results(BENCH, rows, summary, command, simulate_doc["device"], out_dir=args.out, markdown=markdown)
    print(json.dumps(summary, indent=1))
    print(f"done in {time.time() - started:.0f} s: {command}")
    return summary


if __name__ == "__main__":
    main()
