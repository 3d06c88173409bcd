"""eval/simulate_bounds.py: the count choices against brute force on fresh random inputs, and the bound on the
committed inputs (simulate.json's traces and profile) checked for internal consistency, not for its values."""
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from eval_modules import load_eval_module

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bounds():
    return load_eval_module("simulate_bounds")


@pytest.mark.parametrize("seed,rounds,counts", [(0, 3, 4), (1, 2, 5), (2, 4, 3)])
def test_best_counts_is_the_best_choice_per_round(bounds, seed, rounds, counts):
    """Dinkelbach's counts reach the best ratio of sums over every per-round choice (exhaustive), with a time
    that is not monotone in the count."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.rand(rounds, counts, generator=g, dtype=torch.float64) * 5 + 1
    round_us = torch.rand(counts, generator=g, dtype=torch.float64) * 3 + 0.5
    chosen = bounds.best_counts(tokens, round_us)
    got = float(tokens.gather(1, chosen.unsqueeze(1)).sum() / round_us[chosen].sum())
    best = max(sum(float(tokens[r, n]) for r, n in enumerate(pick)) / sum(float(round_us[n]) for n in pick)
               for pick in itertools.product(range(counts), repeat=rounds))
    assert got == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed,batch,drafts", [(3, 2, 3), (4, 3, 2), (5, 1, 5)])
def test_accepted_by_count_takes_the_best_allocation(bounds, seed, batch, drafts):
    """For every total N, the expected accepted drafts are the best over all per-request splits of N (brute force)
    and the realized ones are that split's sum of min(accepted, verified)."""
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(2, batch, drafts, generator=g, dtype=torch.float64)
    survival = conf.cumprod(-1)
    accepted = torch.randint(0, drafts + 1, (2, batch), generator=g)
    expected, realized = bounds.accepted_by_count(survival, accepted)
    assert expected.shape == realized.shape == (2, batch * drafts + 1)
    for r in range(2):
        by_total = {}
        for split in itertools.product(range(drafts + 1), repeat=batch):
            value = sum(float(survival[r, b, :n].sum()) for b, n in enumerate(split))
            got = sum(min(int(accepted[r, b]), n) for b, n in enumerate(split))
            if sum(split) not in by_total or value > by_total[sum(split)][0]:
                by_total[sum(split)] = (value, got)
        for total, (value, got) in by_total.items():
            assert float(expected[r, total]) == pytest.approx(value, abs=1e-12)
            assert int(realized[r, total]) == got


def test_counted_rounds_follow_the_simulators_chunks(bounds):
    sim = bounds.sim
    mask = bounds.counted_rounds(5 * sim.CHUNK + 3, 2 * sim.CHUNK)
    assert not mask[: 2 * sim.CHUNK].any() and mask[2 * sim.CHUNK:].all()
    assert int(bounds.counted_rounds(3 * sim.CHUNK, sim.CHUNK + 1).sum()) == sim.CHUNK


@pytest.fixture(scope="module")
def committed_run(bounds, tmp_path_factory):
    out = tmp_path_factory.mktemp("simulate_bounds")
    torch.set_num_threads(1)
    bounds.main(["--out", str(out), "--concurrency", "1"])
    return json.loads((out / "simulate_bounds.json").read_text())


def test_bound_on_the_committed_inputs_is_consistent(bounds, committed_run):
    sim = bounds.sim
    doc, simulate_doc = committed_run, json.loads((REPO / "eval/results/simulate.json").read_text())
    s = doc["summary"]
    assert doc["device"] == simulate_doc["device"]
    assert s["inputs_reproduce_simulate_json"] is True
    assert s["wired_speedup_vs_fixed_c1"] == pytest.approx(simulate_doc["summary"]["speedup_vs_fixed_c1"], abs=6e-4)
    # ordering: the clairvoyant bound >= the lossless optimum >= every simulated lossless policy
    assert s["oracle_speedup_vs_fixed_c1"] >= s["oracle_verify_accepted_speedup_vs_fixed_c1"]
    assert s["oracle_speedup_vs_fixed_c1"] >= s["lossless_optimum_speedup_vs_fixed_c1"]
    assert s["lossless_optimum_speedup_vs_fixed_c1"] >= s["committed_speedup_vs_fixed_c1"]
    assert s["lossless_optimum_speedup_vs_fixed_c1"] >= 0.997 * s["exact_estimates_device_decided_speedup_vs_fixed_c1"]
    assert s["oracle_best_count_vs_verify_accepted_c1"] >= 1.0 and s["routing_correction_best_case_gain_c1"] >= 1.0
    assert s["goal_reachable_by_a_clairvoyant_oracle"] == (s["oracle_speedup_vs_fixed_c1"] >= 1.4)
    # the split multiplies back, and so do the three steps of the gap
    assert s["oracle_speedup_vs_fixed_c1"] == pytest.approx(
        s["oracle_policy_vs_fixed_same_kernels_c1"] * s["kernels_fixed_ours_vs_baseline_c1"], abs=2e-4)
    gap = s["gap_c1_estimator_noise_host"] * s["gap_c1_host_fixed_count_exact_estimates"]
    assert s["lossless_optimum_speedup_vs_fixed_c1"] / s["wired_speedup_vs_fixed_c1"] == pytest.approx(
        gap * s["gap_c1_our_rule_vs_lossless_optimum"], abs=5e-4)
    # ceiling: the same tokens per round as fixed K = 15, at best for drafter + T_ours(1) instead of + T_base(16)
    profiles = sim.load_variants(REPO / simulate_doc["assumptions"]["profile"])
    lat = {k: sim.VerifyLatencyModel(profiles[k], 1, 17, overhead_us=sim.DrafterCost().time_us(1))
           for k in ("baseline", "ours")}
    ceiling = float(lat["baseline"].round_us(1, 16.0) / lat["ours"].round_us(1, 1.0))
    assert s["oracle_speedup_vs_fixed_c1"] <= ceiling
    rows = {(r["task"], r["concurrency"], r["policy"], r["kernels"]): r for r in doc["rows"]}
    for (task, c, policy, kernels), row in rows.items():
        best = rows[(task, c, "oracle_best_count", kernels)]["tokens_per_s"]
        if policy != "oracle_rc":  # the only one priced off T (a kept probe's expert shift)
            assert row["tokens_per_s"] <= best + 0.01, (task, policy, kernels)
        if policy == "oracle":
            assert row["tokens_per_s"] >= rows[(task, c, "fixed_dflash", kernels)]["tokens_per_s"]
            assert math.isclose(row["tau"], rows[(task, c, "fixed_dflash", kernels)]["tau"], abs_tol=1e-3)


