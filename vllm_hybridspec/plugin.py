"""vLLM general-plugin entry point (`vllm.general_plugins: hybridspec`) and the engine-config check.

vLLM calls `register()` in every process it starts (the `LLM()` / API-server process, the engine core, each
worker, the model-inspection subprocess), possibly more than once. It only installs patches; each patch is a
no-op unless the engine's `additional_config` has `hybridspec: {enabled: true}`.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from vllm_hybridspec import status
from vllm_hybridspec.config import HybridSpecConfig, hybridspec_config_from_vllm_config

logger = logging.getLogger("vllm.hybridspec")

# Architectures whose linear-attention layers are Gated DeltaNet (vLLM's QwenGatedDeltaNetAttention).
GDN_ARCHITECTURE_PREFIXES = ("Qwen3Next", "Qwen3_5")

_register_lock = threading.Lock()
_registered = False


def register() -> None:
    global _registered
    with _register_lock:
        if _registered:
            return
        from vllm_hybridspec import __version__
        from vllm_hybridspec.patches import apply_all

        applied = apply_all()
        from vllm_hybridspec.head_walk.patches import apply_on_import

        apply_on_import()  # the DSpark walk patch, once a worker imports Model Runner V2's DSpark speculator
        from vllm_hybridspec.adaptive.patches import apply_on_import as apply_adaptive_on_import

        apply_adaptive_on_import()  # the adaptive-length runner patches, once a worker imports Model Runner V2
        _registered = True
    logger.info(
        "vllm-hybridspec %s registered in process %d (%d patches)", __version__, os.getpid(), len(applied)
    )


def check_engine_config(vllm_config: Any) -> HybridSpecConfig | None:
    """Runs while vLLM builds its VllmConfig, before any engine process starts.

    Raises ValueError for a malformed `hybridspec` section and RuntimeError for an unsupported vLLM; records
    in `status` which components the engine asked for and which fall back to plain vLLM.
    """
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is not None and getattr(model_config, "is_submodel_config", False):
        return None  # a view of an already-checked config
    config = hybridspec_config_from_vllm_config(vllm_config)
    if config is None:
        return None
    from vllm_hybridspec.versions import check_vllm_version

    check_vllm_version()
    plan_components(vllm_config, config)
    return config


def model_has_gdn_layers(model_config: Any) -> bool:
    if model_config is None:
        return False
    architectures = getattr(model_config, "architectures", None) or []
    if not any(arch.startswith(GDN_ARCHITECTURE_PREFIXES) for arch in architectures):
        return False
    layer_types = getattr(model_config.hf_text_config, "layer_types", None)
    return layer_types is None or "linear_attention" in layer_types


def model_has_moe_router(model_config: Any) -> bool:
    from vllm_hybridspec.routing_wiring.step import has_moe_router

    hf_config = getattr(model_config, "hf_text_config", None)
    return hf_config is not None and has_moe_router(hf_config)


def _has_cuda_gpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda_alike()


def plan_components(vllm_config: Any, config: HybridSpecConfig) -> None:
    """Records what each component will do for this engine; the runtime code overwrites it with what it did."""
    status.plan("config", status.ACTIVE)
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or not speculative.num_speculative_tokens:
        logger.warning("hybridspec is enabled but the engine does not use speculative decoding: nothing to do")
        for component in ("head_walk", "gdn_verify", "verify_length", "routing_correction"):
            status.plan(component, status.OFF, "no speculative decoding")
        return
    model_config = getattr(vllm_config, "model_config", None)
    no_gpu = "" if _has_cuda_gpu() else ", reference path (no CUDA GPU)"

    if speculative.method != "dspark":
        status.plan("head_walk", status.OFF, f"the {speculative.method} drafter has no serial head")
    else:
        status.plan("head_walk", status.REQUESTED, f"{config.head_walk}{no_gpu}")

    if config.gdn_verify == "vllm":
        status.plan("gdn_verify", status.OFF, "vLLM's GDN kernels (hybridspec.gdn_verify=vllm)")
    elif not model_has_gdn_layers(model_config):
        architecture = getattr(model_config, "architecture", None)
        logger.warning(
            "hybridspec is enabled but the model (%s) has no Gated DeltaNet layers: GDN-specific parts fall back "
            "to plain vLLM", architecture
        )
        status.plan("gdn_verify", status.FALLBACK, f"model {architecture} has no GDN layers")
    else:
        status.plan("gdn_verify", status.REQUESTED, f"{config.gdn_verify}{no_gpu}")

    max_length = config.max_verify_length_for(speculative.num_speculative_tokens)
    if config.verify_length == "fixed":
        # every draft is verified: min / max_verify_length and the device cut act on adaptive lengths only
        ignored = [key for key, given in (("min_verify_length", "min_verify_length" in config.model_fields_set),
                                          ("max_verify_length", config.max_verify_length is not None),
                                          ("device_verify_length", config.device_verify_length)) if given]
        if ignored:
            logger.warning("hybridspec.%s: ignored with verify_length 'fixed' (every draft is verified)",
                           ", hybridspec.".join(ignored))
        status.plan("verify_length", status.OFF, f"fixed at {speculative.num_speculative_tokens}")
    else:
        status.plan("verify_length", status.REQUESTED, f"adaptive in [{config.min_verify_length}, {max_length}]")
        status.plan("latency_profile", status.REQUESTED, config.latency_profile)

    if not config.routing_correction:
        status.plan("routing_correction", status.OFF)
    elif not model_has_moe_router(model_config):
        logger.warning("hybridspec.routing_correction is on but the model has no MoE router: ignored")
        status.plan("routing_correction", status.FALLBACK, "model has no MoE router")
    else:
        status.plan("routing_correction", status.REQUESTED, f"threshold {config.routing_correction_threshold}")
