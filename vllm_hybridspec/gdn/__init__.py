"""Block-parallel GDN verification inside vLLM (`hybridspec.gdn_verify: block_parallel`).

What changes for a hybrid Gated-DeltaNet target under speculative decoding
-------------------------------------------------------------------------
vLLM verifies the K drafts through each GDN layer token by token and stores the full recurrent state after
every token in K+1 state slots per request, then reads the accepted slot at the next step. Here each request
keeps ONE committed state per layer (ssm state + a W-1 wide conv window). A step:

1. forward, per GDN layer: spec rows are verified from the committed state in block-parallel form
   (`hybridspec_kernels.gdn_verify.gdn_verify` on CUDA, its naive reference elsewhere). Nothing is written to
   the states; the kernel fills a compact per-step workspace (per token: WY pseudo-values u, keys k,
   cumulative decay g and the raw conv input x). Rows without drafts to verify - prefill chunks, and every row
   of a batch without spec rows - run vLLM's own non-spec GDN path on the committed state.
2. after rejection sampling, a runner hook commits: every layer's state advances by the request's accepted
   tokens (`gdn_reconstruct`, one launch per KV-cache group of layers; the reference replays the tokens).

Why commit eagerly in a runner hook, not lazily at the next forward
-------------------------------------------------------------------
A lazy design (apply last step's accepted tokens at the start of the next verify) needs no runner hook, but the
workspace would have to survive until the request is scheduled again - requests can skip steps under a token
budget, and batch rows move between steps - so it would live per state slot inside the KV cache and carry a
"pending tokens" flag through preemption and slot reuse. Committing right after rejection sampling keeps the
invariant "a slot always holds the state after the request's committed tokens" at every step boundary: the
workspace is per step and indexed by batch row (as the kernels want), preemption/recompute, finished requests,
prefill chunks after spec steps and skipped requests need no special case, and vLLM's non-spec path can run on
the same slot. The price is two small patches (V1 runner and Model Runner V2 model state, see patches.py); the
reconstruction itself is one launch per KV-cache group, outside any CUDA graph.

Memory: `num_speculative_blocks = 0` for GDN layers, so each request holds 1 state page per GDN KV-cache group
instead of 1 + K (the page keeps vLLM's size: the platform already sized the attention pages to it). The
workspace (kernel path) is allocated with the model, rows = scheduler max_num_seqs, length = 1 + K.

Adaptive verification: the backend reports `supports_device_cpu_query_lens_mismatch()` true (verification reads
device cu_seqlens only) and replays FULL decode graphs with 1..K+1 tokens per request.

Prefix caching (vLLM's "align" mamba cache mode, on by default): vLLM keeps a GDN state per KV block and the
running state in the block of the step's last scheduled token. The commit also writes the state at the block
boundary the accepted tokens reach, if any, into the block that ends there (a checkpoint launch of
`gdn_reconstruct` before the usual one; slots and token counts computed on the device from the computed-token
counts, accepted counts and block table), and the runner hooks replace vLLM's align post-copy, which reads
per-token slots, and keep the accepted count at 1 so that vLLM's pre-forward migration copies the whole running
state (token offset 0). Every mamba layer of the model must be a block-parallel GDN layer (Qwen3-Next, Qwen3.5).
Tested end to end on CPU (V1 and Model Runner V2, through the tests' Triton-interpreter shim); untested in a GPU
engine.

Limits (the engine falls back to vLLM's GDN path, logs why and records it in `vllm_hybridspec.status`):
mamba cache modes other than none/align, pipeline parallelism, ReplaySSM/RecoverSSM, the DS conv-state layout, and
verify lengths above 32. Tensor parallelism is per rank: heads, states and workspace are the rank's shard. CUDA graphs:
the GDN core op runs eagerly in PIECEWISE mode; in FULL mode shapes are static (max verify length, padding
rows with slot 0); the commit runs outside graphs.
"""
from vllm_hybridspec.gdn.plan import BlockParallelPlan, block_parallel_plan
from vllm_hybridspec.gdn.step import COUNTERS

__all__ = ["COUNTERS", "BlockParallelPlan", "block_parallel_plan"]
