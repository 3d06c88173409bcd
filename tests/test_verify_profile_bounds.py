"""eval/verify_profile_bounds.py: the bounds follow from the profile's own breakdown, on a synthetic profile."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("verify_profile_bounds", REPO / "eval" / "verify_profile_bounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(variant, n, gdn, moe, other=100.0):
    return {"variant": variant, "rho": 0.5, "batch": 1, "L": n, "gdn_us": gdn, "moe_us": moe,
            "t_us": gdn + moe + other}


def test_bounds_remove_gdn_and_price_moe_one_token_shorter():
    rows = [_row("baseline", n, 40.0 * n, 10.0 * n) for n in (3, 4, 15, 16)]
    rows += [_row("ours", n, 5.0, 10.0 * n) for n in (3, 4, 15, 16)]
    bounds = _module().bounds_for(rows, 0.5, "toy")
    assert bounds["measured_verify_speedup_L16_b1"] == round((640 + 160 + 100) / (5 + 160 + 100), 4)
    assert bounds["gdn_free_verify_speedup_L16_b1"] == round(900 / 260, 4)
    assert bounds["gdn_free_ours_growth_4_to_16"] == round(260 / 140 - 1, 4)
    assert bounds["gdn_free_moe_minus_one_verify_speedup_L16_b1"] == round(900 / 250, 4)


def test_committed_bounds_match_the_committed_profile(tmp_path, monkeypatch):
    module = _module()
    monkeypatch.setattr("sys.argv", ["verify_profile_bounds.py", "--profile",
                                     str(REPO / "eval/results/verify_profile.json"), "--out", str(tmp_path)])
    module.main()
    fresh = json.loads((tmp_path / "verify_profile_bounds.json").read_text())
    committed = json.loads((REPO / "eval/results/verify_profile_bounds.json").read_text())
    assert fresh["rows"] == committed["rows"] and fresh["summary"] == committed["summary"]
