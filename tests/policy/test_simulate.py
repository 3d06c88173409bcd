"""Smoke tests of eval/simulate.py and eval/acceptance_models.py on a SYNTHETIC profile (no results written
to eval/results)."""
import json

import pytest
import torch

from eval_modules import load_eval_module
from policy_fixtures import one_thread, synthetic_profile_file  # noqa: F401  (one_thread: a pytest fixture)

_load = load_eval_module


@pytest.fixture(scope="module")
def am():
    return _load("acceptance_models")


def test_fitted_models_reproduce_published_tau(am):
    models = am.fit_task_models(15)
    assert set(models) == set(am.TASKS)
    for task, model in models.items():
        assert model.tau(15) == pytest.approx(am.PUBLISHED["dflash_b16_tau"][task], abs=1e-6)
    trace = am.draw_trace(models["gsm8k"], 4000, 4, 15, persistence=0.5, feature_noise=1.0,
                          generator=torch.Generator().manual_seed(0))
    empirical = 1 + trace.accepted_all.float().mean().item()
    assert empirical == pytest.approx(am.PUBLISHED["dflash_b16_tau"]["gsm8k"], rel=0.03)


def test_shape_fit_matches_the_profile(am):
    mu, kappa, decay = am.fit_shape(am.PUBLISHED["dflash_position_survival"])
    fitted = am.AcceptanceModel(mu, kappa, decay).survival(7)
    for a, b in zip(fitted, am.PUBLISHED["dflash_position_survival"]):
        assert a == pytest.approx(b, rel=0.06)


def test_recorded_traces_roundtrip(am, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"request": i % 2, "accepted": i % 16, "confidences": [0.5] * 15})
                              for i in range(10)))
    rows = am.load_recorded_traces(path, 15)
    trace = am.trace_from_recorded(rows, 7, 3, 15)
    assert trace.accepted_all.shape == (7, 3) and trace.true_conf.shape == (7, 3, 15)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"accepted": 1, "confidences": [0.5] * 16}))
    with pytest.raises(ValueError, match="confidences"):
        am.load_recorded_traces(bad, 15)
    bad.write_text(json.dumps({"accepted": 4, "confidences": [0.5] * 3}))
    with pytest.raises(ValueError, match="accepted"):
        am.load_recorded_traces(bad, 15)


def test_short_recordings_replay_with_their_own_k(am, tmp_path):
    """A tiny run records K = 4 drafts: the replay never verifies more than 4 (meta lines are skipped)."""
    path = tmp_path / "t.jsonl"
    lines = [json.dumps({"meta": {"command": "x"}})]
    lines += [json.dumps({"drafter": "dflash", "accepted": i % 5, "confidences": [0.9, 0.8, 0.7, 0.6]})
              for i in range(10)]
    path.write_text("\n".join(lines))
    rows = am.load_recorded_traces(path, 15)
    assert len(rows) == 10 and rows[0]["drafter"] == "dflash"
    trace = am.trace_from_recorded(rows, 12, 2, 15)
    assert trace.num_drafts == 4 and int(trace.accepted_all.max()) <= 4
    assert float(trace.true_conf[..., 4:].max()) < 1e-5


def test_simulate_end_to_end_on_synthetic_profile(tmp_path):
    simulate = _load("simulate")
    profile = synthetic_profile_file(tmp_path / "profile.json")
    traces = tmp_path / "t.jsonl"
    traces.write_text("\n".join(json.dumps({"accepted": (7 * i) % 16, "confidences": [0.8] * 15})
                                for i in range(40)))
    out = tmp_path / "out"
    summary = simulate.main(["--profile", profile, "--out", str(out), "--rounds-scale", "0.05", "--warmup", "20",
                             "--no-sensitivity", "--traces", str(traces), "--tasks", "gsm8k", "mt-bench"])
    doc = json.loads((out / "simulate.json").read_text())
    for key in ("bench", "device", "commit", "date", "command", "rows", "summary", "assumptions"):
        assert key in doc
    assert doc["device"] == "synthetic"
    for key in ("speedup_vs_ar_c1", "speedup_vs_fixed_c1", "min_ratio_vs_fixed_c4_to_c64",
                "gain_from_routing_correction_c1"):
        assert isinstance(summary[key], float) and summary[key] > 0
    labels = {f'{r["policy"]}@{r["kernels"]}' for r in doc["rows"]}
    assert labels == {f"{p}@{k}" for p in simulate.POLICIES for k in simulate.KERNELS} - {"ar@ours"}
    assert {r["task"] for r in doc["rows"]} == {"gsm8k", "mt-bench", "recorded"}
    assert "recorded_vs_fixed" in summary
    # The synthetic profile measures batches 1, 8, 32 (as the H200 re-measurement): c64 is extrapolated.
    assert doc["assumptions"]["batch_points"]["c1"] == "measured"
    assert doc["assumptions"]["batch_points"]["c16"].startswith("interpolated between batch 8 and 32")
    assert doc["assumptions"]["batch_points"]["c64"].startswith("EXTRAPOLATED")
    assert summary["extrapolated_concurrency"] == ["c64"]
    c64_points = {r["profile_batch"] for r in doc["rows"] if r["concurrency"] == 64}
    assert c64_points == {doc["assumptions"]["batch_points"]["c64"]}
    assert "EXTRAPOLATED" in (out / "simulate.md").read_text()
    assert (out / "simulate.md").read_text().startswith("# simulate (SIMULATED")
    assert (out / "simulate.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="not found"):
        simulate.main(["--profile", str(tmp_path / "missing.json"), "--out", str(out)])