@pytest.mark.parametrize("seed", [6, 7])
def test_gdn_kernel_time_interpolates_in_length_and_holds_below_the_grid(bounds, seed):
    """Linear in L between measured lengths, the first measured L's time below the grid, linear extrapolation
    from the last two above it; per row the larger of the combined pair and the sum of its parts."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 5, 9, 10]
    combined = (torch.rand(len(lengths), generator=g, dtype=torch.float64) * 10 + 1).tolist()
    verify = (torch.rand(len(lengths), generator=g, dtype=torch.float64) * 8).tolist()
    reconstruct = (torch.rand(len(lengths), generator=g, dtype=torch.float64) * 3).tolist()
    doc = {"rows": [{"L": n, "B": 2, "ours_us_all": a, "ours_verify_us": v, "ours_reconstruct_us": r}
                    for n, a, v, r in zip(lengths, combined, verify, reconstruct)]
           + [{"L": 4, "B": 7, "ours_us_all": 1e6, "ours_verify_us": 0.0, "ours_reconstruct_us": 0.0}]}
    per_row = [max(a, v + r) for a, v, r in zip(combined, verify, reconstruct)]
    at = lambda length: bounds.gdn_kernel_us_per_layer(doc, 2, length)
    for n, t in zip(lengths, per_row):
        assert at(n) == pytest.approx(t, rel=1e-12)
    assert at(1) == at(2.5) == pytest.approx(per_row[0], rel=1e-12)
    assert at(7) == pytest.approx((per_row[1] + per_row[2]) / 2, rel=1e-12)
    assert at(12) == pytest.approx(per_row[3] + 2 * (per_row[3] - per_row[2]), rel=1e-12)
    with pytest.raises(SystemExit):
        bounds.gdn_kernel_us_per_layer(doc, 3, 4)  # a batch the bench did not measure


def test_gdn_verify_free_sits_between_ours_and_gdn_free(bounds, committed_run):
    """Our GDN kernels are part of the GDN layers: the scenario's T is never below the GDN-free table, never
    above ours, and every replay on it lands between the two."""
    sim = bounds.sim
    simulate_doc = json.loads((REPO / "eval/results/simulate.json").read_text())
    profiles = sim.load_variants(REPO / simulate_doc["assumptions"]["profile"])
    gdn_verify_doc = json.loads((REPO / "eval/results/gdn_verify.json").read_text())
    ours = profiles["ours"]
    scenario, gdn_free = bounds.without_gdn_kernels(ours, gdn_verify_doc), bounds.without_gdn(ours)
    assert bounds.gdn_layer_count(ours) == 30  # Qwen3.6-35B-A3B: 40 layers, every fourth full attention
    for free_row, mine_row, ours_row in zip(gdn_free.t_us, scenario.t_us, ours.t_us):
        for free, mine, full in zip(free_row, mine_row, ours_row):
            assert free <= mine < full
    rows = {(r["task"], r["concurrency"], r["policy"], r["kernels"]): r["tokens_per_s"] for r in committed_run["rows"]}
    cells = {(task, c, policy) for (task, c, policy, kernels) in rows if kernels == "gdn_verify_free"}
    assert {policy for (_, _, policy) in cells} >= {"fixed_dflash", "oracle_best_count", "lossless_optimum"}
    for task, c, policy in cells:
        if policy in ("fixed_dflash", "oracle_best_count", "lossless_optimum"):  # the wired one is not an optimum
            assert rows[(task, c, policy, "ours")] <= rows[(task, c, policy, "gdn_verify_free")] \
                <= rows[(task, c, policy, "gdn_free")], (task, c, policy)
    s = committed_run["summary"]
    assert s["lossless_optimum_speedup_vs_fixed_c1"] <= s["lossless_optimum_gdn_verify_free_speedup_vs_fixed_c1"] \
        <= s["lossless_optimum_gdn_free_speedup_vs_fixed_c1"]
    assert s["kernels_fixed_ours_vs_baseline_c1"] < s["gdn_verify_free_kernels_fixed_vs_baseline_c1"] \
        <= s["gdn_free_kernels_fixed_vs_baseline_c1"]
    assert s["goal_reachable_by_a_lossless_length_policy_gdn_verify_free"] == (
        s["lossless_optimum_gdn_verify_free_speedup_vs_fixed_c1"] >= 1.4)
    assert s["gdn_verify_free_removed"]["gdn_layers"] == 30
