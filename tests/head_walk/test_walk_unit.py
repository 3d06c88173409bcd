"""The DSpark walk replacement without an engine: vLLM's own `_sample_sequential` against hybridspec's on a
DSparkSpeculator built from vLLM's real classes (tests/head_walk/head_walk_fakes.py).

In this process: every fallback (declines, logs why, records it), the patch and when it is applied, the pinned
upstream code, and the torch reference walk against vLLM's greedy walk. The megakernel and vLLM's seeded Gumbel
sampling need Triton inside vLLM, which only the Model Runner V2 shim gives, so those comparisons run in a child
pytest (kernel_equivalence.py) under `mrv2_env()`.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO, mrv2_env
from head_walk_fakes import make_speculator, run_walk
from vllm_hybridspec import status
from vllm_hybridspec.head_walk import upstream, walk
from vllm_hybridspec.head_walk.patches import UseHybridSpecHeadWalk

HERE = Path(__file__).resolve().parent
MEGAKERNEL = {"enabled": True, "head_walk": "megakernel"}
REFERENCE = {"enabled": True, "head_walk": "reference"}


@pytest.fixture(autouse=True)
def fresh_status():
    status.reset()
    yield
    status.reset()


@pytest.fixture
def warnings_seen():
    """vLLM's logger does not propagate to the root logger, so listen on ours directly."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("vllm.hybridspec")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture
def kernel_runs_here(monkeypatch):
    """Makes the megakernel's device check pass in this process (whether Triton here interprets or not)."""
    import hybridspec_kernels.head_walk.kernel as kernel

    InterpretedFunction = type("InterpretedFunction", (), {})
    monkeypatch.setattr(kernel, "head_walk_kernel", InterpretedFunction())


# --- upstream code -----------------------------------------------------------------------------------------------

def test_installed_vllm_walk_is_the_one_the_replacement_reproduces():
    from vllm_hybridspec.versions import installed_vllm

    version = installed_vllm()[1].split("+")[0]
    assert version in upstream.KNOWN, f"vLLM {version}: re-read the DSpark walk, then add its digests to upstream.py"
    found = upstream.digests(upstream.installed_vllm_dir())
    found.update(upstream.digests(upstream.installed_vllm_dir(), upstream.TOPK_PINNED))
    changed = [name for name, digest in found.items() if digest != upstream.KNOWN[version][name]]
    assert not changed, f"vLLM {version} changed {changed} since the walk was written against it"
    assert upstream.match_installed() == (version, ()) == upstream.match_installed(upstream.TOPK_PINNED)


