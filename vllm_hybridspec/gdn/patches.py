"""The vLLM patches of block-parallel GDN verification (listed in `vllm_hybridspec.patches.ALL_PATCHES`).

register() applies only `UseBlockParallelGdnLayer`, whose target module is light. The runner hooks are
`on_demand`: the first block-parallel GDN layer applies them while the worker builds the model (the runner
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


class CommitAcceptedGdnStateV1(VllmPatch):
    target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states_after_model_execute"
    what = ("after rejection sampling (V1 runner), advances every block-parallel GDN layer's committed state by "
            "the accepted tokens; with prefix caching also writes the block-boundary states, skips vLLM's align "
            "post-copy and stores accepted count 1 for the next pre-forward copy; applied when the first "
            "block-parallel GDN layer is built")
    why = ("vLLM keeps K+1 per-token states and picks one next step; we keep one and rebuild it once acceptance "
           "is known, and the V1 runner has no hook there. With prefix caching vLLM's post-copy and its next "
           "pre-forward copy would read per-token state columns (token_bias = accepted - 1) that do not exist here")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def _update_states_after_model_execute(self, output_token_ids, scheduler_output):
            group = _group(self.vllm_config) if self.speculative_config and self.model_config.is_hybrid else None
            if group is None or self.cache_config.mamba_cache_mode != "align":
                original(self, output_token_ids, scheduler_output)
                if group is not None:
                    # `original` has just set num_accepted_tokens = valid sampled tokens of each batch row.
                    group.commit(self.num_accepted_tokens.gpu[: output_token_ids.size(0)])
                return
            # vLLM's own first line, then our commit in place of postprocess_mamba_align_gpu
            num_reqs = output_token_ids.size(0)
            self.num_accepted_tokens.gpu[:num_reqs] = (output_token_ids != -1).sum(dim=1)
            group.commit(self.num_accepted_tokens.gpu[:num_reqs])
            # The committed state is whole in the running block: preprocess_mamba must migrate it with
            # token_bias = num_accepted_tokens_cpu - 1 = 0.
            self.input_batch.num_accepted_tokens_cpu_tensor[:num_reqs].fill_(1)
            self.num_accepted_tokens_event.record()

        return _update_states_after_model_execute


class CommitAcceptedGdnStateMRV2(VllmPatch):
    target = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.postprocess_state"
    what = ("after rejection sampling (Model Runner V2), rebuilds the block-parallel GDN layers' committed states; "
            "with prefix caching also writes the block-boundary states, skips vLLM's align post-copy and keeps "
            "every accepted count at 1; applied when the first block-parallel GDN layer is built")
    why = ("same as CommitAcceptedGdnStateV1, at MRV2's model-state hook, which receives num_sampled; "
           "preprocess_state's migration reads its token offset from num_accepted_tokens_gpu")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def postprocess_state(self, idx_mapping, num_sampled, num_computed_tokens=None):
            group = _group(self.vllm_config)
            # vLLM stores max(num_sampled, 1) as the next step's accepted count; commit the same number of tokens.
            accepted = num_sampled if isinstance(num_sampled, int) else num_sampled.clamp(min=1)
            if group is None or not self._align_mode:
                original(self, idx_mapping, num_sampled, num_computed_tokens)
                if group is not None:
                    group.commit(accepted)
                return
            group.commit(accepted)
            # Every request's count stays 1 (new requests and boundary crossings set 1 too), so the pre-forward
            # migration copies the whole running state (token offset 0). No host sync, no -1 rows to skip.
            self.num_accepted_tokens_gpu.fill_(1)

        return postprocess_state


GDN_PATCHES: list[type[VllmPatch]] = [UseBlockParallelGdnLayer, CommitAcceptedGdnStateV1, CommitAcceptedGdnStateMRV2]


def apply_commit_hooks() -> None:
    """Applies the runner hooks (idempotent); called by each block-parallel GDN layer."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from vllm_hybridspec.versions import SKIP_VERSION_CHECK_ENV, installed_vllm

    version = Version(installed_vllm()[1])
    with _register_lock:
        for patch in (CommitAcceptedGdnStateV1, CommitAcceptedGdnStateMRV2):
            if patch.is_applied():
                continue
            if version not in SpecifierSet(patch.vllm_versions) and os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
                raise RuntimeError(f"{patch.__name__} was written for vLLM {patch.vllm_versions}, this is {version}")
            patch.apply()
            logger.debug("hybridspec: applied %s", patch.__name__)
