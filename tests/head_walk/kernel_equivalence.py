"""Child-process tests (run by test_walk_unit.py under `mrv2_env()`): the megakernel, under the Triton
interpreter, walks exactly as vLLM's `_sample_sequential` does, greedy and with vLLM's seeded Gumbel sampling.

Not collected by the main pytest run (the name does not start with test_): vLLM decides at import whether it has
Triton, and only the MRV2 shim (tests/mrv2_shim, on PYTHONPATH here) makes vLLM's own sampler kernels run on CPU.
Run alone with: PYTHONPATH=tests/mrv2_shim TRITON_INTERPRET=1 .venv/bin/pytest tests/head_walk/kernel_equivalence.py

Dyadic weights make every dot product exact, so drafts, the draft logits cache, acceptance estimates and
confidences must match bit for bit; with Gaussian weights the kernel's summation order may move a logit by an
ulp, so the drafts must match and the cache to 1e-5 relative.
"""
import copy
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("HYBRIDSPEC_MRV2_SHIM") != "1":
    pytest.skip("needs mrv2_env(): TRITON_INTERPRET=1 and tests/mrv2_shim on PYTHONPATH", allow_module_level=True)

from head_walk_fakes import make_speculator, move_requests, run_walk  # noqa: E402

from vllm_hybridspec import status  # noqa: E402
from vllm_hybridspec.head_walk import walk  # noqa: E402

MEGAKERNEL = {"enabled": True, "head_walk": "megakernel"}


@pytest.fixture(autouse=True)
def fresh_status():
    status.reset()
    yield


