"""DSpark's serial Markov walk through hybridspec's resident-W2 kernel: `sample_sequential`.

`sample_sequential(speculator, num_reqs, head_hidden) -> bool` keeps the contract of vLLM 0.33's draft-model hook
of that name: either it does all that `DSparkSpeculator._sample_sequential` does for the step and returns True,
or it does nothing and returns False, and vLLM's loop runs. "All" is:
- `draft_tokens[:num_reqs]`: the drafts (target ids), greedy or drawn with vLLM's seeded Gumbel-max;
- `draft_logits[req, step]`, the proposal cache that the rejection sampler reads (probabilistic drafting);
- the acceptance estimator's per-step predictions (`_maybe_predict_acceptance`);
- the confidence head's `draft_token_confidence_probs`.

vLLM's top-k mode (`dspark_draft_topk`, `_sample_sequential_topk`) walks only each step's K largest base logits:
that walk runs through `hybridspec_kernels.head_walk_topk` (every step's bias for every previous candidate in one
launch, then one program a batch row, no grid exchange). Its draft
logits cache rows are vLLM's dense ones (-inf outside the candidates): filled with -inf once, then each walk puts
-inf back at the columns the last walk of that slot wrote and writes its K (`WalkPlan.topk_columns`).

What runs is decided once per speculator (`WalkPlan`, from the `hybridspec` config and `why_not`); a fallback is
logged and recorded in `vllm_hybridspec.status` under "head_walk". Inside the step nothing syncs with the host
and every shape is static, so the walk can be captured in vLLM's draft CUDA graph.

Exactness: the kernel rounds the bias, its scaling and the add to the logits dtype as vLLM's torch ops do, keys
ties and Gumbel noise as vLLM's sampler does, and stores the cache at target-id columns; the one difference left
is the accumulation order inside the r-long dot products (see tests/head_walk).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vllm_hybridspec import status
from vllm_hybridspec.config import HybridSpecConfig, hybridspec_config_from_vllm_config
from vllm_hybridspec.head_walk import upstream

logger = logging.getLogger("vllm.hybridspec")

COMPONENT = "head_walk"
PLAN_ATTRIBUTE = "_hybridspec_head_walk_plan"
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# hybridspec_kernels.head_walk limits: rank a power of two in [16, 1024], token ids below 2**18.
MIN_RANK, MAX_RANK, MAX_TOKENS = 16, 1024, 1 << 18


@dataclass(slots=True)
class WalkPlan:
    backend: str | None  # "megakernel" | "reference"; None: vLLM's walk runs
    reason: str = ""
    residency: str = "auto"
    w2_fp8: bool = False
    # vLLM 0.33 mixes the step into each draft draw's seed (`spec_step_seed`), as the kernel does; 0.32 keys
    # every step by the request seed alone, which the kernel reproduces one step per launch.
    step_keyed_seeds: bool = True
    logits_dtype: torch.dtype | None = None  # what vLLM's `base + bias` yields
    estimator_cache: torch.Tensor | None = None  # greedy drafting with the estimator: the walk's logits go here
    draft_columns: torch.Tensor | None = None  # reduced draft vocabulary: draft id -> target column
    # Whether d2t maps draft ids to strictly increasing target ids (read once, outside CUDA-graph capture).
    d2t_increasing: bool | None = None
    topk: int | None = None  # vLLM's dspark_draft_topk: the top-k walk runs
    # Top-k walk: [cache slots, N, K] target columns each cache slot's last walk wrote (-1: none), so that the next
    # walk puts -inf back there (the cache rows then stay vLLM's dense top-k rows without an N x V write).
    topk_columns: torch.Tensor | None = None
    # Top-k walk: how vLLM's gathered bias rounds here (read off its own apply_markov_bias_gathered at plan time).
    topk_round_dot: bool = False


def sample_sequential(spec: Any, num_reqs: int, head_hidden: torch.Tensor) -> bool:
    """Runs the DSpark draft step's Markov walk; False (having done nothing) when vLLM's walk must run."""
    plan = getattr(spec, PLAN_ATTRIBUTE, None)
    if plan is None:
        plan = make_plan(spec)
        setattr(spec, PLAN_ATTRIBUTE, plan)
    if plan.backend is None or num_reqs <= 0:
        return False

    model = spec.model
    num_steps = spec.num_speculative_steps
    num_sample = num_reqs * num_steps
    sample_hidden = head_hidden[spec.sample_indices[:num_sample]]
    base_logits = model.compute_draft_logits(sample_hidden)
    if base_logits.dtype != plan.logits_dtype:
        # Static for an engine: decided at the first step, before any CUDA graph capture.
        _fall_back(plan, f"base logits in {base_logits.dtype} but the Markov bias in {plan.logits_dtype}")
        return False
    cache = spec.draft_logits
    estimating = spec.acceptance_estimator is not None
    if estimating and cache is not None and cache.dtype != base_logits.dtype:
        _fall_back(plan, f"the acceptance estimator with a {cache.dtype} draft logits cache and "
                         f"{base_logits.dtype} logits")
        return False
    vocab = base_logits.shape[-1]
    base_logits = base_logits.view(num_reqs, num_steps, vocab)
    # NaN logits (vLLM's profile run walks uninitialised memory) would make the kernel propose an id past the
    # vocabulary and gather W1 out of bounds at the next step; as -inf they lose to every number, as vLLM's
    # argmax does not, but only garbage rows ever hold one.
    torch.nan_to_num_(base_logits, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    head = model.model.markov_head
    d2t = model.draft_id_to_target_id
    if estimating and cache is None:  # the walk's logits go to target-id columns
        cache = _estimator_cache(plan, spec, base_logits.dtype, base_logits.device,
                                 vocab if d2t is None else head.markov_w1.weight.shape[0])
    topk = plan.topk is not None

    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, num_steps)
    anchors = spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]]
    tokens = spec.draft_tokens[:num_reqs]
    sampled = spec.draft_logits is not None
    walk_kwargs = dict(
        req_indices=idx_map[:, 0].contiguous(),  # a row's request is the same at every step
        draft_to_target=d2t,
        logit_scale=model.logits_processor.scale,
    )
    if sampled:
        walk_kwargs.update(temperature=spec.temperature, seeds=spec.seeds)
        positions = spec.sample_pos[:num_sample].view(num_reqs, num_steps) - 1
    w1 = head.markov_w1.weight
    if topk:
        # vLLM's candidates (torch.topk's set; on CUDA 16-bit logits a faster radix select that picks the same set).
        from hybridspec_kernels.head_walk_topk import walk_candidates

        values, candidates = walk_candidates(base_logits, plan.topk)
        walk = _topk_backend(plan)
        inputs = (values, candidates)
        w2 = head.markov_w2.weight[:vocab]  # [V, r] rows (padded past the vocabulary): the walk gathers candidates' rows
        walk_kwargs["round_dot"] = plan.topk_round_dot
        if cache is not None:
            walk_kwargs["cached_columns"] = plan.topk_columns  # made with the cache, at plan time
    else:
        walk = _backend(plan)
        inputs = (base_logits,)
        w2 = head.markov_w2.weight[:vocab].t()  # the LM-head weight is padded past the vocabulary
    if not sampled or plan.step_keyed_seeds:
        walk(*inputs, w1, w2, anchors, positions=positions if sampled else None, draft_logits=cache,
             out=tokens, **walk_kwargs)
    else:
        previous = anchors
        columns = walk_kwargs.pop("cached_columns", None)
        for step in range(num_steps):
            if columns is not None:
                walk_kwargs["cached_columns"] = columns[:, step:]
            walk(*(t[:, step:step + 1] for t in inputs), w1, w2, previous, positions=positions[:, step:step + 1],
                 draft_logits=cache[:, step:], out=tokens[:, step:step + 1], **walk_kwargs)
            previous = tokens[:, step]

    if estimating:
        _predict_acceptance(spec, plan, cache, idx_map, vocab, d2t)
    if spec.use_confidence_head:
        _predict_confidence(spec, sample_hidden, anchors, tokens)
    return True


def make_plan(spec: Any) -> WalkPlan:
    config = hybridspec_config_from_vllm_config(getattr(spec, "vllm_config", None))
    if config is None:
        return WalkPlan(None, "hybridspec is not enabled")
    plan = WalkPlan(None)
    reason = why_not(spec, config)
    if reason is not None:
        _fall_back(plan, reason)
        return plan
    from vllm.v1.worker.gpu.sample import gumbel

    model = spec.model
    head = model.model.markov_head
    w1 = head.markov_w1.weight
    plan.logits_dtype = _product_dtype(model, w1)
    plan.step_keyed_seeds = hasattr(gumbel, "spec_step_seed")
    plan.backend = config.head_walk
    plan.residency = config.head_walk_residency
    on_cuda = w1.device.type == "cuda"
    plan.w2_fp8 = config.head_walk_w2_dtype == "fp8" and on_cuda
    plan.topk = getattr(spec, "_draft_topk", None)
    topk_note = "" if plan.topk is None else f" top-k walk (dspark_draft_topk={plan.topk})"
    if plan.topk is not None:
        reason = _prepare_topk(plan, spec, model)
        if reason is not None:
            _fall_back(plan, reason)
            return plan
    elif spec.draft_logits is not None and model.draft_id_to_target_id is not None:
        _mask_columns_outside_draft_vocab(spec.draft_logits, model.draft_id_to_target_id)
    if plan.backend == "reference":
        plan.reason = f"hybridspec's reference{topk_note or ' walk'} (torch, step by step; hybridspec.head_walk=reference)"
        status.record(COMPONENT, status.REFERENCE, plan.reason)
        return plan
    where = "on the GPU" if on_cuda else "as one program under the Triton interpreter"
    notes = []
    if plan.topk is None:  # the top-k walk gathers W2 rows as they are: fp8 does not apply to it
        if plan.w2_fp8:
            notes.append("fp8 W2: drafts may differ from vLLM's walk, output stays exact")
        elif config.head_walk_w2_dtype == "fp8":
            notes.append("fp8 W2 ignored off the GPU")
    if not plan.step_keyed_seeds and spec.draft_logits is not None:
        notes.append("one launch per step: this vLLM keys draft draws by the request seed alone")
    walk = "a bias table, then one program a batch row" if plan.topk is not None else f"residency {plan.residency}"
    plan.reason = f"megakernel{topk_note} {where}, {walk}" + "".join(f"; {note}" for note in notes)
    status.record(COMPONENT, status.ACTIVE, plan.reason)  # logs it
    return plan


def why_not(spec: Any, config: HybridSpecConfig) -> str | None:
    """Why this engine's DSpark walk stays vLLM's, or None when hybridspec's walk reproduces it."""
    release, changed = upstream.match_installed()
    if release is None:
        return f"this vLLM's DSpark walk differs from the releases the plugin was read against ({', '.join(changed)})"
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    if type(spec)._sample_logits is not DSparkSpeculator._sample_logits:
        return f"{type(spec).__name__} samples drafts its own way (_sample_logits)"
    model = spec.model
    if getattr(model, "sample_sequential", None) is not None:
        return f"the draft model ({type(model).__name__}) runs its own Markov sampling (sample_sequential)"
    if spec.draft_watermarker is not None:
        return "a draft watermarker samples the drafts"
    if hasattr(model, "apply_output_logit_transform"):
        return f"the draft model ({type(model).__name__}) transforms its output logits"
    if spec.draft_logits is not None and spec.use_fp64_gumbel:
        return "fp64 Gumbel sampling (use_fp64_gumbel)"
    reason = _why_not_head(model)
    if reason is not None:
        return reason
    topk = getattr(spec, "_draft_topk", None)
    if topk is not None:
        reason = _why_not_topk(model, topk)
        if reason is not None:
            return reason
    w1 = model.model.markov_head.markov_w1.weight
    dtypes = {w1.dtype} | ({spec.draft_logits.dtype} if spec.draft_logits is not None else set())
    if config.head_walk == "megakernel":
        reason = _why_kernel_cannot_run(w1.device)
        if reason is not None:
            return reason
        reason = _why_not_fp32_precision(model, w1)
        if reason is not None:
            return reason
        if w1.device.type != "cuda" and torch.bfloat16 in dtypes:
            return "bf16 under the Triton interpreter, which computes bf16 wrongly (use fp32 or fp16 on CPU)"
        if topk is not None:
            return _why_not_cache(spec, model)  # the top-k walk has no residency plan: one program a row
        from hybridspec_kernels.head_walk import plan_walk

        vocab, rank = model.logits_processor.org_vocab_size, w1.shape[1]
        w2_bytes = 1 if config.head_walk_w2_dtype == "fp8" else w1.element_size()
        try:
            # The plan's tiles depend on the batch width: every width a walk of this engine can take must fit, or
            # the first batch of that width would raise inside the engine step.
            for num_rows in _rows_of_every_width(spec.draft_tokens.shape[0]):
                plan_walk(vocab, rank, num_rows, w2_bytes, w1.device, residency=config.head_walk_residency)
        except ValueError as error:
            return f"hybridspec.head_walk_residency={config.head_walk_residency}: {error} (a walk of {num_rows} rows)"
    else:
        try:
            import hybridspec_kernels.head_walk.naive  # noqa: F401
        except ImportError as error:
            return f"the reference walk cannot load ({error})"
    return _why_not_cache(spec, model)


