"""A DSparkSpeculator without an engine: vLLM's real speculator class, Markov head, LM head, logits processor,
confidence head and acceptance estimator, with the buffers `_sample_sequential` reads filled at random.

`make_speculator(...)` returns a speculator that vLLM's own `_sample_sequential` can walk; `run_walk(spec, ours)`
walks a deep copy with vLLM's method or with hybridspec's, and returns everything the walk writes.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
import torch.nn as nn


def _values(gen, shape, dyadic, scale):
    """Dyadic values (k / 16, |k| <= 8) make every dot product exact in fp16/fp32 whatever the summation order,
    so the kernel and vLLM's GEMM must then agree bit for bit."""
    if dyadic:
        return torch.randint(-8, 9, shape, generator=gen).float() / 16
    return torch.randn(shape, generator=gen) * scale


def make_speculator(
    *,
    num_reqs=3,
    num_steps=4,
    vocab=100,
    rank=16,
    hidden=24,
    dtype=torch.float32,
    sampled=False,
    reduced_vocab=False,
    estimator=False,
    confidence=False,
    padding_rows=0,
    logit_scale=1.0,
    dyadic=True,
    hybridspec=None,
    seed=0,
    topk=None,
):
    """hybridspec: the `hybridspec` section of additional_config (None: the plugin is not enabled); topk: the
    drafter's `dspark_draft_topk` (vLLM's top-k walk)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_dspark import (
        DSparkConfidenceHead,
        DSparkMarkovHead,
        Qwen3DSparkForCausalLM,
    )
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    gen = torch.Generator().manual_seed(seed)
    target_vocab = vocab + 37 if reduced_vocab else vocab
    rows = num_reqs + padding_rows
    max_num_reqs = rows + 2

    with set_current_vllm_config(VllmConfig()):
        model = Qwen3DSparkForCausalLM.__new__(Qwen3DSparkForCausalLM)
        nn.Module.__init__(model)
        model.model = nn.Module()
        model.model.markov_head = DSparkMarkovHead(target_vocab, vocab, rank, prefix="markov_head",
                                                   retain_weight_for_gather=topk is not None)
        model.lm_head = ParallelLMHead(vocab, hidden, prefix="lm_head", disable_tp=True)
        model.logits_processor = LogitsProcessor(vocab, scale=logit_scale)
    head = model.model.markov_head
    with torch.no_grad():
        head.markov_w1.weight.copy_(_values(gen, head.markov_w1.weight.shape, dyadic, 0.5))
        head.markov_w2.weight.copy_(_values(gen, head.markov_w2.weight.shape, dyadic, 0.5))
        model.lm_head.weight.copy_(_values(gen, model.lm_head.weight.shape, dyadic, 0.5))
    model.draft_id_to_target_id = None
    if reduced_vocab:
        keep = torch.sort(torch.randperm(target_vocab, generator=gen)[:vocab]).values
        model.draft_id_to_target_id = nn.Parameter(keep - torch.arange(vocab), requires_grad=False)
    model.model.confidence_head = None
    if confidence:
        conf = DSparkConfidenceHead.__new__(DSparkConfidenceHead)
        nn.Module.__init__(conf)
        conf.with_markov = True
        conf.proj = nn.Linear(hidden + rank, 1, bias=True)  # vLLM's ReplicatedLinear needs a TP group
        model.model.confidence_head = conf
    model.to(dtype)
    if confidence:
        model.model.confidence_head.float()
    for layer in (model.lm_head, head.markov_w2):  # as vLLM does after loading (on CPU: picks a GEMM kernel)
        layer.quant_method.process_weights_after_loading(layer)

    spec = DSparkSpeculator.__new__(DSparkSpeculator)
    section = {} if hybridspec is None else {"hybridspec": hybridspec}
    spec.vllm_config = SimpleNamespace(
        additional_config=section, speculative_config=SimpleNamespace(num_speculative_tokens=num_steps)
    )
    spec.model = model
    spec.device = torch.device("cpu")
    spec.num_speculative_steps = num_steps
    spec.max_num_reqs = max_num_reqs
    spec.vocab_size = target_vocab
    spec._draft_topk = topk
    spec.draft_watermarker = None
    spec.use_fp64_gumbel = False
    spec._step_cols = torch.arange(num_steps, dtype=torch.int32)
    spec._anchor_idx = torch.arange(max_num_reqs, dtype=torch.int64) * num_steps

    num_tokens = max_num_reqs * num_steps
    # Rows sample their own query positions, in a shuffled order (the hidden states are a flat token buffer).
    spec.sample_indices = torch.randperm(num_tokens, generator=gen)[: max_num_reqs * num_steps].long()
    spec.sample_pos = torch.randint(1, 5000, (num_tokens,), generator=gen).long()
    req_states = torch.randperm(max_num_reqs, generator=gen)[:rows]
    req_states[num_reqs:] = -1
    mapping = torch.full((max_num_reqs, num_steps), -1, dtype=torch.int64)
    mapping[:rows] = req_states[:, None]
    spec.sample_idx_mapping = mapping.reshape(-1)
    spec.input_buffers = SimpleNamespace(
        input_ids=torch.randint(0, target_vocab, (num_tokens,), generator=gen).to(torch.int32)
    )
    spec.temperature = torch.rand(max_num_reqs, generator=gen) * 1.5 + 0.3
    spec.temperature[req_states[0]] = 0.0  # a greedy request inside a sampled batch
    spec.seeds = torch.randint(0, 2**62, (max_num_reqs,), generator=gen)
    spec.draft_tokens = torch.zeros(max_num_reqs, num_steps, dtype=torch.int64)
    spec.draft_token_confidence_probs = torch.zeros(max_num_reqs, num_steps, dtype=torch.float32)

    spec.draft_logits = None
    spec._d2t_scatter_index = None
    spec._draft_scatter_buf = None
    if sampled:  # DraftModelSpeculator.__init__ / DSparkSpeculator.load_draft_model
        spec.draft_logits = torch.zeros(max_num_reqs, num_steps, target_vocab, dtype=dtype)
        if reduced_vocab:
            d2t = model.draft_id_to_target_id
            spec._d2t_scatter_index = torch.arange(vocab) + d2t
            spec._draft_scatter_buf = torch.full((max_num_reqs, target_vocab), float("-inf"), dtype=dtype)
    spec.use_confidence_head = confidence
    spec.acceptance_estimator = None
    if estimator:
        from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator

        spec.acceptance_estimator = OnlineAcceptanceEstimator(max_num_reqs, num_steps, spec.device)

    spec._test_rows = rows
    spec._test_head_hidden = _values(gen, (num_tokens, hidden), dyadic, 1.0).to(dtype)
    spec._test_valid_reqs = req_states[:num_reqs]
    return spec


def run_walk(spec, ours: bool, copy_spec: bool = True):
    """Walks a deep copy of spec (copy_spec=False: spec itself) with vLLM's `_sample_sequential` (ours=False) or
    hybridspec's; returns what it wrote. Raises if hybridspec's walk declined (it would have left the work to vLLM's)."""
    from vllm_hybridspec.head_walk.patches import UseHybridSpecHeadWalk
    from vllm_hybridspec.head_walk.walk import sample_sequential

    if copy_spec:
        spec = copy.deepcopy(spec)
    rows, hidden = spec._test_rows, spec._test_head_hidden
    with torch.no_grad():
        if ours:
            if not sample_sequential(spec, rows, hidden):
                raise AssertionError("hybridspec's walk declined")
        else:
            UseHybridSpecHeadWalk.original()(spec, rows, hidden)
    valid = spec._test_valid_reqs
    out = SimpleNamespace(
        tokens=spec.draft_tokens[:rows].clone(),
        confidence=spec.draft_token_confidence_probs[: len(valid)].clone(),
        spec=spec,
    )
    if spec.draft_logits is not None:
        out.cache = spec.draft_logits[valid].clone()
    if spec.acceptance_estimator is not None:
        out.features = spec.acceptance_estimator.features[valid].clone()
        out.predictions = spec.acceptance_estimator.predictions[valid].clone()
    return out


def move_requests(spec, seed):
    """The next engine step of the same batch shape: other hidden states, and the requests in other cache slots
    (the slots' cached rows from the last walk stay behind, as they do in vLLM)."""
    gen = torch.Generator().manual_seed(seed)
    steps, rows, num_reqs = spec.num_speculative_steps, spec._test_rows, len(spec._test_valid_reqs)
    req_states = torch.randperm(spec.max_num_reqs, generator=gen)[:rows]
    req_states[num_reqs:] = -1
    mapping = spec.sample_idx_mapping.view(spec.max_num_reqs, steps)
    mapping.fill_(-1)
    mapping[:rows] = req_states[:, None]
    spec._test_valid_reqs = req_states[:num_reqs]
    spec._test_head_hidden = spec._test_head_hidden.roll(1 + seed % 5, dims=0)