def test_patched_method_source_hash_is_pinned():
    """The patched method's `inspect.getsource` hashes to the pinned digest (upstream.py hashes the same text)."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    method = UseHybridSpecHeadWalk.original()
    source = inspect.getsource(method)
    assert source == upstream.source_of(Path(inspect.getsourcefile(DSparkSpeculator)),
                                        "DSparkSpeculator._sample_sequential") + "\n"
    version = upstream.match_installed()[0]
    assert hashlib.sha256(source[:-1].encode()).hexdigest() == \
        upstream.KNOWN[version]["DSparkSpeculator._sample_sequential"]


def test_vllm_033_digests_match_its_sources_when_present():
    vendored = REPO / ".vendor" / "vllm033" / "vllm"
    if not vendored.is_dir():
        pytest.skip("vLLM 0.33's sources are not unpacked here (.vendor/vllm033, git-ignored)")
    assert {**upstream.digests(vendored), **upstream.digests(vendored, upstream.TOPK_PINNED)} == upstream.KNOWN["0.33.0"]


def test_changed_upstream_code_falls_back(monkeypatch, warnings_seen):
    monkeypatch.setattr(upstream, "match_installed", lambda: (None, ("DSparkSpeculator._sample_sequential",)))
    spec = make_speculator(hybridspec=REFERENCE)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("differs from the releases the plugin was read against", warnings_seen)


# --- fallbacks ---------------------------------------------------------------------------------------------------

def _assert_fell_back(fragment, warnings_seen):
    record = status.get(walk.COMPONENT)
    assert record is not None and record.state == status.FALLBACK and fragment in record.reason, record
    assert any(fragment in r.getMessage() and "vLLM's DSpark walk runs instead" in r.getMessage()
               for r in warnings_seen), [r.getMessage() for r in warnings_seen]


class _GatedHead:
    """Stands for a head type the kernel lacks: a DSparkMarkovHead subclass with its own bias."""

    def bias(self, markov_embed, logits_processor):
        return logits_processor(self.markov_w2, torch.sigmoid(markov_embed))


def _gated_head(spec):
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead

    head = spec.model.model.markov_head
    head.__class__ = type("GatedMarkovHead", (DSparkMarkovHead,), {"bias": _GatedHead.bias})


def _own_markov_bias(spec):
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    def markov_bias(self, markov_embed):
        return 2 * self.model.markov_head.bias(markov_embed, self.logits_processor)

    spec.model.__class__ = type("OtherDSpark", (Qwen3DSparkForCausalLM,), {"markov_bias": markov_bias})


def _own_gathered_bias(spec):
    head = spec.model.model.markov_head
    head.__class__ = type("OtherHead", (type(head),), {"apply_bias_gathered": lambda self, *a, **k: None})


def _quantized_projection(spec):
    spec.model.model.markov_head.markov_w2.quant_method = type("Fp8EmbeddingMethod", (), {})()


def _base_logits_in_fp64(spec):
    compute = spec.model.compute_draft_logits
    spec.model.compute_draft_logits = lambda hidden: compute(hidden).double()


def _own_sample_logits(spec):
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    spec.__class__ = type("OtherSpeculator", (DSparkSpeculator,), {"_sample_logits": lambda self, *a: None})


FALLBACKS = [
    pytest.param({}, _own_sample_logits, "OtherSpeculator samples drafts its own way", id="speculator-subclass"),
    pytest.param({}, lambda s: setattr(s, "_draft_topk", 101), "dspark_draft_topk=101 (the top-k walk takes 1..100",
                 id="topk-past-vocab"),
    pytest.param({"topk": 8}, _own_gathered_bias, "with its own gathered bias", id="topk-other-gathered-bias"),
    pytest.param({}, lambda s: setattr(s, "draft_watermarker", object()), "draft watermarker", id="watermarker"),
    pytest.param({"sampled": True}, lambda s: setattr(s, "use_fp64_gumbel", True), "fp64 Gumbel", id="fp64-gumbel"),
    pytest.param({}, lambda s: setattr(s.model, "sample_sequential", lambda *a: False), "own Markov sampling",
                 id="model-hook-0.33"),
    pytest.param({}, lambda s: setattr(s.model, "apply_output_logit_transform", lambda x: x),
                 "transforms its output logits", id="output-transform"),
    pytest.param({}, _gated_head, "GatedMarkovHead Markov head", id="other-head-type"),
    pytest.param({}, _own_markov_bias, "markov_bias is not vLLM's", id="other-markov-bias"),
    pytest.param({}, _quantized_projection, "quantized Markov projection", id="quantized-w2"),
    pytest.param({}, lambda s: setattr(s.model.logits_processor, "soft_cap", 30.0), "soft-capping", id="soft-cap"),
    pytest.param({"rank": 24}, lambda s: None, "Markov rank 24", id="rank-not-power-of-two"),
    pytest.param({}, _base_logits_in_fp64, "base logits in torch.float64", id="logits-dtype"),
    pytest.param({"sampled": True, "estimator": True}, lambda s: setattr(s, "draft_logits", s.draft_logits.half()),
                 "acceptance estimator with a torch.float16 draft logits cache", id="estimator-cache-dtype"),
    # vLLM's sampler asserts the cache width; the walk would spill into the next step's or request's row
    pytest.param({"sampled": True}, lambda s: setattr(s, "draft_logits", s.draft_logits[..., :92].contiguous()),
                 "draft logits cache of 92 columns for a 100-token draft vocabulary", id="narrow-cache"),
    pytest.param({"sampled": True, "reduced_vocab": True},
                 lambda s: setattr(s, "draft_logits", s.draft_logits[..., :130].contiguous()),
                 "draft logits cache of 130 columns for a 137-token target vocabulary", id="narrow-cache-d2t"),
]


@pytest.mark.parametrize("options, change, fragment", FALLBACKS)
def test_unsupported_setting_leaves_vllms_walk_and_says_why(options, change, fragment, warnings_seen):
    spec = make_speculator(hybridspec=REFERENCE, **options)
    change(spec)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back(fragment, warnings_seen)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)  # decided once, stays


def test_reduced_fp32_matmul_precision_falls_back(monkeypatch, warnings_seen):
    """vLLM's VLLM_FLOAT32_MATMUL_PRECISION "high" makes its fp32 walk multiply in TF32; the kernels would propose
    drafts a rounding away from it, so the walk stays vLLM's (asked where the kernels could run)."""
    monkeypatch.setattr(walk, "_why_kernel_cannot_run", lambda device: None)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        spec = make_speculator(hybridspec=MEGAKERNEL, dtype=torch.float32)
        assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    finally:
        torch.set_float32_matmul_precision(before)
    _assert_fell_back("float32 matmul precision 'high'", warnings_seen)