def _why_not_fp32_precision(model: Any, w1: torch.Tensor) -> str | None:
    """fp32 Markov products under a reduced torch float32 matmul precision (vLLM's VLLM_FLOAT32_MATMUL_PRECISION
    "high" / "medium"): vLLM's walk then multiplies in TF32 (or bf16), the kernels in fp32, and the drafts would
    differ by a rounding."""
    precision = torch.get_float32_matmul_precision()
    if _product_dtype(model, w1) == torch.float32 and precision != "highest":
        return (f"fp32 Markov products under torch's float32 matmul precision {precision!r} "
                "(VLLM_FLOAT32_MATMUL_PRECISION): vLLM's walk multiplies them at reduced precision, the kernels in "
                "fp32")
    return None


def _product_dtype(model: Any, w1: torch.Tensor) -> torch.dtype:
    """The dtype vLLM's walk projects the Markov embedding in: the logits processor's head dtype where it sets one."""
    head_dtype = getattr(model.logits_processor, "head_dtype", None)
    return w1.dtype if head_dtype in (None, w1.dtype) else head_dtype


def _rows_of_every_width(max_rows: int) -> list[int]:
    """One batch size per batch width (the kernel plan's block_rows: padded to 16, 32, 64 rows a launch) that walks
    of 1..max_rows rows take, and the one-row walk (its own forms)."""
    from hybridspec_kernels.head_walk.walk import BLOCK_ROWS_ALL, MAX_ROWS_PER_LAUNCH

    widest = max(1, min(max_rows, MAX_ROWS_PER_LAUNCH))
    return sorted({1} | {min(width, widest) for width in BLOCK_ROWS_ALL})


