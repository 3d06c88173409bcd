"""The host's count of drafts for the device cut (vllm_hybridspec/policy/cut_budget.py): against the plain-Python
reference on fresh random inputs (odd sizes, a leading chunk dimension), the cases the rule exists for, the
transition history, and bad input."""
import pytest
import torch

from vllm_hybridspec.policy import (
    TransitionHistory,
    VerifyLatencyModel,
    cut_budget,
    naive_cut_budget,
    non_moe_profile,
    prefix_scan_budget,
    scenario_count,
)
from policy_fixtures import one_thread, profile  # noqa: F401  (pytest fixtures)


def models(profile, batch, k):
    return (VerifyLatencyModel(profile, batch, k + 1, overhead_us=300.0),
            VerifyLatencyModel(non_moe_profile(profile), batch, k + 1))


def random_problem(seed, chunk, batch, k, scenarios, min_cap=1, shift_scale=1.0):
    """Fresh stale confidences [chunk, batch, k], capacities [chunk, batch] and scenario shifts."""
    g = torch.Generator().manual_seed(seed)
    stale = torch.rand(chunk, batch, k, generator=g) * 0.5 + 0.5
    caps = torch.randint(min_cap, k + 1, (chunk, batch), generator=g)
    shifts = torch.randn(scenarios, chunk, batch, k, generator=g, dtype=torch.float64) * shift_scale
    return stale, caps, shifts


@pytest.mark.parametrize("batch,k,scenarios,min_drafts", [
    pytest.param(1, 15, 8, 1, id="b1-k15"),
    pytest.param(3, 5, 5, 0, id="b3-k5"),
    pytest.param(7, 4, 3, 1, id="b7-k4"),
    pytest.param(2, 9, 11, 2, id="b2-k9"),
])
@pytest.mark.parametrize("seed", range(3))
def test_matches_naive_reference(profile, batch, k, scenarios, min_drafts, seed):
    chunk = 2
    stale, caps, shifts = random_problem(seed, chunk, batch, k, scenarios, min_cap=0, shift_scale=1.5)
    latency, cut = models(profile, batch, k)
    host = prefix_scan_budget(stale, caps, latency, min_drafts=min_drafts)
    got = cut_budget(stale, caps, latency, cut, 4.0, shifts, host, min_drafts=min_drafts)
    assert got.shape == (chunk,)
    for i in range(chunk):
        want, rates = naive_cut_budget(stale[i].tolist(), caps[i].tolist(),
                                       lambda x: float(latency.round_us(batch, x)),
                                       lambda x: float(cut.verify_us(batch, x)), 4.0,
                                       shifts[:, i].tolist(), int(host[i]), min_drafts)
        assert int(host[i]) <= int(got[i]) <= int(caps[i].sum())
        # equal, or a float tie: the count torch chose is as good as the reference's
        assert int(got[i]) == want or rates[int(got[i])] == pytest.approx(rates[want], rel=1e-9)


def test_without_uncertainty_the_host_budget_stands(profile):
    """No step-to-step change: this step is last step, whose best prefix the host already scheduled; any draft
    more would only be neutralised."""
    stale = torch.tensor([[0.95, 0.9, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1]])
    caps = torch.tensor([8])
    latency, cut = models(profile, 1, 8)
    host = prefix_scan_budget(stale, caps, latency)
    got = cut_budget(stale, caps, latency, cut, 5.0, torch.zeros(16, 1, 8, dtype=torch.float64), host)
    assert int(got) == int(host) < 8


def test_schedules_more_when_steps_swing_and_neutralising_is_cheap(profile):
    """A request whose steps swing between confident and not: at batch 1 a cut token costs a fraction of a
    verified one, so the host leaves room for the confident case; the dearer a neutralised token, the less."""
    stale = torch.tensor([[0.6] * 12])
    caps = torch.tensor([12])
    latency, cut = models(profile, 1, 12)
    host = int(prefix_scan_budget(stale, caps, latency))
    swings = torch.tensor([3.0, -3.0], dtype=torch.float64).repeat(8).view(16, 1, 1, 1).expand(16, 1, 1, 12)
    cheap = int(cut_budget(stale, caps, latency, cut, 0.0, swings.reshape(16, 1, 12), host))
    assert cheap > host
    dear = VerifyLatencyModel(profile, 1, 13)  # a neutralised token runs everything, the MoE layers included
    dearer = int(cut_budget(stale, caps, latency, dear, 1000.0, swings.reshape(16, 1, 12), host))
    assert host <= dearer < cheap


