"""Block-parallel GDN verification inside vLLM (`hybridspec.gdn_verify: block_parallel`).

What changes for a hybrid Gated-DeltaNet target under speculative decoding
-------------------------------------------------------------------------
vLLM verifies the K drafts through each GDN layer token by token and stores the full recurrent state after
every token in K+1 state slots per request, then reads the accepted slot at the next step. Here each request
keeps ONE committed state per layer (ssm state + a W-1 wide conv window). A step:

1. metadata build (per KV-cache group, before the forward): the group's pending from the last commit is
   consumed. Spec rows verified again get (fold row, fold count) in persistent tensors; every other pending
   slot is flushed by one ssm-only `gdn_reconstruct` launch right there. The step's workspace rows are set.
2. forward, per GDN layer: spec rows fold their pending tokens into the ssm state and verify from it in
   block-parallel form (`hybridspec_kernels.gdn_verify.gdn_verify(..., fold=GDNFold(...))` on CUDA, the naive
   reference elsewhere), filling this step's half of the workspace (per token: WY pseudo-values u, keys k,
   cumulative decay g and the raw conv input x). Rows without drafts to verify - prefill chunks, and every row
   of a batch without spec rows - run vLLM's own non-spec GDN path on the committed state.
3. after rejection sampling, a runner hook commits: one conv-only reconstruct launch per KV-cache group advances
   every conv window by the accepted tokens, and each committed slot's (workspace row, accepted count) becomes
   the group's pending - on the device, without a host sync. The parity flips.
So a step reads and writes each verified request's ssm state once (the fold), instead of reading it in the
verify and reading + writing it again in a reconstruction.

The invariant
-------------
Between a commit and the next metadata build, every slot holds its request's conv window after all committed
tokens, and its ssm state after all committed tokens except, for the rows of that last commit only, the first
`count` tokens of their workspace row ("pending", per KV-cache group: slot, workspace row, count, request id).
The next build of the group consumes ALL of it before anything reads a state:
- a slot verified again folds it inside its verify (first thing, stored back);
- the row of a request that finished or was preempted since the commit (the runner hooks report them when the
  step starts; the builder recorded each row's request id) is dropped, neither folded nor flushed: vLLM may
  already have handed its block to another request (any KV-cache group: the pages alias) and zeroed it, and
  kernels read past a sequence's end in a block (the CPU attention does: a flush there turned a new request's
  output into NaN);
- every other pending row (a live request that is not a spec row this step: skipped under the token budget,
  waiting, a non-spec row; or the whole batch when it has no spec rows) is flushed by the ssm-only launch, into
  a slot its request still owns.
Hence:
- pending never outlives one step boundary, so a request in a reused slot never sees a stale one (its first
  step is a prefill; a spec row always follows a step that wrote its slot), and vLLM's own GDN paths read a
  current state wherever a live request's slot is read;
- the workspace is double-buffered: step t writes rows r + p x max_requests, its pending lives there while step
  t+1 writes the other half (parity 1 - p), and the fold reads each pending row before anything rewrites it;
- the per-step verify arguments (workspace rows, fold rows/counts) live in persistent per-group tensors that the
  builder fills, so a FULL CUDA graph replays them like vLLM's own state-index buffers; padding rows (slot 0)
  fold nothing and are skipped;
- dummy, profile and capture runs build metadata too: their build folds or flushes whatever is pending (both
  exact), their verify writes only the current parity's rows, and no commit follows, so they leave no pending.
- engine shutdown drops the pending with the states; nothing reads them.
Not covered (documented limits): KV connectors that save or load GDN states outside the forward would see a
lagging ssm state for the last commit's rows.

Why the reference path folds too
--------------------------------
The CPU path (no kernels) runs the same bookkeeping; only the workspace content differs (raw inputs and the conv
window before the block, replayed by the naive reference, instead of u/k/g). The CPU engine tests (V1 and Model
Runner V2) are the only engine-level tests this project can run, and they then exercise the fold bookkeeping
under real scheduling (mixed batches, finished and reused slots, rows without drafts), with one code path
fewer to keep correct. The price is a second short replay per commit (conv at commit, ssm at fold), on CPU.

Why commit in a runner hook, and not everything lazily at the next forward
------------------------------------------------------------------------
The conv windows (small) are advanced eagerly so that vLLM's non-spec path always finds them current; only the
ssm state lags, and only until the next build. Keeping the pending to one step boundary (flushing what is not
verified again) means the workspace stays per step and per batch row, and preemption/recompute, finished
requests, prefill chunks after spec steps and skipped requests need no per-slot flag in the KV cache. The price
is a few small runner hooks (commit after rejection sampling; at step start the finished and preempted requests
and, MRV2, the batch's request ids; see patches.py) and one flush launch per KV-cache group per step (its rows
exit at once when everything pending was folded).

Memory: `num_speculative_blocks = 0` for GDN layers, so each request holds 1 state page per GDN KV-cache group
instead of 1 + K (the page keeps vLLM's size: the platform already sized the attention pages to it). The
workspace (kernel path) is allocated with the model: rows = 2 x scheduler max_num_seqs, length = 1 + K.

Adaptive verification: the backend reports `supports_device_cpu_query_lens_mismatch()` true (verification reads
device cu_seqlens only) and replays FULL decode graphs with 1..K+1 tokens per request.

Limits (the engine falls back to vLLM's GDN path, logs why and records it in `vllm_hybridspec.status`):
prefix caching on the hybrid model (vLLM's "align" mamba cache mode copies per-token slots; pass
`enable_prefix_caching=False`), pipeline parallelism, ReplaySSM/RecoverSSM, the DS conv-state layout, and verify
lengths above 32. Tensor parallelism is per rank: heads, states and workspace are the rank's shard. CUDA graphs:
the GDN core op runs eagerly in PIECEWISE mode; in FULL mode shapes are static (max verify length, padding
rows with slot 0); the flush (metadata build) and the commit run outside graphs.
"""
from vllm_hybridspec.gdn.plan import BlockParallelPlan, block_parallel_plan
from vllm_hybridspec.gdn.step import COUNTERS

__all__ = ["COUNTERS", "BlockParallelPlan", "block_parallel_plan"]
