"""The CUDA path's plumbing (kernel verify per layer, one reconstruct per KV-cache group) on CPU under the
Triton interpreter, in a subprocess so that TRITON_INTERPRET=1 precedes every triton import."""
import subprocess
import sys
from pathlib import Path

from conftest import base_env


def test_kernel_path_matches_naive_reference(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("kernel_path_job.py"))],
        env=base_env(TRITON_INTERPRET="1"), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