def test_transition_history_ring_and_samples():
    history = TransitionHistory(3, capacity=4)
    assert history.sample(2, (5,)) is None
    previous = torch.tensor([[0.9, 0.8, 0.5]] * 6)
    current = previous.clone()
    current[:, 0] = torch.linspace(0.5, 0.95, 6)
    history.observe(previous, current)
    assert history.size == 4  # the last 4 of 6 kept
    want = torch.logit(torch.cumprod(current[2:].double(), -1)) - torch.logit(torch.cumprod(previous[2:].double(), -1))
    assert torch.allclose(torch.sort(history.shifts[:, 0]).values, torch.sort(want[:, 0]).values)
    history.observe(previous[:1], previous[:1])  # wraps around: the oldest row is replaced by a zero shift
    assert history.size == 4 and (history.shifts == 0).all(-1).sum() == 1
    draws = history.sample(7, (2, 5), torch.Generator().manual_seed(0))
    assert draws.shape == (7, 2, 5, 3)


def test_scenario_count():
    assert scenario_count(1) == 32 and scenario_count(8) == 32 and scenario_count(16) == 16
    assert scenario_count(64) == 4 and scenario_count(512) == 4


def test_bad_inputs(profile):
    latency, cut = models(profile, 2, 4)
    stale, caps, shifts = torch.rand(2, 4), torch.tensor([4, 4]), torch.zeros(3, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_drafts"):
        cut_budget(stale, caps.float(), latency, cut, 1.0, shifts, 0)
    with pytest.raises(ValueError, match="shifts"):
        cut_budget(stale, caps, latency, cut, 1.0, torch.zeros(3, 2, 5), 0)
    with pytest.raises(ValueError, match="cut_token_us"):
        cut_budget(stale, caps, latency, cut, -1.0, shifts, 0)
    with pytest.raises(ValueError, match="stale_confidences"):
        cut_budget(torch.rand(4), caps, latency, cut, 1.0, shifts, 0)
    with pytest.raises(ValueError, match="previous and current"):
        TransitionHistory(4).observe(torch.rand(2, 4), torch.rand(3, 4))
    with pytest.raises(ValueError, match="num_positions"):
        TransitionHistory(0)
    with pytest.raises(ValueError, match="batch"):
        scenario_count(0)
    from vllm_hybridspec.latency_profile import LatencyProfile
    with pytest.raises(ValueError, match="moe"):
        non_moe_profile(LatencyProfile("d", "m", "v", [1], [1, 2], [[1.0, 2.0]]))


@pytest.mark.parametrize("seed", range(3))
def test_device_rule_matches_naive_reference(profile, seed):
    """With the device's own rule in the scenarios (here a simple stopping rule: verify while the scenario's
    conditional acceptance stays above one half)."""
    chunk, batch, k = 2, 3, 6
    stale, caps, shifts = random_problem(seed, chunk, batch, k, scenarios=5)
    latency, cut = models(profile, batch, k)

    def rule(conf, capacities):
        keep = torch.cumprod((conf > 0.5).long(), -1)
        return torch.minimum(keep.sum(-1), capacities)

    def naive_rule(conf, capacities):
        out = []
        for row, cap in zip(conf, capacities):
            n = 0
            while n < len(row) and row[n] > 0.5:
                n += 1
            out.append(min(n, cap))
        return out

    got = cut_budget(stale, caps, latency, cut, 3.0, shifts, 1, device_rule=rule)
    for i in range(chunk):
        want, rates = naive_cut_budget(stale[i].tolist(), caps[i].tolist(), lambda x: float(latency.round_us(batch, x)),
                                       lambda x: float(cut.verify_us(batch, x)), 3.0, shifts[:, i].tolist(), 1,
                                       device_rule=naive_rule)
        assert int(got[i]) == want or rates[int(got[i])] == pytest.approx(rates[want], rel=1e-9)


def test_device_cut_rule_is_the_wired_lookahead(profile):
    """`device_cut_rule` runs what `device_verify_lengths` runs, scenario by scenario, at the host's price."""
    from vllm_hybridspec.adaptive.budget import device_verify_lengths
    from vllm_hybridspec.policy import choose_verify_lengths, cut_saving_profile, device_cut_rule

    g = torch.Generator().manual_seed(0)
    batch, k = 3, 7
    saving = VerifyLatencyModel(cut_saving_profile(profile, 2.0), batch, k + 1)
    stale = torch.rand(batch, k, generator=g) * 0.4 + 0.6
    scenario = torch.rand(4, batch, k, generator=g) * 0.4 + 0.6
    caps = torch.tensor([7, 3, 5])
    rule = device_cut_rule(saving, stale, 0.004, min_drafts=1, max_drafts=6)
    got = rule(scenario, caps.expand(4, batch))
    for q in range(4):
        want = choose_verify_lengths(scenario[q], caps, saving, min_drafts=1, max_drafts=6, lookahead=True,
                                     forecast_confidences=stale, rate_threshold=0.004).num_drafts
        assert got[q].tolist() == want.tolist()
        wired = device_verify_lengths(scenario[q], stale, caps, caps, saving, min_drafts=1, max_drafts=6,
                                      rate_threshold=0.004)
        assert wired.tolist() == torch.minimum(want, caps).tolist()


def test_cut_saving_profile_and_budget_rate(profile):
    from vllm_hybridspec.policy import budget_rate, cut_saving_profile

    saving = cut_saving_profile(profile, 1.5)
    for b, row, moe in zip(profile.batch_sizes, saving.t_us, profile.per_layer_type["moe"]):
        assert row == pytest.approx([m - 1.5 * b * length for m, length in zip(moe, profile.lengths)])
    with pytest.raises(ValueError, match="moe_token_us"):
        cut_saving_profile(profile, -1.0)
    latency, _ = models(profile, 2, 3)
    stale = torch.tensor([[0.9, 0.5, 0.5], [0.8, 0.8, 0.1]])
    caps = torch.tensor([3, 2])
    # forced first drafts (min_drafts 1) 0.9, 0.8, then 0.64 (request 1's second), 0.45 ...
    want = (2 + 0.9 + 0.8 + 0.64) / float(latency.round_us(2, 1.0 + 3 / 2))
    # float32 survivals
    assert float(budget_rate(stale, caps, latency, 3, min_drafts=1)) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_device_price_matches_naive_reference(profile, seed):
    """The wiring's device model: the prefix of each scenario with the most tokens - price x saving time."""
    from vllm_hybridspec.policy import cut_saving_profile

    chunk, batch, k = 2, 3, 6
    stale, caps, shifts = random_problem(seed, chunk, batch, k, scenarios=5)
    latency, cut = models(profile, batch, k)
    saving = VerifyLatencyModel(cut_saving_profile(profile, 2.0), batch, k + 1)
    price = torch.tensor([0.002, 0.01], dtype=torch.float64)
    got = cut_budget(stale, caps, latency, cut, 2.0, shifts, 1, min_drafts=1, device_price=(saving, price))
    for i in range(chunk):
        want, rates = naive_cut_budget(stale[i].tolist(), caps[i].tolist(), lambda x: float(latency.round_us(batch, x)),
                                       lambda x: float(cut.verify_us(batch, x)), 2.0, shifts[:, i].tolist(), 1,
                                       min_drafts=1,
                                       device_price=(lambda x: float(saving.verify_us(batch, x)), float(price[i])))
        assert int(got[i]) == want or rates[int(got[i])] == pytest.approx(rates[want], rel=1e-9)