def test_vocabulary_beyond_the_kernels_ids_falls_back(monkeypatch, warnings_seen):
    monkeypatch.setattr(walk, "MAX_TOKENS", 64)
    spec = make_speculator(hybridspec=REFERENCE, vocab=100)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("100-token vocabulary", warnings_seen)


def test_megakernel_without_cuda_or_interpreter_falls_back(monkeypatch, warnings_seen):
    import hybridspec_kernels.head_walk.kernel as kernel

    monkeypatch.setattr(kernel, "head_walk_kernel", object())  # compiled Triton, and no CUDA device here
    spec = make_speculator(hybridspec=MEGAKERNEL)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("needs a CUDA device or TRITON_INTERPRET=1", warnings_seen)


def test_megakernel_in_bf16_under_the_interpreter_falls_back(kernel_runs_here, warnings_seen):
    spec = make_speculator(hybridspec=MEGAKERNEL, dtype=torch.bfloat16)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("bf16 under the Triton interpreter", warnings_seen)


def test_full_residency_that_cannot_fit_falls_back(kernel_runs_here, warnings_seen):
    spec = make_speculator(hybridspec={**MEGAKERNEL, "head_walk_residency": "full"}, vocab=1000)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("hybridspec.head_walk_residency=full: residency='full' needs", warnings_seen)


def test_full_residency_that_fits_one_row_but_not_the_widest_batch_falls_back(kernel_runs_here, warnings_seen):
    """The kernel plan's tiles shrink with the batch width: 'full' must fit at every width the engine's walks take
    (here 100 rows fit a one-row walk, not a walk of 33+ rows), or that batch would raise inside the engine step."""
    few = make_speculator(hybridspec={**MEGAKERNEL, "head_walk_residency": "full"}, vocab=100, num_reqs=3)
    assert walk.make_plan(few).backend == "megakernel"
    status.reset()
    spec = make_speculator(hybridspec={**MEGAKERNEL, "head_walk_residency": "full"}, vocab=100, num_reqs=40)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("hybridspec.head_walk_residency=full: residency='full' needs", warnings_seen)
    assert "(a walk of 42 rows)" in status.get(walk.COMPONENT).reason


def test_residency_is_checked_at_every_batch_width():
    assert walk._rows_of_every_width(1) == [1]
    assert walk._rows_of_every_width(5) == [1, 5]
    assert walk._rows_of_every_width(40) == [1, 16, 32, 40]  # widths 16, 32, 64, and the one-row walk's forms
    assert walk._rows_of_every_width(500) == [1, 16, 32, 64]  # walks of more rows launch 64 at a time


def test_disabled_hybridspec_is_plain_vllm(warnings_seen):
    for section in (None, {"enabled": False, "head_walk": "megakernel"}):
        spec = make_speculator(hybridspec=section)
        assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    assert status.snapshot() == {} and not warnings_seen


# --- the patch ---------------------------------------------------------------------------------------------------

@pytest.fixture
def patched():
    was_applied = UseHybridSpecHeadWalk.is_applied()
    if not was_applied:
        UseHybridSpecHeadWalk.apply()
    yield
    if not was_applied:
        UseHybridSpecHeadWalk.revert()


def test_patched_method_runs_ours_or_vllms(patched, monkeypatch):
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    calls = []
    monkeypatch.setattr(walk, "sample_sequential", lambda *args: calls.append("ours") or False)
    spec = make_speculator(hybridspec=REFERENCE)
    want = run_walk(spec, ours=False).tokens
    DSparkSpeculator._sample_sequential(spec, spec._test_rows, spec._test_head_hidden)  # ours declines: vLLM's
    assert calls == ["ours"] and torch.equal(spec.draft_tokens[: spec._test_rows], want)

    monkeypatch.setattr(walk, "sample_sequential", lambda *args: calls.append("ours") or True)
    spec.draft_tokens.zero_()
    DSparkSpeculator._sample_sequential(spec, spec._test_rows, spec._test_head_hidden)  # ours did the step
    assert calls == ["ours", "ours"] and not spec.draft_tokens.any()