def _why_not_cache(spec: Any, model: Any) -> str | None:
    """Whether the draft logits cache rows hold every column the walk writes: each draft id's (no d2t), or every
    target id (d2t: the walk stores at target columns). vLLM's sampler asserts this; the walk would spill into the
    next step's or request's row."""
    cache = spec.draft_logits
    if cache is None:
        return None
    d2t = getattr(model, "draft_id_to_target_id", None)
    # W1's rows are the target vocabulary (vLLM's nn.Embedding(vocab_size, rank), not padded).
    width = (model.model.markov_head.markov_w1.weight.shape[0] if d2t is not None
             else model.logits_processor.org_vocab_size)
    if cache.shape[-1] < width:
        return (f"a draft logits cache of {cache.shape[-1]} columns for a {width}-token "
                f"{'target' if d2t is not None else 'draft'} vocabulary")
    return None


def _why_not_head(model: Any) -> str | None:
    """Whether the draft model's Markov head is vLLM's low-rank one, projected as the kernel does."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead, Qwen3DSparkForCausalLM

    head = getattr(getattr(model, "model", None), "markov_head", None)
    if head is None:
        return f"the draft model ({type(model).__name__}) has no Markov head"
    if not isinstance(head, DSparkMarkovHead) or any(
        getattr(type(head), name) is not getattr(DSparkMarkovHead, name) for name in ("embed", "bias")
    ):
        return f"a {type(head).__name__} Markov head (the kernel walks vLLM's low-rank DSparkMarkovHead)"
    for name in ("markov_embed", "markov_bias", "map_draft_to_target"):
        if not _same_code(getattr(type(model), name, None), getattr(Qwen3DSparkForCausalLM, name)):
            return f"the draft model's {name} is not vLLM's DSpark one"
    projection = head.markov_w2
    if type(projection.quant_method).__name__ != "UnquantizedEmbeddingMethod" or getattr(
        projection, "is_w4a16_nvfp4", False
    ):
        return f"a quantized Markov projection ({type(projection.quant_method).__name__})"
    if getattr(projection, "tp_size", 1) != 1:
        return "a tensor-parallel Markov projection"
    processor = model.logits_processor
    if any(getattr(type(processor), name, None) is not getattr(LogitsProcessor, name)
           for name in ("forward", "_get_logits", "_apply_head")):
        return f"a custom logits processor ({type(processor).__name__})"
    if processor.soft_cap is not None or processor.logits_as_input:
        return "logit soft-capping" if processor.soft_cap is not None else "logits_as_input"
    w1, w2 = head.markov_w1.weight, projection.weight
    rank, vocab = w1.shape[1], processor.org_vocab_size
    if w2.dim() != 2 or w2.shape[1] != rank or w2.shape[0] < vocab:
        return f"Markov weights of shapes {tuple(w1.shape)} / {tuple(w2.shape)} for a {vocab}-token vocabulary"
    if not (MIN_RANK <= rank <= MAX_RANK and rank & (rank - 1) == 0):
        return f"Markov rank {rank} (the kernel takes powers of two in [{MIN_RANK}, {MAX_RANK}])"
    if w1.dtype not in FLOAT_DTYPES or w2.dtype != w1.dtype:
        return f"Markov weights in {w1.dtype} / {w2.dtype}"
    if max(vocab, w1.shape[0]) > MAX_TOKENS:
        return f"a {max(vocab, w1.shape[0])}-token vocabulary (the kernel takes up to {MAX_TOKENS})"
    d2t = getattr(model, "draft_id_to_target_id", None)
    if d2t is not None and tuple(d2t.shape) != (vocab,):
        return f"a draft-to-target map of shape {tuple(d2t.shape)} for {vocab} draft tokens"
    return None


def _prepare_topk(plan: WalkPlan, spec: Any, model: Any) -> str | None:
    """Before the first top-k walk (vLLM's eager profile run, never inside a CUDA-graph capture): the rounding vLLM's
    gathered bias uses here, the cache rows made vLLM's dense top-k rows (-inf in every column its sampler writes:
    the draft vocabulary's, or every target column with a d2t), and the per-slot column records allocated. A reason to
    fall back, or None."""
    if spec.draft_logits is not None and spec.draft_logits.is_cuda and torch.cuda.is_current_stream_capturing():
        return "the top-k walk's first step came inside a CUDA-graph capture (its cache must be prepared eagerly)"
    rounding = _gathered_bias_rounding(model, plan.logits_dtype, plan.topk)
    if rounding is None:
        return "vLLM's gathered Markov bias rounds here in neither way the top-k kernel knows"
    plan.topk_round_dot = rounding
    cache, d2t = spec.draft_logits, model.draft_id_to_target_id
    if cache is not None and d2t is not None and cache.dtype != plan.logits_dtype:
        return (f"a {cache.dtype} draft logits cache with {plan.logits_dtype} logits and a d2t (vLLM samples the "
                f"cache-dtype copy)")
    vocab = model.logits_processor.org_vocab_size
    if cache is None and spec.acceptance_estimator is not None:
        cache = _estimator_cache(plan, spec, plan.logits_dtype, model.model.markov_head.markov_w1.weight.device,
                                 vocab if d2t is None else model.model.markov_head.markov_w1.weight.shape[0])
    elif cache is not None:
        cache[..., :cache.shape[-1] if d2t is not None else vocab].fill_(float("-inf"))  # only candidates are written
    if cache is not None:
        plan.topk_columns = torch.full((cache.shape[0], cache.shape[1], plan.topk), -1, dtype=torch.int64,
                                       device=cache.device)
    return None


def _gathered_bias_rounding(model: Any, dtype: torch.dtype, topk: int) -> bool | None:
    """Whether vLLM's `apply_markov_bias_gathered` rounds the scaled product to the logits' dtype before adding the
    base values (True: cuBLAS on the H200 at K a multiple of 8) or rounds the fp32 sum once (False: cuBLAS at K 100,
    torch on CPU; session 21), read off its result at this engine's K on random rows of this model's weights; None
    when neither reproduces >= 99 % of it (the rest: the order of the r products). For fp32 logits the two are the
    same: the kernel's default then."""
    from hybridspec_kernels.head_walk_topk.naive import default_round_dot

    head = model.model.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    vocab, device = model.logits_processor.org_vocab_size, w1.device
    default = default_round_dot(device, topk)
    if dtype == torch.float32:  # the kernel's products are fp32 already: the two forms are one
        return default
    gen = torch.Generator().manual_seed(0)
    rows, k = 8, min(topk, vocab)
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(rows)]).to(device)
    embed = w1[torch.randint(0, w1.shape[0], (rows,), generator=gen).to(device)]
    values = (torch.randn(rows, k, generator=gen) * 4).to(device=device, dtype=dtype)
    with torch.no_grad():
        got = model.apply_markov_bias_gathered(
            embed.to(dtype), torch.full((rows, vocab), float("-inf"), dtype=dtype, device=device), values, ids)
    got = got.gather(1, ids)
    product = torch.einsum("bkr,br->bk", w2[ids].double(), embed.double()) * model.logits_processor.scale
    share = {}
    for round_dot in (True, False):
        rounded = product.to(dtype).double() if round_dot else product
        share[round_dot] = float(((values.double() + rounded).to(dtype) == got).float().mean())
    if share[default] >= 0.99:
        return default
    return (not default) if share[not default] >= 0.99 else None


