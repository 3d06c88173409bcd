"""eval/record_tiny_traces.py on a real tiny engine (MRV2 shim, CPU): the hooks pair each request's confidences
with the acceptance of the same drafts, and simulate's loader reads the file back."""
import json

import pytest

from eval_modules import load_eval_module

pytestmark = pytest.mark.e2e

_load = load_eval_module


def test_recorded_rounds_match_the_engine_metrics(tiny_models, tmp_path):
    record = _load("record_tiny_traces")
    out = tmp_path / "traces.jsonl"
    meta = record.main(["--prompts", "2", "--max-tokens", "12", "--drafters", "dflash", "--out", str(out),
                        "--work", str(tmp_path / "work")])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["meta"]["num_drafts"] == record.K
    rows = lines[1:]
    assert rows and all(row["drafter"] == "dflash" and len(row["confidences"]) == record.K for row in rows)
    assert all(0 <= row["accepted"] <= record.K for row in rows)
    assert all(0.0 <= c <= 1.0 for row in rows for c in row["confidences"])
    # Every recorded round is one verified proposal: never more rounds or accepted drafts than vLLM counted.
    metrics = meta["engines"]["dflash"]["metrics"]
    assert len(rows) <= metrics["drafts"]
    assert sum(row["accepted"] for row in rows) <= metrics["accepted_tokens"]
    am = _load("acceptance_models")
    trace = am.trace_from_recorded(am.load_recorded_traces(out, 15), 6, 2, 15)
    assert trace.num_drafts == record.K
