"""The vLLM patches of block-parallel GDN verification (listed in `vllm_hybridspec.patches.ALL_PATCHES`).

register() applies only `UseBlockParallelGdnLayer`, whose target module is light. The runner hooks (commit after
rejection sampling; step start: finished/preempted requests; MRV2: the batch's request ids) are `on_demand`: the
first block-parallel GDN layer applies them while the worker builds the model (the runner
modules are loaded by then), so processes and engines that never enable the path never import or patch them.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from vllm_hybridspec.patches.base import VllmPatch

logger = logging.getLogger("vllm.hybridspec")

_GDN_LAYER_NAME = "QwenGatedDeltaNetAttention"


class UseBlockParallelGdnLayer(VllmPatch):
    target = "vllm.model_executor.custom_op:PluggableLayer.__new__"
    what = ("at the first QwenGatedDeltaNetAttention a model builds, registers BlockParallelGatedDeltaNet as its "
            "out-of-tree replacement (PluggableLayer.register_oot)")
    why = ("the replacement keeps one state slot per request and verifies drafts block-parallel; registering it "
           "lazily keeps register() from importing model code. Each instance acts only for engines with "
           "hybridspec.gdn_verify=block_parallel and is vLLM's layer otherwise")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def __new__(cls, *args, **kwargs):
            if cls.__name__ == _GDN_LAYER_NAME:
                _register_layer(cls)
            return original(cls, *args, **kwargs)

        return __new__

    @classmethod
    def revert(cls) -> None:
        from vllm.model_executor.custom_op import op_registry_oot

        super().revert()
        registered = op_registry_oot.get(_GDN_LAYER_NAME)
        if registered is not None and registered.__module__ == "vllm_hybridspec.gdn.layer":
            del op_registry_oot[_GDN_LAYER_NAME]


_register_lock = threading.Lock()


def _register_layer(vllm_layer: type) -> None:
    from vllm.model_executor.custom_op import op_registry_oot

    with _register_lock:
        if _GDN_LAYER_NAME in op_registry_oot:
            return  # ours already, or another plugin's replacement, which we leave in place
        from vllm_hybridspec.gdn.layer import block_parallel_gdn_class

        vllm_layer.register_oot(block_parallel_gdn_class())


def _group(vllm_config: Any):
    from vllm_hybridspec.gdn.step import group_for

    return group_for(vllm_config.compilation_config.static_forward_context)


def _commit(vllm_config: Any, accepted: Any) -> None:
    group = _group(vllm_config)
    if group is not None:
        group.commit(accepted)


def _gone_req_ids(scheduler_output: Any) -> set[str]:
    return set(scheduler_output.finished_req_ids) | set(getattr(scheduler_output, "preempted_req_ids", None) or ())


class StartGdnStepV1(VllmPatch):
    target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states"
    what = ("when a step starts (V1 runner), tells the block-parallel GDN layers which requests finished or were "
            "preempted, and where the batch's request ids are; applied when the first block-parallel GDN layer "
            "is built")
    why = ("the last commit's ssm states are folded into the next verify; a row whose request is gone must not "
           "be flushed, because vLLM may have handed its block to another request and zeroed it, and the "
           "metadata builder that flushes sees slots, not requests")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def _update_states(self, scheduler_output):
            group = _group(self.vllm_config)
            if group is not None:
                group.start_step(_gone_req_ids(scheduler_output), lambda: self.input_batch.req_ids)
            return original(self, scheduler_output)

        return _update_states


class StartGdnStepMRV2(VllmPatch):
    target = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.finish_requests"
    what = ("when a step starts (Model Runner V2), tells the block-parallel GDN layers which requests finished or "
            "were preempted; applied when the first block-parallel GDN layer is built")
    why = "same as StartGdnStepV1, at the MRV2 method that receives the step's finished and preempted requests"
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def finish_requests(self, scheduler_output):
            group = _group(self.vllm_config)
            if group is not None:
                group.start_step(_gone_req_ids(scheduler_output))
            return original(self, scheduler_output)

        return finish_requests


class GdnBatchRequestsMRV2(VllmPatch):
    target = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.prepare_attn"
    what = ("before Model Runner V2 builds a batch's attention metadata, hands the batch's request ids to the "
            "block-parallel GDN layers; applied when the first block-parallel GDN layer is built")
    why = "the GDN metadata builder records each spec row's request (see StartGdnStepV1); MRV2 keeps it in the batch"
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def prepare_attn(self, input_batch, *args, **kwargs):
            group = _group(self.vllm_config)
            if group is not None:
                req_ids = input_batch.req_ids
                group.batch_req_ids = lambda: req_ids
            return original(self, input_batch, *args, **kwargs)

        return prepare_attn


class CommitAcceptedGdnStateV1(VllmPatch):
    target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states_after_model_execute"
    what = ("after rejection sampling (V1 runner), advances every block-parallel GDN layer's committed state by "
            "the accepted tokens; applied when the first block-parallel GDN layer is built")
    why = ("vLLM keeps K+1 per-token states and picks one next step; we keep one and rebuild it once acceptance "
           "is known, and the V1 runner has no hook there")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def _update_states_after_model_execute(self, output_token_ids, scheduler_output):
            original(self, output_token_ids, scheduler_output)
            if self.speculative_config and self.model_config.is_hybrid:
                # `original` has just set num_accepted_tokens = valid sampled tokens of each batch row.
                _commit(self.vllm_config, self.num_accepted_tokens.gpu[: output_token_ids.size(0)])

        return _update_states_after_model_execute


class CommitAcceptedGdnStateMRV2(VllmPatch):
    target = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.postprocess_state"
    what = ("after rejection sampling (Model Runner V2), rebuilds the block-parallel GDN layers' committed states; "
            "applied when the first block-parallel GDN layer is built")
    why = "same as CommitAcceptedGdnStateV1, at MRV2's model-state hook, which receives num_sampled"
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def postprocess_state(self, idx_mapping, num_sampled, num_computed_tokens=None):
            original(self, idx_mapping, num_sampled, num_computed_tokens)
            # vLLM stores max(num_sampled, 1) as the next step's accepted count; commit the same number of tokens.
            _commit(self.vllm_config, num_sampled if isinstance(num_sampled, int) else num_sampled.clamp(min=1))

        return postprocess_state


_RUNNER_HOOKS: list[type[VllmPatch]] = [
    CommitAcceptedGdnStateV1, StartGdnStepV1, CommitAcceptedGdnStateMRV2, StartGdnStepMRV2, GdnBatchRequestsMRV2,
]
GDN_PATCHES: list[type[VllmPatch]] = [UseBlockParallelGdnLayer, *_RUNNER_HOOKS]


def apply_commit_hooks() -> None:
    """Applies the runner hooks (idempotent); called by each block-parallel GDN layer."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from vllm_hybridspec.versions import SKIP_VERSION_CHECK_ENV, installed_vllm

    version = Version(installed_vllm()[1])
    with _register_lock:
        for patch in _RUNNER_HOOKS:
            if patch.is_applied():
                continue
            if version not in SpecifierSet(patch.vllm_versions) and os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
                raise RuntimeError(f"{patch.__name__} was written for vLLM {patch.vllm_versions}, this is {version}")
            patch.apply()
            logger.debug("hybridspec: applied %s", patch.__name__)