def count_launches(monkeypatch, module, name):
    """Launches of module.name from now on (each its first argument's shape): proves which kernel walked."""
    calls = []
    launch = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return launch(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture
def kernel_calls(monkeypatch):
    """Launches of hybridspec_kernels.head_walk.head_walk (the kernel, not vLLM, walked)."""
    import hybridspec_kernels.head_walk as kernels

    return count_launches(monkeypatch, kernels, "head_walk")


@pytest.fixture
def topk_calls(monkeypatch):
    """Launches of hybridspec_kernels.head_walk_topk.head_walk_topk."""
    import hybridspec_kernels.head_walk_topk as kernels

    return count_launches(monkeypatch, kernels, "head_walk_topk")


def assert_same_walk(want, got, exact):
    assert torch.equal(got.tokens, want.tokens), f"drafts differ\n vLLM {want.tokens}\n ours {got.tokens}"
    for name in ("cache", "features", "predictions", "confidence"):
        if not hasattr(want, name):
            continue
        a, b = getattr(want, name), getattr(got, name)
        if exact:
            assert torch.equal(a, b), f"{name} differs by {(a.float() - b.float()).abs().nan_to_num().max()}"
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{name} differs")


CASES = [
    pytest.param({}, id="greedy"),
    pytest.param({"sampled": True}, id="sampled"),
    pytest.param({"sampled": True, "reduced_vocab": True}, id="sampled-d2t"),
    pytest.param({"reduced_vocab": True}, id="greedy-d2t"),
    pytest.param({"sampled": True, "padding_rows": 2, "confidence": True}, id="sampled-padding-confidence"),
    pytest.param({"sampled": True, "estimator": True}, id="sampled-estimator"),
    pytest.param({"estimator": True, "reduced_vocab": True}, id="greedy-estimator-d2t"),
    pytest.param({"sampled": True, "dtype": torch.float16, "logit_scale": 0.75}, id="sampled-fp16-scaled"),
    pytest.param({"sampled": True, "num_reqs": 5, "num_steps": 7, "vocab": 1031, "rank": 32, "reduced_vocab": True},
                 id="sampled-odd-sizes"),
    pytest.param({"num_steps": 1}, id="one-step"),
]


@pytest.mark.parametrize("options", CASES)
def test_megakernel_walk_equals_vllms_bit_for_bit(options, kernel_calls):
    spec = make_speculator(hybridspec=MEGAKERNEL, **options)
    want, got = run_walk(spec, ours=False), run_walk(spec, ours=True)
    assert_same_walk(want, got, exact=True)
    assert status.get(walk.COMPONENT).state == status.ACTIVE
    plan = getattr(got.spec, walk.PLAN_ATTRIBUTE)
    per_step = options.get("sampled") and not plan.step_keyed_seeds
    assert len(kernel_calls) == (spec.num_speculative_steps if per_step else 1), kernel_calls


TOPK_CASES = [
    pytest.param({"topk": 8}, id="greedy"),
    pytest.param({"topk": 8, "sampled": True}, id="sampled"),
    pytest.param({"topk": 8, "sampled": True, "reduced_vocab": True}, id="sampled-d2t"),
    pytest.param({"topk": 6, "reduced_vocab": True, "estimator": True}, id="greedy-estimator-d2t"),
    pytest.param({"topk": 8, "sampled": True, "padding_rows": 2, "confidence": True}, id="sampled-padding-confidence"),
    pytest.param({"topk": 8, "sampled": True, "estimator": True}, id="sampled-estimator"),
    pytest.param({"topk": 70, "sampled": True, "dtype": torch.float16, "logit_scale": 0.75}, id="sampled-fp16-scaled"),
    pytest.param({"topk": 100, "sampled": True, "num_reqs": 5, "num_steps": 7, "vocab": 1031, "rank": 32,
                  "reduced_vocab": True}, id="sampled-two-chunks-d2t"),
    pytest.param({"topk": 4, "num_steps": 1}, id="one-step"),
]


@pytest.mark.parametrize("options", TOPK_CASES)
def test_topk_walk_equals_vllms_bit_for_bit_across_steps(options, topk_calls, kernel_calls):
    """vLLM's top-k mode (dspark_draft_topk), two engine steps in a row with the requests moved to other slots: the
    second walk's cache rows are vLLM's dense top-k rows again (the first walk's columns put back to -inf)."""
    spec = make_speculator(hybridspec=MEGAKERNEL, **options)
    theirs, ours = copy.deepcopy(spec), copy.deepcopy(spec)
    for step in range(2):
        if step:
            move_requests(theirs, seed=step)
            move_requests(ours, seed=step)
        want, got = run_walk(theirs, ours=False, copy_spec=False), run_walk(ours, ours=True, copy_spec=False)
        assert_same_walk(want, got, exact=True)
    assert status.get(walk.COMPONENT).state == status.ACTIVE
    assert "top-k walk" in status.get(walk.COMPONENT).reason
    plan = getattr(ours, walk.PLAN_ATTRIBUTE)
    per_step = options.get("sampled") and not plan.step_keyed_seeds
    assert len(topk_calls) == 2 * (spec.num_speculative_steps if per_step else 1), topk_calls
    assert not kernel_calls  # the full-vocabulary walk never ran


def test_topk_walk_with_gaussian_weights(topk_calls):
    spec = make_speculator(hybridspec=MEGAKERNEL, dyadic=False, topk=12, sampled=True, reduced_vocab=True, seed=8)
    assert_same_walk(run_walk(spec, ours=False), run_walk(spec, ours=True), exact=False)


@pytest.fixture
def vllm_033_draft_seeds(monkeypatch):
    """vLLM 0.33 mixes the step into every draft draw's seed (`spec_step_seed(seed, col)` inside its Gumbel
    kernel); emulated here on 0.32 by mixing it into the seeds handed to that kernel, so that the walk takes its
    one-launch path (the one GPUs run) against vLLM's loop keyed the 0.33 way."""
    import vllm.v1.worker.gpu.spec_decode.dspark.speculator as module
    from vllm.v1.worker.gpu.sample import gumbel

    if hasattr(gumbel, "spec_step_seed"):
        return
    sample = module.gumbel_sample

    def gumbel_sample_033(logits, idx_mapping, temperature, seeds, pos, *args, logits_cache_col=None, **kwargs):
        step_seeds = seeds ^ (logits_cache_col.long() << 32)
        return sample(logits, idx_mapping, temperature, step_seeds, pos, *args, logits_cache_col=logits_cache_col,
                      **kwargs)

    monkeypatch.setattr(module, "gumbel_sample", gumbel_sample_033)
    monkeypatch.setattr(gumbel, "spec_step_seed", lambda seed, step: seed ^ (step << 32), raising=False)


@pytest.mark.parametrize("options", [
    pytest.param({"sampled": True}, id="sampled"),
    pytest.param({"sampled": True, "reduced_vocab": True, "padding_rows": 1, "num_steps": 7}, id="sampled-d2t"),
])
def test_one_launch_walk_equals_vllm_033_seed_keying(options, vllm_033_draft_seeds, kernel_calls):
    spec = make_speculator(hybridspec=MEGAKERNEL, **options)
    assert_same_walk(run_walk(spec, ours=False), run_walk(spec, ours=True), exact=True)
    assert len(kernel_calls) == 1, kernel_calls


@pytest.mark.parametrize("options", [
    pytest.param({"topk": 8, "sampled": True}, id="sampled"),
    pytest.param({"topk": 8, "sampled": True, "reduced_vocab": True, "padding_rows": 1, "num_steps": 7},
                 id="sampled-d2t"),
])
def test_one_launch_topk_walk_equals_vllm_033_seed_keying(options, vllm_033_draft_seeds, topk_calls):
    spec = make_speculator(hybridspec=MEGAKERNEL, **options)
    assert_same_walk(run_walk(spec, ours=False), run_walk(spec, ours=True), exact=True)
    assert len(topk_calls) == 1, topk_calls


@pytest.mark.parametrize("options", [
    pytest.param({"sampled": True, "seed": 5}, id="sampled"),
    pytest.param({"sampled": True, "reduced_vocab": True, "estimator": True, "seed": 6}, id="sampled-d2t-estimator"),
    pytest.param({"seed": 7, "num_reqs": 4, "vocab": 500, "rank": 64}, id="greedy"),
])
def test_megakernel_walk_with_gaussian_weights(options):
    spec = make_speculator(hybridspec=MEGAKERNEL, dyadic=False, **options)
    assert_same_walk(run_walk(spec, ours=False), run_walk(spec, ours=True), exact=False)


@pytest.mark.parametrize("options", [pytest.param({}, id="greedy"), pytest.param({"sampled": True}, id="sampled")])
def test_reference_walk_equals_vllms_sampled_walk(options):
    spec = make_speculator(hybridspec={"enabled": True, "head_walk": "reference"}, padding_rows=1, **options)
    assert_same_walk(run_walk(spec, ours=False), run_walk(spec, ours=True), exact=True)
    assert status.get(walk.COMPONENT).state == status.REFERENCE


def test_seeded_draws_are_draws():
    """Sampled drafts follow the seeds: other seeds give other drafts, the same seeds the same ones."""
    spec = make_speculator(hybridspec=MEGAKERNEL, sampled=True, num_reqs=4, num_steps=6)
    spec.temperature.fill_(1.0)
    first, again = run_walk(spec, ours=True), run_walk(spec, ours=True)
    spec.seeds.add_(1)
    other = run_walk(spec, ours=True)
    assert torch.equal(first.tokens, again.tokens) and not torch.equal(first.tokens, other.tokens)


def test_nan_base_logits_keep_drafts_inside_the_vocabulary():
    """vLLM's profile run walks uninitialised memory: NaN rows must not make the kernel propose an id past the
    vocabulary (its next step would gather W1 out of bounds); rows without NaN still equal vLLM's."""
    spec = make_speculator(hybridspec=MEGAKERNEL, sampled=True, num_reqs=3, reduced_vocab=True)
    compute = spec.model.compute_draft_logits

    def with_nan_rows(hidden):
        logits = compute(hidden)
        logits[: spec.num_speculative_steps] = float("nan")  # request row 0: every step
        logits[spec.num_speculative_steps, 5] = float("nan")  # request row 1, step 0: one entry
        return logits

    spec.model.compute_draft_logits = with_nan_rows
    want, got = run_walk(spec, ours=False), run_walk(spec, ours=True)
    d2t = spec.model.draft_id_to_target_id
    targets = set((torch.arange(d2t.shape[0]) + d2t).tolist())
    assert set(got.tokens.flatten().tolist()) <= targets, got.tokens
    assert torch.equal(got.tokens[2:], want.tokens[2:])


def test_patched_method_walks_with_the_megakernel(kernel_calls):
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from vllm_hybridspec.head_walk.patches import UseHybridSpecHeadWalk

    spec = make_speculator(hybridspec=MEGAKERNEL, sampled=True)
    want = run_walk(spec, ours=False)
    UseHybridSpecHeadWalk.apply()
    try:
        DSparkSpeculator._sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    finally:
        UseHybridSpecHeadWalk.revert()
    assert kernel_calls and torch.equal(spec.draft_tokens[: spec._test_rows], want.tokens)
