import math

import pytest
import torch

from vllm_hybridspec.latency_profile import LatencyProfile
from vllm_hybridspec.policy import OnlineAcceptanceCalibrator, VerifyLatencyModel, max_prob_log_odds
from policy_fixtures import one_thread, profile  # noqa: F401  (pytest fixtures)


def test_max_prob_log_odds_matches_direct_formula():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 33, generator=g) * 3
    probs = logits.softmax(-1).double()
    top = probs.max(-1).values
    want = torch.log(top / (1 - top))
    assert torch.allclose(max_prob_log_odds(logits).double(), want, atol=1e-4)
    t = torch.tensor([0.5, 1.0, 2.0, 0.0, 1.0])
    scaled = (logits / torch.where(t > 0, t, torch.ones_like(t))[:, None, None]).softmax(-1).double().max(-1).values
    assert torch.allclose(max_prob_log_odds(logits, t).double(), torch.log(scaled / (1 - scaled)), atol=1e-4)
    one_hot = torch.full((1, 4), -1e9)
    one_hot[0, 2] = 0
    assert max_prob_log_odds(one_hot).item() == 40.0


def test_calibrator_learns_per_position_mapping():
    g = torch.Generator().manual_seed(1)
    k, batch = 6, 64
    true_slope = torch.linspace(1.5, 0.6, k)
    true_bias = torch.linspace(0.5, -1.0, k)
    cal = OnlineAcceptanceCalibrator(k, refit_interval=10, damping=20.0)
    for _ in range(1500):
        f = torch.randn(batch, k, generator=g) * 2
        c = torch.sigmoid(true_slope * f + true_bias)
        accept = torch.rand(batch, k, generator=g) < c
        num_verified = torch.randint(1, k + 1, (batch,), generator=g)
        run = torch.cumprod(accept.long(), -1).sum(-1)
        cal.observe(f, num_verified, torch.minimum(run, num_verified))
    f = torch.randn(4096, k, generator=g) * 2
    err = (cal.predict(f) - torch.sigmoid(true_slope * f + true_bias)).abs().mean(0)
    # Deep positions see far fewer outcomes (a draft is labelled only if every earlier one was accepted).
    assert (err < 0.05).all(), err


def test_calibrator_bad_inputs():
    cal = OnlineAcceptanceCalibrator(4)
    with pytest.raises(ValueError, match="K=4"):
        cal.predict(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="num_verified"):
        cal.observe(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="num_positions"):
        OnlineAcceptanceCalibrator(0)


def test_latency_model_interpolates_the_profile(profile):
    lat = VerifyLatencyModel(profile, 64, 17, overhead_us=100.0)
    for b in (1, 5, 8, 20, 32):
        for x in (1.0, 2.5, 9.0, 16.75, 17.0):
            want = profile.interpolate(b, x)
            assert lat.verify_us(b, x).item() == pytest.approx(want, rel=1e-9)
            assert lat.round_us(b, x).item() == pytest.approx(100.0 + want, rel=1e-9)
    # Beyond the table the length is clamped to max_len.
    assert lat.verify_us(1, 40.0).item() == pytest.approx(profile.interpolate(1, 17))


def test_latency_model_is_monotone_even_if_the_profile_is_not():
    t = [[100, 90, 120, 110, 150]]
    lat = VerifyLatencyModel(LatencyProfile("d", "m", "v", [1], [1, 2, 3, 4, 5], t), 1, 5)
    row = [lat.verify_us(1, float(x)).item() for x in range(1, 6)]
    assert row == [100, 100, 120, 120, 150]


def test_online_correction_converges(profile):
    lat = VerifyLatencyModel(profile, 8, 16, ema=0.2)
    for _ in range(60):
        predicted = lat.verify_us(4, 6.0)
        lat.observe(predicted, 1.3 * predicted)
    assert lat.correction().item() == pytest.approx(1.3, rel=1e-3)
    # One wild outlier moves it by a bounded amount only.
    before = lat.correction().item()
    lat.observe(lat.verify_us(4, 6.0), 1e9)
    assert lat.correction().item() < before * math.exp(0.2) + 1e-9


def test_latency_model_bad_inputs(profile):
    with pytest.raises(ValueError, match="max_batch"):
        VerifyLatencyModel(profile, 0, 16)
    with pytest.raises(ValueError, match="ema"):
        VerifyLatencyModel(profile, 4, 16, ema=0.0)
    with pytest.raises(ValueError, match="overhead_us"):
        VerifyLatencyModel(profile, 4, 16, overhead_us=[1.0, 2.0])
    with pytest.raises(ValueError, match="overhead_us must be >= 0"):
        VerifyLatencyModel(profile, 4, 16, overhead_us=-1.0)
    lat = VerifyLatencyModel(profile, 4, 16, overhead_us=lambda b: 10.0 * b)
    assert lat.overhead_us[3].item() == 30.0
    with pytest.raises(ValueError, match="outside"):
        lat.verify_us(5, 2.0)