def _why_not_topk(model: Any, topk: int) -> str | None:
    """Whether vLLM's top-k walk is the one the top-k kernel reproduces, at a K it takes."""
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead, Qwen3DSparkForCausalLM

    from hybridspec_kernels.head_walk_topk import MAX_TOPK

    release, changed = upstream.match_installed(upstream.TOPK_PINNED)
    if release is None:
        return f"this vLLM's DSpark top-k walk differs from the releases the plugin was read against ({', '.join(changed)})"
    head = model.model.markov_head
    if getattr(type(head), "apply_bias_gathered", None) is not DSparkMarkovHead.apply_bias_gathered:
        return f"a {type(head).__name__} Markov head with its own gathered bias (apply_bias_gathered)"
    if not _same_code(getattr(type(model), "apply_markov_bias_gathered", None),
                      Qwen3DSparkForCausalLM.apply_markov_bias_gathered):
        return "the draft model's apply_markov_bias_gathered is not vLLM's DSpark one"
    vocab = model.logits_processor.org_vocab_size
    if not 1 <= topk <= min(MAX_TOPK, vocab):
        return f"dspark_draft_topk={topk} (the top-k walk takes 1..{min(MAX_TOPK, vocab)} here)"
    return None


def _why_kernel_cannot_run(device: torch.device) -> str | None:
    try:
        from hybridspec_kernels.head_walk.kernel import head_walk_kernel
    except ImportError as error:
        return f"Triton is not available ({error})"
    if device.type == "cuda" or type(head_walk_kernel).__name__ == "InterpretedFunction":
        return None
    return f"the megakernel needs a CUDA device or TRITON_INTERPRET=1 (the draft model is on {device})"


