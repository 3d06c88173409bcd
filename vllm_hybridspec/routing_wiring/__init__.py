"""The routing correction inside vLLM: probe decision at the first MoE router, neutralised routing in every MoE
layer, dropped probes rejected by vLLM's own rejection sampler.

One verify step, with `hybridspec.routing_correction: true` (needs `verify_length: adaptive`):

1. The adaptive manager (vllm_hybridspec/adaptive/manager.py) grants a few more drafts than its length policy
   chose (`probe_requests`: requests whose next draft `probe_worth` says is worth probing) and, after the device
   split, marks each request's last draft as its probe when that draft lies beyond the policy's own choice
   (`mark_probes`). It writes the step's static buffers: `RoutingStep.write`, with the probe's cost at this
   step's own shape (`ProbeCostModel.at(batch, verified length)`: a probe sits where the policy stopped, i.e.
   where the next token is dear, so a cost taken at a typical length under-prices it).
2. Every MoE router's `select_experts` goes through `correct_routing` (patch `CorrectMoeRouting`, patches.py):
   the first router called after the manager installed the step (the target's layer 0; fixed from then on)
   decides `keep` with `routing_keep_mask`; every router, the first included, neutralises dropped probes
   (`neutralize_dropped`: weights 0, ids of experts the step runs anyway). Shapes never change.
3. vLLM's rejection sampler (patch `RejectDroppedProbes`) sees each dropped probe's draft as invalid (-1, the
   path grammar-constrained drafts use): verification stops before it and the token at its place is sampled
   from the target's logits of the previous position, exactly as if the request had verified one draft less
   (`verified_drafts_after_correction`). A non-greedy request verifies only the drafts its length policy
   admitted: its probe and every other draft ranked past the policy's budget are made invalid, kept or not.
   Keeping the probe by its routing would bias sampling (tests/policy/test_routing_correction.py), and so would
   stopping just before it: the probe is the last admitted draft, i.e. the one after which the next draft's
   confidence (read from the probe) lost the ranking (tests/policy/test_lossless.py); the policy's own ranking
   depends only on earlier drafts (`RoutingStep.invalid_rows`).
   The step's buffers are cleared afterwards, so steps the manager does not plan (no drafts) route untouched.
4. vLLM's online acceptance estimator (DFlash, MTP, DSpark without a confidence head) learns from each request's
   accepted drafts and its first rejected one (patch `ObserveVerifiedDraftsOnly`): a request stopped at an
   invalid draft reports no rejection there (`RoutingStep.estimator_rejections`), since the target never judged
   that draft; counting it rejected would teach the estimator that drafts fail where our policy stops.

The device cut of the adaptive length (`device_verify_length`) uses the same machinery: the manager marks each
request's drafts past the length policy's choice as neutral (`neutral_token_mask`); every router neutralises
them, the rejection sampler sees them invalid (verification stops before the first), and the first router's base
set leaves them out. Without the routing correction the step has no cost model and no router decides
(`RoutingStep(cost=None)`); with it, a cut request's first cut draft is its probe.

Lossless under greedy decoding: a dropped probe is never accepted and is its request's last token, so what the
kept tokens compute does not depend on it; the bonus comes from the last kept draft's logits.

GPU notes (untested here, no GPU): the buffers are static device tensors, the decision and the
neutralisation are plain tensor ops inside vLLM's `moe_forward` op, and they run from installation on (the
identity while no probe is planned), so CUDA graphs captured at start-up contain them and replay them on the
planned buffers. The manager is built after the memory-profile run and before graph capture; the first router
then called is the target's layer 0 (MRV2 runs the target before the drafter in every forward), assumed, not
checked. Monolithic MoE kernels (FlashInfer TRT-LLM, some quantised CPU paths) route inside the kernel and
bypass `select_experts`: no router of ours would decide there, so the correction and the device cut fall back
(`routing_fallback_reason`, read when the manager is built, after the MoE kernels are chosen). The counters are device tensors, read (one sync) only when snapshotted.
"""