def test_register_applies_the_patch_only_when_vllm_imports_the_speculator(tmp_path):
    code = (
        "import sys, vllm_hybridspec.plugin as p; p.register();"
        "from vllm_hybridspec.head_walk.patches import UseHybridSpecHeadWalk as P;"
        "name = P.target.partition(':')[0]; print('imported', name in sys.modules, 'applied', P.is_applied());"
        "import importlib; m = importlib.import_module(name);"
        "print('applied', P.is_applied(), m.DSparkSpeculator._sample_sequential.__hybridspec_patch__);"
        "import inspect; print('source', 'sample_sequential' in inspect.getsource(P.original()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**__import__("os").environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "imported False applied False" in out.stdout
    assert "applied True UseHybridSpecHeadWalk" in out.stdout and "source True" in out.stdout


# --- the reference walk against vLLM's greedy walk (torch only) --------------------------------------------------

REFERENCE_CASES = [
    pytest.param({}, id="greedy"),
    pytest.param({"reduced_vocab": True}, id="greedy-d2t"),
    pytest.param({"confidence": True, "padding_rows": 2}, id="greedy-confidence-padding"),
    pytest.param({"num_reqs": 5, "num_steps": 7, "vocab": 257, "rank": 32, "logit_scale": 0.75}, id="odd-sizes"),
    pytest.param({"dtype": torch.float16, "reduced_vocab": True}, id="fp16"),
    pytest.param({"dyadic": False, "seed": 3}, id="gaussian-weights"),
    pytest.param({"topk": 8}, id="topk"),
    pytest.param({"topk": 8, "reduced_vocab": True}, id="topk-d2t"),
    pytest.param({"topk": 5, "confidence": True, "padding_rows": 2}, id="topk-confidence-padding"),
    pytest.param({"topk": 1, "num_steps": 3}, id="topk-1"),
    pytest.param({"topk": 40, "num_reqs": 5, "num_steps": 7, "vocab": 257, "rank": 32, "logit_scale": 0.75},
                 id="topk-odd-sizes"),
    pytest.param({"topk": 16, "dtype": torch.float16, "reduced_vocab": True}, id="topk-fp16"),
]


@pytest.mark.parametrize("options", REFERENCE_CASES)
def test_reference_walk_equals_vllms_greedy_walk(options):
    spec = make_speculator(hybridspec=REFERENCE, **options)
    want, got = run_walk(spec, ours=False), run_walk(spec, ours=True)
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)
    assert torch.equal(got.confidence, want.confidence)
    record = status.get(walk.COMPONENT)
    assert record.state == status.REFERENCE, record


def test_reference_cache_write_skips_padding_rows_without_a_host_sync():
    cache = torch.arange(4 * 3 * 6, dtype=torch.float32).view(4, 3, 6)
    before = cache.clone()
    logits = -torch.rand(4, 2, 5)
    d2t = torch.tensor([0, 0, 1, 1, 1])  # draft ids 0..4 -> target columns 0, 1, 3, 4, 5
    walk._store_logits(cache, torch.tensor([0, -1, 2, -1]), logits, d2t)
    columns = torch.tensor([0, 1, 3, 4, 5])
    for row, req in ((0, 0), (2, 2)):
        assert torch.equal(cache[req, :2, columns], logits[row])
    untouched = torch.ones_like(cache, dtype=torch.bool)
    untouched[0, :2, columns] = untouched[2, :2, columns] = False
    assert torch.equal(cache[untouched], before[untouched])
    walk._store_logits(cache, torch.tensor([-1, -1, -1, -1]), logits, d2t)  # a dummy batch: nothing to write
    assert torch.equal(cache[untouched], before[untouched])


def test_cache_writes_need_no_host_sync():
    """On the meta device every value is unknown: an op that would read one on the host (a sync inside a CUDA
    graph) raises. The reference cache write and the reduced-vocabulary mask pass."""
    meta = torch.device("meta")
    cache = torch.empty(6, 3, 40, device=meta)
    walk._store_logits(cache, torch.empty(4, dtype=torch.long, device=meta), torch.empty(4, 3, 30, device=meta),
                       torch.empty(30, dtype=torch.long, device=meta))
    walk._mask_columns_outside_draft_vocab(cache, torch.empty(30, dtype=torch.long, device=meta))
    with pytest.raises(Exception):
        torch.empty(4, device=meta).sum().item()  # the probe works