def _same_code(function: Any, reference: Any) -> bool:
    """Same body as vLLM's: other DSpark models repeat these one-liners, so compare the code, not the object."""
    code, want = getattr(function, "__code__", None), reference.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (
        want.co_code, want.co_names, want.co_consts)


def _fall_back(plan: WalkPlan, reason: str) -> None:
    plan.backend, plan.reason = None, reason
    logger.warning("hybridspec head_walk: vLLM's DSpark walk runs instead: %s", reason)
    status.record(COMPONENT, status.FALLBACK, reason)


def _backend(plan: WalkPlan) -> Callable[..., Any]:
    if plan.backend == "reference":
        return _reference_walk
    from hybridspec_kernels.head_walk import head_walk

    w2_dtype = torch.float8_e4m3fn if plan.w2_fp8 else None

    def megakernel(base_logits: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        # The kernel's exchange='auto' picks the exchange by batch size (choose_exchange, from the measured
        # ladder in eval/results/head_walk.json), the same choice its benchmark's headline rows time.
        d2t = kwargs.get("draft_to_target")
        if d2t is not None:
            kwargs["draft_to_target_increasing"] = _d2t_increasing(plan, d2t)
        head_walk(base_logits, *args, residency=plan.residency, w2_dtype=w2_dtype, exchange="auto", **kwargs)

    return megakernel


def _topk_backend(plan: WalkPlan) -> Callable[..., Any]:
    if plan.backend == "reference":
        return _reference_walk_topk
    from hybridspec_kernels import head_walk_topk as ops

    return ops.head_walk_topk


def _d2t_increasing(plan: WalkPlan, d2t: torch.Tensor) -> bool:
    """Whether d2t maps draft ids to strictly increasing target ids, as vLLM builds it from a sorted draft vocabulary:
    then the kernel keys rows by target id (the same order). The kernel's own check (one host read per d2t, which
    head_walk then finds cached), taken at the first walk outside CUDA-graph capture (vLLM's profile run, after the
    weights are loaded) and kept on the plan; during a capture before that, False (keys by draft id)."""
    if plan.d2t_increasing is None:
        from hybridspec_kernels.head_walk import draft_to_target_increases

        known = draft_to_target_increases(d2t, while_capturing=None)
        if known is None:
            return False
        plan.d2t_increasing = known
    return plan.d2t_increasing


def _draft_columns(plan: WalkPlan, d2t: torch.Tensor, vllm_columns: torch.Tensor | None = None) -> torch.Tensor:
    """Draft id -> target column (id + d2t[id]), made once and kept on the plan (vLLM's own scatter index where it
    keeps one: the same values)."""
    if plan.draft_columns is None:
        plan.draft_columns = (vllm_columns if vllm_columns is not None
                              else torch.arange(d2t.numel(), device=d2t.device) + d2t)
    return plan.draft_columns


def _reference_walk(base_logits, w1, w2, first_tokens, *, out, draft_logits=None, **kwargs) -> None:
    """`naive_head_walk` with the kernel's outputs: tokens into `out`, step logits into the cache."""
    from hybridspec_kernels.head_walk.naive import naive_head_walk

    tokens, logits, _ = naive_head_walk(base_logits, w1, w2, first_tokens, **kwargs)
    out.copy_(tokens)
    if draft_logits is not None:
        _store_logits(draft_logits, kwargs["req_indices"], logits, kwargs.get("draft_to_target"))


def _reference_walk_topk(values, candidates, w1, w2, first_tokens, *, out, draft_logits=None, cached_columns=None,
                         **kwargs) -> None:
    """`naive_head_walk_topk` with the kernel's outputs; the cache gets whole dense rows (-inf off the candidates)."""
    from hybridspec_kernels.head_walk_topk import dense_step_logits, naive_head_walk_topk

    tokens, corrected = naive_head_walk_topk(values, candidates, w1, w2, first_tokens, **kwargs)
    out.copy_(tokens)
    if draft_logits is not None:
        d2t = kwargs.get("draft_to_target")
        dense = dense_step_logits(corrected, candidates, w2.shape[0])  # draft columns, as _store_logits takes them
        _store_logits(draft_logits, kwargs["req_indices"], dense, d2t)


def _store_logits(cache: torch.Tensor, req: torch.Tensor, logits: torch.Tensor, d2t: torch.Tensor | None) -> None:
    """cache[req[b], k, target column of v] = logits[b, k, v]; rows with req -1 (padding) change nothing.

    A padding row cannot be skipped without a host sync, so it rewrites the first valid row's entries with that
    row's own values (equal duplicates keep index_put_ deterministic), or, with no valid row, slot 0 with what it
    already holds.
    """
    num_rows, num_steps, vocab = logits.shape
    device = logits.device
    columns = torch.arange(vocab, device=device)
    if d2t is not None:
        columns = columns + d2t
    valid = req >= 0
    first = torch.argmax(valid.to(torch.int8)).view(1)  # 1-D: indexing with a 0-D tensor reads it on the host
    rows = torch.where(valid, req, req.index_select(0, first)).clamp(min=0).long()
    values = torch.where(valid[:, None, None], logits, logits.index_select(0, first)).to(cache.dtype)
    index = (rows[:, None, None], torch.arange(num_steps, device=device)[None, :, None], columns[None, None, :])
    values = torch.where(valid.any(), values, cache[index])
    cache.index_put_(index, values)


def _mask_columns_outside_draft_vocab(cache: torch.Tensor, d2t: torch.Tensor) -> None:
    """vLLM caches a reduced-vocabulary draft's logits as whole target rows, -inf outside the draft vocabulary;
    the walk writes only the draft's columns, so the others are set to -inf once, here, for every slot."""
    outside = torch.ones(cache.shape[-1], dtype=torch.bool, device=cache.device)
    outside[torch.arange(d2t.shape[0], device=d2t.device) + d2t] = False
    cache.masked_fill_(outside, float("-inf"))


def _estimator_cache(plan: WalkPlan, spec: Any, dtype: torch.dtype, device: torch.device,
                     width: int) -> torch.Tensor:
    """Greedy drafting keeps no draft logits; the estimator still needs each step's, so the walk writes them here."""
    if plan.estimator_cache is None or plan.estimator_cache.shape[-1] < width:
        # -inf: the top-k walk writes only its candidates' columns (the full walk writes every column it reads).
        plan.estimator_cache = torch.full((spec.draft_tokens.shape[0], spec.num_speculative_steps, width),
                                          float("-inf"), dtype=dtype, device=device)
    return plan.estimator_cache


def _predict_acceptance(spec: Any, plan: WalkPlan, cache: torch.Tensor, idx_map: torch.Tensor, vocab: int,
                        d2t: torch.Tensor | None) -> None:
    """vLLM's per-step `_maybe_predict_acceptance(logits_k)` calls, with logits_k read back from the cache."""
    num_steps = idx_map.shape[1]
    step_logits = cache.index_select(0, idx_map[:, 0].clamp(min=0))[:, :num_steps]  # padding rows: ignored
    if d2t is None:
        step_logits = step_logits[..., :vocab]
    else:
        step_logits = step_logits.index_select(2, _draft_columns(plan, d2t, getattr(spec, "_d2t_scatter_index", None)))
    for step in range(num_steps):
        spec._maybe_predict_acceptance(step_logits[:, step], idx_map[:, step], spec._step_cols[step])


def _predict_confidence(spec: Any, sample_hidden: torch.Tensor, anchors: torch.Tensor, tokens: torch.Tensor) -> None:
    """The confidence head on the Markov embeddings the walk used: W1[anchor], then W1[previous draft]."""
    num_reqs, num_steps = tokens.shape
    previous = torch.cat([anchors.to(tokens.dtype)[:, None], tokens[:, :-1]], dim=1)
    embeds = spec.model.markov_embed(previous.reshape(-1))
    confidence = spec.model.compute_confidence(sample_hidden, embeds)
    spec.draft_token_confidence_probs[:num_reqs] = confidence.view(num_reqs, num_steps)
