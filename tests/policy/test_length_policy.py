import pytest
import torch

from vllm_hybridspec.policy import (
    VerifyLatencyModel,
    choose_verify_lengths,
    naive_choose_verify_lengths,
    naive_prefix_scan_budget,
    naive_vllm_adaptive_lengths,
    prefix_scan_budget,
    survival_probabilities,
    vllm_adaptive_lengths,
)
from policy_fixtures import one_thread, profile  # noqa: F401  (pytest fixtures)


def _model(profile, max_batch=64, k=15, overhead_us=500.0):
    return VerifyLatencyModel(profile, max_batch, k + 1, overhead_us=overhead_us)


def _random_case(seed, batch, k):
    g = torch.Generator().manual_seed(seed)
    # A mix of confident and hopeless requests, as a real batch has.
    level = torch.rand(batch, 1, generator=g)
    conf = (level + 0.3 * torch.rand(batch, k, generator=g)).clamp(0, 1) ** 0.5
    num = torch.randint(0, k + 1, (batch,), generator=g)
    return conf, num


@pytest.mark.parametrize("batch,k", [(1, 1), (1, 15), (3, 5), (7, 15), (33, 7), (64, 15)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_reference(profile, batch, k, seed):
    lat = _model(profile, k=k)
    conf, num = _random_case(seed, batch, k)
    rate = float(choose_verify_lengths(conf, num, lat).tokens_per_us)
    for kwargs in ({}, {"min_drafts": 2}, {"max_drafts": 3}, {"padded_weight": 1.0}, {"padded_weight": 0.3},
                   {"rate_threshold": 0.7 * rate}, {"rate_threshold": 1.3 * rate, "min_drafts": 1}):
        got = choose_verify_lengths(conf, num, lat, **kwargs).num_drafts.tolist()
        want = naive_choose_verify_lengths(conf.tolist(), num.tolist(), lambda x: float(lat.round_us(batch, x)),
                                           **kwargs)
        assert got == want, kwargs


@pytest.mark.parametrize("batch,k", [(1, 15), (5, 4), (16, 15), (63, 15)])
def test_vllm_rule_matches_naive_reference(profile, batch, k):
    lat = _model(profile, k=k)
    conf, num = _random_case(batch, batch, k)
    stale, _ = _random_case(batch + 100, batch, k)
    got = vllm_adaptive_lengths(conf, num, lat, budget_confidences=stale).tolist()
    want = naive_vllm_adaptive_lengths(conf.tolist(), num.tolist(), lambda x: float(lat.round_us(batch, x)),
                                       stale.tolist())
    assert got == want


def test_leading_dims_equal_per_batch_calls(profile):
    lat = _model(profile)
    conf = torch.rand(3, 2, 5, 15) ** 0.3
    num = torch.randint(0, 16, (3, 2, 5))
    stacked = choose_verify_lengths(conf, num, lat)
    for i in range(3):
        for j in range(2):
            one = choose_verify_lengths(conf[i, j], num[i, j], lat)
            assert torch.equal(stacked.num_drafts[i, j], one.num_drafts)
            assert torch.allclose(stacked.tokens_per_us[i, j], one.tokens_per_us)
    assert torch.equal(vllm_adaptive_lengths(conf, num, lat)[1, 0], vllm_adaptive_lengths(conf[1, 0], num[1, 0], lat))


def test_outputs_are_consistent(profile):
    lat = _model(profile)
    conf, num = _random_case(5, 9, 15)
    d = choose_verify_lengths(conf, num, lat)
    n = d.num_drafts.long()
    assert (n <= num).all() and (n >= 0).all()
    s = survival_probabilities(conf, num)
    expected = 9 + sum(float(s[b, : n[b]].sum()) for b in range(9))
    assert d.expected_tokens.item() == pytest.approx(expected, rel=1e-5)
    x = 1 + n.sum().item() / 9
    assert d.round_us.item() == pytest.approx(float(lat.round_us(9, x)), rel=1e-5)
    assert d.tokens_per_us.item() == pytest.approx(expected / d.round_us.item(), rel=1e-5)
    for b in range(9):
        want = float(s[b, n[b]]) if n[b] < num[b] else 0.0
        assert d.next_survival[b].item() == pytest.approx(want)


def test_rate_threshold_nan_falls_back_to_the_round_rate(profile):
    lat = _model(profile)
    conf, num = _random_case(3, 6, 15)
    own = choose_verify_lengths(conf, num, lat)
    nan = choose_verify_lengths(conf, num, lat, rate_threshold=torch.tensor(float("nan"), dtype=torch.float64))
    assert torch.equal(own.num_drafts, nan.num_drafts)
    assert torch.allclose(nan.marginal_rate, own.tokens_per_us)
    cheap = choose_verify_lengths(conf, num, lat, rate_threshold=1e-9)
    assert torch.equal(cheap.num_drafts.long(), num) and cheap.marginal_rate.item() == pytest.approx(1e-9)


def test_throughput_tracker():
    from vllm_hybridspec.policy import ThroughputTracker

    t = ThroughputTracker(ema=0.5)
    assert torch.isnan(t.rate)
    t.update(torch.tensor([3, 5]), 100.0)
    assert t.rate.item() == pytest.approx(0.08)
    t.update(4, torch.tensor([50.0, 50.0]))
    assert t.rate.item() == pytest.approx(0.06)
    with pytest.raises(ValueError, match="ema"):
        ThroughputTracker(ema=0)


def test_convexified_table_is_the_lower_hull():
    from vllm_hybridspec.latency_profile import LatencyProfile

    t = [[100, 200, 210, 220, 400]]
    lat = VerifyLatencyModel(LatencyProfile("d", "m", "v", [1], [1, 2, 3, 4, 5], t), 1, 5, convexify=True)
    row = [lat.verify_us(1, float(x)).item() for x in range(1, 6)]
    assert row == pytest.approx([100, 140, 180, 220, 400])


def test_extremes(profile):
    lat = _model(profile)
    ones, zeros = torch.ones(4, 15), torch.zeros(4, 15)
    full = torch.full((4,), 15)
    assert choose_verify_lengths(ones, full, lat).num_drafts.tolist() == [15] * 4
    assert choose_verify_lengths(zeros, full, lat).num_drafts.tolist() == [0] * 4
    assert choose_verify_lengths(zeros, full, lat, min_drafts=2).num_drafts.tolist() == [2] * 4
    assert choose_verify_lengths(ones, torch.tensor([0, 3, 15, 7]), lat, max_drafts=5).num_drafts.tolist() == [0, 3, 5, 5]


def test_steeper_cost_verifies_less(profile):
    conf, num = _random_case(11, 8, 15)
    cheap = VerifyLatencyModel(profile, 8, 16, overhead_us=20000.0)
    dear = VerifyLatencyModel(profile, 8, 16, overhead_us=0.0)
    assert choose_verify_lengths(conf, num, cheap).num_drafts.sum() >= choose_verify_lengths(conf, num, dear).num_drafts.sum()


@pytest.mark.parametrize("seed", range(20))
def test_admission_is_a_stopping_time(profile, seed):
    """Admitting position m of a request never depends on that request's confidences at positions > m
    (nor, therefore, on the draft tokens those were computed from)."""
    g = torch.Generator().manual_seed(seed)
    lat = _model(profile)
    batch, k = 6, 15
    conf = torch.rand(batch, k, generator=g) ** 0.4
    num = torch.full((batch,), k)
    base = choose_verify_lengths(conf, num, lat).num_drafts
    b = int(torch.randint(0, batch, (1,), generator=g))
    fixed_rate = 0.8 * float(choose_verify_lengths(conf, num, lat).tokens_per_us)
    base_fixed = choose_verify_lengths(conf, num, lat, rate_threshold=fixed_rate).num_drafts
    for m in range(k - 1):
        changed = conf.clone()
        changed[b, m + 1:] = torch.rand(k - m - 1, generator=g)
        other = choose_verify_lengths(changed, num, lat).num_drafts
        assert min(int(base[b]), m + 1) == min(int(other[b]), m + 1)
        other = choose_verify_lengths(changed, num, lat, rate_threshold=fixed_rate).num_drafts
        assert min(int(base_fixed[b]), m + 1) == min(int(other[b]), m + 1)


def test_bad_inputs_raise(profile):
    lat = _model(profile, max_batch=8)
    conf, num = torch.rand(4, 15), torch.full((4,), 15)
    with pytest.raises(ValueError, match="confidences must be"):
        choose_verify_lengths(conf[0], num, lat)
    with pytest.raises(ValueError, match="floating point"):
        choose_verify_lengths(torch.ones(4, 15, dtype=torch.int64), num, lat)
    with pytest.raises(ValueError, match="num_drafts must be"):
        choose_verify_lengths(conf, num[:3], lat)
    with pytest.raises(ValueError, match="integer"):
        choose_verify_lengths(conf, num.float(), lat)
    with pytest.raises(ValueError, match="max_batch"):
        choose_verify_lengths(torch.rand(9, 15), torch.full((9,), 15), lat)
    with pytest.raises(ValueError, match="max_len"):
        choose_verify_lengths(torch.rand(4, 16), torch.full((4,), 16), lat)
    with pytest.raises(ValueError, match="padded_weight"):
        choose_verify_lengths(conf, num, lat, padded_weight=2.0)
    with pytest.raises(ValueError, match="min_drafts"):
        choose_verify_lengths(conf, num, lat, min_drafts=4, max_drafts=2)
    with pytest.raises(ValueError, match="budget_confidences"):
        vllm_adaptive_lengths(conf, num, lat, budget_confidences=conf[:2])


@pytest.mark.parametrize("batch,k", [(1, 1), (1, 15), (3, 5), (7, 15), (33, 7), (64, 15)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookahead_and_floor_match_naive_reference(profile, batch, k, seed):
    lat = _model(profile, k=k)
    conf, num = _random_case(seed, batch, k)
    last_round = torch.rand(batch, k, generator=torch.Generator().manual_seed(seed + 50)) ** 0.3
    rate = float(choose_verify_lengths(conf, num, lat).tokens_per_us)
    for kwargs in ({"lookahead": True}, {"lookahead": True, "forecast_confidences": last_round},
                   {"lookahead": True, "forecast_confidences": last_round, "rate_threshold": 0.7 * rate},
                   {"lookahead": True, "min_drafts": 2, "max_drafts": 9}, {"budget_floor": 5},
                   {"lookahead": True, "forecast_confidences": last_round, "budget_floor": 3}):
        got = choose_verify_lengths(conf, num, lat, **kwargs).num_drafts.tolist()
        naive_kwargs = {**kwargs, **({"forecast_confidences": last_round.tolist()}
                                     if "forecast_confidences" in kwargs else {})}
        want = naive_choose_verify_lengths(conf.tolist(), num.tolist(), lambda x: float(lat.round_us(batch, x)),
                                           **naive_kwargs)
        assert got == want, kwargs
    for kwargs in ({}, {"min_drafts": 2}, {"max_drafts": 3}):
        got = int(prefix_scan_budget(conf, num, lat, **kwargs))
        assert got == naive_prefix_scan_budget(conf.tolist(), num.tolist(), lambda x: float(lat.round_us(batch, x)),
                                               **kwargs), kwargs


def _stepped_model(batch, rows):
    """A profile whose row at `batch` is `rows` (L = 1..len): shapes a greedy admission handles badly."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    lengths = list(range(1, len(rows) + 1))
    return VerifyLatencyModel(LatencyProfile("d", "m", "v", [batch], lengths, [rows]), batch, len(rows))


def test_lookahead_passes_a_step_greedy_stops_at():
    """T jumps at L = 3 -> 4 (a kernel switch) and is flat behind it: verifying all 7 drafts is worth it, yet
    the next pair alone never pays for the jump."""
    lat = _stepped_model(1, [1000, 1050, 1100, 1600, 1610, 1620, 1630, 1640])
    conf, num = torch.full((1, 7), 0.9), torch.tensor([7])
    greedy = choose_verify_lengths(conf, num, lat).num_drafts.item()
    ahead = choose_verify_lengths(conf, num, lat, lookahead=True, forecast_confidences=conf).num_drafts.item()
    assert greedy == 2 and ahead == 7
    rate = lambda n: float(choose_verify_lengths(conf, num, lat, min_drafts=n, max_drafts=n).tokens_per_us)
    assert rate(7) > rate(2)


def test_lookahead_on_a_concave_cost_reaches_the_cheap_tail():
    """Concave T (unique experts saturate at large batch): the first tokens are dear, the later ones cheap."""
    batch = 4
    lat = _stepped_model(batch, [1000 + 3000 * (1 - 0.6 ** (n - 1)) for n in range(1, 17)])
    conf, num = torch.full((batch, 15), 0.93), torch.full((batch,), 15)
    greedy = choose_verify_lengths(conf, num, lat).num_drafts
    ahead = choose_verify_lengths(conf, num, lat, lookahead=True, forecast_confidences=conf).num_drafts
    rate = lambda n: float(choose_verify_lengths(conf, num, lat, min_drafts=int(n.max()),
                                                 max_drafts=int(n.max())).tokens_per_us)
    assert int(greedy.sum()) < int(ahead.sum())
    assert rate(ahead) > rate(greedy)


def test_lookahead_still_stops_when_nothing_later_pays():
    """Hopeless drafts: no later stop beats verifying none, whatever T looks like."""
    lat = _stepped_model(1, [1000, 1400, 1800, 2200, 2600])
    conf, num = torch.full((1, 4), 0.05), torch.tensor([4])
    assert choose_verify_lengths(conf, num, lat, lookahead=True).num_drafts.item() == 0


def test_prefix_scan_finds_the_global_best_prefix():
    lat = _stepped_model(1, [1000, 1050, 1100, 1600, 1610, 1620, 1630, 1640])
    conf, num = torch.full((1, 7), 0.9), torch.tensor([7])
    assert int(prefix_scan_budget(conf, num, lat)) == 7
    assert int(prefix_scan_budget(torch.zeros(1, 7), num, lat)) == 0
    assert int(prefix_scan_budget(torch.zeros(1, 7), num, lat, min_drafts=2)) == 2


@pytest.mark.parametrize("seed", range(12))
def test_lookahead_admission_is_a_stopping_time(profile, seed):
    """As test_admission_is_a_stopping_time, for the lookahead (with last round's forecast) and a floor."""
    g = torch.Generator().manual_seed(seed)
    lat = _model(profile)
    batch, k = 6, 15
    conf = torch.rand(batch, k, generator=g) ** 0.4
    last_round = torch.rand(batch, k, generator=g) ** 0.3
    num = torch.full((batch,), k)
    kwargs = dict(lookahead=True, forecast_confidences=last_round,
                  budget_floor=prefix_scan_budget(last_round, num, lat))
    base = choose_verify_lengths(conf, num, lat, **kwargs).num_drafts
    b = int(torch.randint(0, batch, (1,), generator=g))
    for m in range(k - 1):
        changed = conf.clone()
        changed[b, m + 1:] = torch.rand(k - m - 1, generator=g)
        other = choose_verify_lengths(changed, num, lat, **kwargs).num_drafts
        assert min(int(base[b]), m + 1) == min(int(other[b]), m + 1)


def test_lookahead_bad_inputs_raise(profile):
    lat = _model(profile, max_batch=8)
    conf, num = torch.rand(4, 15), torch.full((4,), 15)
    with pytest.raises(ValueError, match="padded_weight = 0"):
        choose_verify_lengths(conf, num, lat, lookahead=True, padded_weight=0.5)
    with pytest.raises(ValueError, match="forecast_confidences must match"):
        choose_verify_lengths(conf, num, lat, lookahead=True, forecast_confidences=conf[:2])
    with pytest.raises(ValueError, match="min_drafts"):
        prefix_scan_budget(conf, num, lat, min_drafts=3, max_drafts=1)
