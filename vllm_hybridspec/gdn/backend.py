"""vLLM's GDN attention backend, as the block-parallel layers use it.

The metadata is vLLM's own: with `num_speculative_blocks = 0` each request's block-table row holds one state
slot, so the builder's `spec_state_indices_tensor` (block_table[:, :K+1]) comes out one column wide and its
column 0 is the committed slot. What changes is what the backend promises:

- `supports_device_cpu_query_lens_mismatch()` is true. Verification reads each spec row's token range from the
  device `spec_query_start_loc` (the builder derives it from the device query_start_loc), never from host
  lengths, and no per-token state slot depends on the host's idea of a row's length. This is what lets vLLM's
  adaptive verification (which trims drafts on device) run on GDN targets.
- `get_varlen_cudagraph_max_query_len()` is the verify length: the kernels take device cu_seqlens with a static
  maximum, so one FULL decode graph replays any mix of 1..K+1 tokens per request (padding rows have slot 0).

With prefix caching ("align" mode) vLLM's builder already picks the running block's slot (block of the last
scheduled token); ours also records, per spec row, the computed-token count and the group's block-table row, from
which the commit finds the block-boundary states to write (step.py, `checkpoints`).

Only layers whose engine enables block-parallel verification return this backend (`get_attn_backend`); vLLM's
registry entry for GDN_ATTN is untouched.
"""
from __future__ import annotations

import functools
from dataclasses import replace


@functools.cache
def block_parallel_backend_class() -> type:
    from vllm.v1.attention.backend import max_decode_query_len
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend, GDNAttentionMetadataBuilder

    from vllm_hybridspec.gdn import kernel_path
    from vllm_hybridspec.gdn.step import block_checkpoints, check_prefix_caching_layers, group_for, verified_rows

    class BlockParallelGDNMetadataBuilder(GDNAttentionMetadataBuilder):
        """vLLM's builder; also hands each step's spec rows to the layer group for the commit."""

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            self.gdn_group = group_for(vllm_config.compilation_config.static_forward_context)
            if self.gdn_group is None:
                raise RuntimeError("BlockParallelGDNMetadataBuilder built for a model without block-parallel GDN layers")
            self.kv_group = self.gdn_group.add_kv_group(layer_names)
            # vLLM enables MRV2's per-group block-table swap only for its own builder class (it excludes KDA's
            # subclasses, whose metadata is per group); ours is vLLM's metadata unchanged, so it qualifies.
            if vllm_config.use_v2_model_runner and device.type == "cuda" and not self.supports_update_block_table:
                self.supports_update_block_table = True
                self.mamba_aligned_state_indices = None
            self.align_mode = vllm_config.cache_config.mamba_cache_mode == "align"
            if self.align_mode:
                check_prefix_caching_layers(vllm_config.compilation_config.static_forward_context, self.gdn_group)

        def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
            kernel_path.sync_conv_weight_copies()  # before this step's forward, graph replays included
            metadata = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
            rows = verified_rows(metadata)
            if rows is not None and self.align_mode:
                m = common_attn_metadata
                query_lens = m.query_start_loc[1 : m.num_reqs + 1] - m.query_start_loc[: m.num_reqs]
                computed = m.seq_lens[: m.num_reqs] - query_lens
                rows = replace(rows, blocks=block_checkpoints(rows, m.block_table_tensor[: m.num_reqs], computed,
                                                              self.kv_cache_spec.block_size))
            self.gdn_group.record(self.kv_group, rows)
            return metadata

        def update_block_table(self, metadata, blk_table, slot_mapping):
            """MRV2 (CUDA): this group reuses another group's metadata of the same step with its own block table."""
            updated = super().update_block_table(metadata, blk_table, slot_mapping)
            rows = verified_rows(updated)
            if rows is not None and self.align_mode:
                computed = self.gdn_group.step_computed()
                if computed is None:
                    raise RuntimeError("GDN metadata reused before any GDN group of the step recorded its rows")
                rows = replace(rows, blocks=replace(computed, block_table=blk_table.index_select(
                    0, rows.batch_rows.clamp(max=blk_table.shape[0] - 1))))
            self.gdn_group.record(self.kv_group, rows)
            return updated

        @classmethod
        def get_varlen_cudagraph_max_query_len(cls, vllm_config, kv_cache_spec) -> int | None:
            return max_decode_query_len(vllm_config)

    class BlockParallelGDNBackend(GDNAttentionBackend):
        @staticmethod
        def get_builder_cls() -> type:
            return BlockParallelGDNMetadataBuilder

        @classmethod
        def supports_device_cpu_query_lens_mismatch(cls) -> bool:
            return True

    return BlockParallelGDNBackend