def test_an_empty_batch_is_left_to_vllm():
    spec = make_speculator(hybridspec=REFERENCE)
    assert not walk.sample_sequential(spec, 0, spec._test_head_hidden)


def test_status_names_the_megakernel_when_it_runs(kernel_runs_here):
    spec = make_speculator(hybridspec=MEGAKERNEL)
    plan = walk.make_plan(spec)
    assert plan.backend == "megakernel" and plan.logits_dtype == torch.float32
    assert status.get(walk.COMPONENT) == status.ComponentStatus(status.ACTIVE, plan.reason)
    assert "megakernel" in plan.reason and "residency auto" in plan.reason


def test_changed_topk_code_leaves_only_the_topk_mode_to_vllm(monkeypatch, warnings_seen):
    """A vLLM whose top-k pieces changed: top-k engines fall back, the full-vocabulary walk still runs."""
    real = upstream.match_installed

    def topk_changed(pinned=upstream.PINNED):
        return (None, ("DSparkMarkovHead.apply_bias_gathered",)) if pinned is upstream.TOPK_PINNED else real(pinned)

    monkeypatch.setattr(upstream, "match_installed", topk_changed)
    spec = make_speculator(hybridspec=REFERENCE, topk=8)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("top-k walk differs from the releases", warnings_seen)
    status.reset()
    full = make_speculator(hybridspec=REFERENCE)
    assert walk.sample_sequential(full, full._test_rows, full._test_head_hidden)


def test_topk_rounding_unknown_here_falls_back(monkeypatch, warnings_seen):
    monkeypatch.setattr(walk, "_gathered_bias_rounding", lambda model, dtype, topk: None)
    spec = make_speculator(hybridspec=REFERENCE, topk=8, sampled=True)
    assert not walk.sample_sequential(spec, spec._test_rows, spec._test_head_hidden)
    _assert_fell_back("rounds here in neither way", warnings_seen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_topk_rounding_read_off_vllms_gathered_bias(dtype):
    """On CPU torch rounds the fp32 sum once (16-bit logits tell the two apart; fp32 ones cannot: the default)."""
    spec = make_speculator(hybridspec=REFERENCE, topk=8, dtype=dtype, dyadic=False, vocab=1000, rank=64)
    assert walk._gathered_bias_rounding(spec.model, dtype, 8) is False


def test_status_names_the_topk_walk(kernel_runs_here):
    spec = make_speculator(hybridspec=MEGAKERNEL, topk=8, sampled=True)
    spec.draft_logits.fill_(3.0)
    plan = walk.make_plan(spec)
    assert plan.backend == "megakernel" and plan.topk == 8
    assert "top-k walk (dspark_draft_topk=8)" in status.get(walk.COMPONENT).reason
    assert torch.isneginf(spec.draft_logits).all()  # the walk then writes only its candidates' columns


# --- the megakernel and vLLM's seeded sampling, in a child process under the MRV2 shim --------------------------

def test_megakernel_and_sampled_walks_equal_vllms_in_the_mrv2_environment(tmp_path):
    pytest_bin = Path(sys.executable).with_name("pytest")
    proc = subprocess.run(
        [str(pytest_bin), "-q", "-p", "no:cacheprovider", "-x", str(HERE / "kernel_equivalence.py")],
        env=mrv2_env(), cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    log = proc.stdout + proc.stderr
    print(log[-4000:])
    assert proc.returncode == 0, f"kernel_equivalence.py failed (rc {proc.returncode}):\n{log[-8000:]}"
    assert " passed" in log and " skipped" not in log, log[-2000:]


@pytest.mark.parametrize("num_reqs", [1, 2, 8])
def test_megakernel_leaves_the_exchange_to_the_kernel(monkeypatch, num_reqs):
    """The wiring runs what the benchmark's headline rows time: the kernel's own choice by batch size."""
    import hybridspec_kernels.head_walk as kernels
    from hybridspec_kernels.head_walk.walk import EXCHANGES, choose_exchange
    from vllm_hybridspec.head_walk import walk

    seen = {}
    monkeypatch.setattr(kernels, "head_walk", lambda *args, **kwargs: seen.update(kwargs))
    walk._backend(walk.WalkPlan(backend="megakernel"))(torch.zeros(num_reqs, 3, 5))
    assert seen["exchange"] == "auto"
    assert choose_exchange(num_reqs) in EXCHANGES[1:]
