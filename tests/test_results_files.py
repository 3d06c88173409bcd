"""Every benchmark result under eval/results/ carries its provenance (the developers' guide: bench, device, commit,
date, command, rows, summary) and a Markdown table beside it. The latency profiles there are policy inputs (a
LatencyProfile file each), not benchmark outputs; their provenance is in verify_profile.json."""
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "eval" / "results"
REQUIRED = ("bench", "device", "commit", "date", "command", "rows", "summary")
BENCH_FILES = sorted(p for p in RESULTS.glob("*.json") if not p.name.startswith("latency_profile_"))


def test_there_are_results():
    assert len(BENCH_FILES) >= 5


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: p.stem)
def test_result_has_provenance_and_table(path):
    doc = json.loads(path.read_text())
    missing = [key for key in REQUIRED if key not in doc]
    assert not missing, f"{path.name} lacks {missing}"
    assert doc["bench"] == path.stem
    assert doc["commit"] and doc["commit"] != "unknown" and doc["device"] and doc["command"]
    assert path.with_suffix(".md").exists(), f"{path.name} has no Markdown table beside it"
