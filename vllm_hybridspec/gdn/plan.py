"""Whether an engine runs block-parallel GDN verification, and why not when it does not.

Cheap and import-light: called from layer construction and from the runner hooks, in every worker.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vllm_hybridspec import status
from vllm_hybridspec.config import hybridspec_config_from_vllm_config

logger = logging.getLogger("vllm.hybridspec")

COMPONENT = "gdn_verify"
MAX_VERIFY_LEN = 32  # hybridspec_kernels.gdn_verify.MAX_VERIFY_LEN (not imported: keeps this module light)


@dataclass(frozen=True)
class BlockParallelPlan:
    max_verify_len: int   # widest verified request: 1 + num_speculative_tokens (vLLM's max_decode_query_len)
    max_requests: int     # rows of the per-step workspace: scheduler max_num_seqs
    use_kernels: bool     # Triton kernels (CUDA) or the naive torch reference (anything else)
    prefix_caching: bool = False  # vLLM's "align" mamba cache mode: a state per KV block


def block_parallel_plan(vllm_config: Any, record: bool = True) -> BlockParallelPlan | None:
    """The plan for this engine, or None when vLLM's own GDN path runs (the reason goes to `status`)."""
    config = hybridspec_config_from_vllm_config(vllm_config)
    if config is None or config.gdn_verify != "block_parallel":
        return None
    reason = _unsupported_reason(vllm_config)
    if reason is not None:
        if record:
            logger.warning("hybridspec.gdn_verify=block_parallel falls back to vLLM's GDN path: %s", reason)
            status.record(COMPONENT, status.FALLBACK, reason)
        return None
    from vllm.platforms import current_platform
    from vllm.v1.attention.backend import max_decode_query_len

    return BlockParallelPlan(
        max_verify_len=max_decode_query_len(vllm_config),
        max_requests=vllm_config.scheduler_config.max_num_seqs,
        use_kernels=current_platform.is_cuda(),
        prefix_caching=getattr(vllm_config.cache_config, "mamba_cache_mode", "none") == "align",
    )


def _unsupported_reason(vllm_config: Any) -> str | None:
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() or current_platform.is_cpu()):
        # ROCm's AITER and XPU's SYCL GDN paths bypass the layer core this replaces.
        return f"platform {current_platform.device_name} (CUDA and CPU only)"
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or not speculative.num_speculative_tokens:
        return "no speculative decoding"
    from vllm.v1.attention.backend import max_decode_query_len

    if max_decode_query_len(vllm_config) > MAX_VERIFY_LEN:
        return f"verify length {max_decode_query_len(vllm_config)} above the kernels' {MAX_VERIFY_LEN}"
    cache = vllm_config.cache_config
    if getattr(cache, "mamba_cache_mode", "none") not in ("none", "align"):
        # "align" (prefix caching) is handled: the commit writes block-boundary states (gdn/step.py)
        return f"mamba_cache_mode={cache.mamba_cache_mode} (none and align only)"
    if getattr(cache, "use_replayssm", False) or getattr(cache, "use_kda_recoverssm", False):
        return "vLLM's ReplaySSM / RecoverSSM is enabled"
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return "pipeline parallelism (the accepted-state hook runs on the last rank only)"
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    if is_conv_state_dim_first():
        return "VLLM_SSM_CONV_STATE_LAYOUT=DS (the kernels read the default SD conv layout)"
    return None


def record_active(plan: BlockParallelPlan) -> None:
    detail = f"block_parallel, 1 ssm state per request, verify length <= {plan.max_verify_len}"
    if plan.prefix_caching:
        detail += ", prefix caching (block-boundary states written at commit)"
    if plan.use_kernels:
        status.record(COMPONENT, status.ACTIVE, detail + ", Triton kernels")
    else:
        status.record(COMPONENT, status.REFERENCE, detail + ", naive torch reference (no CUDA GPU)")
