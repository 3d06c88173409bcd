"""README's Results section is generated from eval/results/*.json and must match them."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_match_recorded_runs():
    script = ROOT / "eval" / "render_readme_results.py"
    proc = subprocess.run([sys.executable, "-P", str(script), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
