"""Shared fixtures for the policy / routing / simulator tests (a plain module, not a conftest.py: the
tests folders have no __init__.py, so a second conftest module would shadow tests/conftest.py's helpers).
Test modules import the fixtures they use by name.

The latency profile here is SYNTHETIC (a smooth made-up T(batch, L) with the hybrid target's qualitative
shape: GDN and MoE time growing with L, MoE time following unique experts). It exists only to exercise the
code; no result file is ever produced from it.
"""
from __future__ import annotations

import math

import pytest
import torch

from vllm_hybridspec.latency_profile import LatencyProfile

NUM_EXPERTS, TOP_K, MOE_LAYERS = 256, 8, 40


@pytest.fixture(autouse=True)
def one_thread():
    """These tests move small tensors; with several OpenMP threads on a shared 2-core machine each op can
    wait on busy cores for milliseconds. One thread is faster here (restored afterwards for other suites)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def synthetic_unique_experts(batch: int, length: int, pool: float = 96.0) -> float:
    """Mean distinct experts per layer for batch x length tokens: each request draws from its own
    correlated pool of `pool` experts; requests overlap through the 256 experts."""
    per_request = pool * (1.0 - (1.0 - TOP_K / pool) ** length)
    return NUM_EXPERTS * (1.0 - (1.0 - per_request / NUM_EXPERTS) ** batch)


def synthetic_profile(variant: str = "ours", gdn_per_token_us: float = 60.0) -> LatencyProfile:
    batch_sizes, lengths = [1, 8, 32], list(range(1, 18))
    parts = {k: [] for k in ("gdn", "attention", "moe", "rest")}
    unique, total = [], []
    for b in batch_sizes:
        rows = {k: [] for k in parts}
        u_row, t_row = [], []
        for length in lengths:
            u = synthetic_unique_experts(b, length)
            rows["gdn"].append(30 * (40.0 + gdn_per_token_us * length * (1 + 0.1 * math.log(b))) / 10)
            rows["attention"].append(10 * (15.0 + 0.4 * b * length))
            rows["moe"].append(MOE_LAYERS * (30.0 + 1.6 * u))
            rows["rest"].append(300.0 + 2.0 * b * length)
            u_row.append(u)
            t_row.append(sum(r[-1] for r in rows.values()))
        for k in parts:
            parts[k].append(rows[k])
        unique.append(u_row)
        total.append(t_row)
    return LatencyProfile(
        device="synthetic", model="synthetic_35b_a3b", variant=variant, batch_sizes=batch_sizes,
        lengths=lengths, t_us=total, per_layer_type=parts, unique_experts=unique, meta={"synthetic": True},
    )


@pytest.fixture(scope="session")
def profile() -> LatencyProfile:
    return synthetic_profile()


def synthetic_profile_file(path) -> str:
    """A multi-variant SYNTHETIC profile file (baseline / ours / ours_probe) for simulator smoke tests."""
    from vllm_hybridspec.latency_profile import save_profiles

    base = synthetic_profile("baseline", gdn_per_token_us=150.0)
    ours = synthetic_profile("ours", gdn_per_token_us=40.0)
    probe = synthetic_profile("ours_probe", gdn_per_token_us=40.0)
    probe.t_us = [[t + 120.0 + 3.0 * b for t in row] for b, row in zip(probe.batch_sizes, probe.t_us)]
    save_profiles(path, [base, ours, probe], default_variant="ours_probe")
    return str(path)
