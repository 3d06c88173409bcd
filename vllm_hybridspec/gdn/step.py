"""The block-parallel GDN layers of one model, and the verified rows that await their accepted counts.

Every block-parallel GDN layer of a model joins one `GDNLayerGroup`, found through the model's
`static_forward_context` (which the metadata builders and the runner hooks reach too).

vLLM splits a model's GDN layers into KV-cache groups (strided: group i = GDN layers i, i+G, ...), each with its
own block table and metadata builder, so a request's state slot differs between groups. Each step:
1. each group's metadata builder records the step's spec rows for its layers (`record`): slots, cu_seqlens and
   batch positions. Builders run every step, also when a FULL CUDA graph replays the forward, which is why the
   rows are taken here and not in the layer's forward.
2. each layer's forward verifies those rows from the committed states (kernel: into the workspace, laid out
   group-major so that a KV-cache group's layers are consecutive).
3. after rejection sampling a runner hook calls `commit(accepted)`: one `gdn_reconstruct` launch per KV-cache
   group (one for the tiny models, 3 for Qwen3-Next-80B / Qwen3.5-35B), or the reference replay per layer.
A step without spec rows records None, so nothing stale (e.g. from a dummy or capture run) is ever committed.

Prefix caching (vLLM's "align" mamba cache mode): a GDN state is kept per KV block, and block b must hold the
state after exactly (b + 1) * block_size tokens once those tokens are computed, since a later prefix-cache hit
restores it. The running state lives in the block of the step's last scheduled token (vLLM's choice; its
pre-forward copy moves it along, which the runner hooks keep at token offset 0 for our single state). When a
row's accepted tokens reach a block boundary, the commit also writes the state at that boundary into the block
ending there (`checkpoints`): slot and token count come from the rows' computed-token counts, the accepted counts
and the block table, all on the device.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from vllm_hybridspec.gdn.plan import BlockParallelPlan


@dataclass
class GDNCounters:
    """Per-process counters of the block-parallel path (tests and the demo read them)."""

    verify_calls: int = 0       # layer forwards that verified spec rows (eager forwards only)
    commits: int = 0            # steps whose accepted states were rebuilt
    reconstructions: int = 0    # reconstruct calls (kernel: one per KV-cache group; reference: one per layer)
    committed_tokens: int = 0   # tokens committed, summed over layers (reference path only: counting syncs)
    mixed_batches: int = 0      # layer forwards whose batch had non-spec rows (prefill chunks) beside spec rows
    checkpoint_commits: int = 0   # KV-cache-group commits that could write block-boundary states (prefix caching)
    checkpoints_written: int = 0  # block-boundary states written, summed over layers (reference path only)

    def reset(self) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, 0)


COUNTERS = GDNCounters()


@dataclass(frozen=True)
class VerifiedRows:
    """One KV-cache group's spec rows of the current step."""

    state_indices: torch.Tensor  # [R] int32 committed-state slot per spec row (0 = vLLM's null block)
    cu_seqlens: torch.Tensor     # [R+1] int32: verified tokens of spec row r are cu[r]:cu[r+1]
    batch_rows: torch.Tensor     # [R] long: batch position of each spec row (its row in the sampler output)
    blocks: BlockCheckpoints | None = None  # prefix caching ("align" mode) only


@dataclass(frozen=True)
class BlockCheckpoints:
    """What the commit needs to write block-boundary states (prefix caching), per spec row, on the device."""

    computed: torch.Tensor     # [R] int32 tokens computed before this step (the verified block starts there)
    block_table: torch.Tensor  # [R, max_blocks] int32 the row's KV-cache block ids of this group (0 = null)
    block_size: int            # tokens per block (vLLM's mamba_block_size)


def verified_rows(metadata: Any) -> VerifiedRows | None:
    """The spec rows of vLLM's GDNAttentionMetadata, as the layers verify them; None without spec rows."""
    if metadata.spec_sequence_masks is None:
        return None
    state_indices = metadata.spec_state_indices_tensor[:, 0].contiguous()
    num_rows = state_indices.shape[0]
    device = state_indices.device
    if metadata.num_prefills == 0 and metadata.num_decodes == 0:
        # spec rows lead the batch; FULL-cudagraph padding rows (slot 0, no tokens) trail it
        batch_rows = torch.arange(num_rows, device=device)
    else:
        batch_rows = metadata.spec_sequence_masks_cpu.nonzero().flatten().to(device, non_blocking=True)
    return VerifiedRows(state_indices, metadata.spec_query_start_loc[: num_rows + 1], batch_rows)


def block_checkpoints(rows: VerifiedRows, block_table: torch.Tensor, computed: torch.Tensor,
                      block_size: int) -> BlockCheckpoints:
    """The spec rows' block-table rows and computed-token counts, gathered from the batch's ([num_reqs, ...]).

    Padding rows past the batch (FULL cudagraphs; slot 0, never committed) read the batch's last row."""
    last = block_table.shape[0] - 1
    batch_rows = rows.batch_rows.clamp(max=max(last, 0))
    return BlockCheckpoints(
        computed=computed.index_select(0, batch_rows).to(torch.int32),
        block_table=block_table.index_select(0, batch_rows),
        block_size=block_size,
    )


def checkpoints(blocks: BlockCheckpoints, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot, tokens) per spec row of the block-boundary state to write: the last boundary b * block_size within
    the row's committed tokens (computed, computed + accepted], its slot block_table[b - 1] and the tokens of this
    step up to it; slot 0 (none) when no boundary was reached. The same rule as vLLM's align post-copy
    (`postprocess_mamba_fused_kernel`), which copies one of its per-token states there instead."""
    boundary = (blocks.computed + accepted) // blocks.block_size * blocks.block_size
    reached = (boundary > blocks.computed) & (accepted > 0)
    column = (boundary // blocks.block_size - 1).clamp(min=0, max=blocks.block_table.shape[1] - 1)
    slots = blocks.block_table.gather(1, column.long()[:, None])[:, 0]
    zero = torch.zeros_like(accepted)
    return torch.where(reached, slots.to(accepted.dtype), zero), torch.where(reached, boundary - blocks.computed, zero)


class GDNLayerGroup:
    def __init__(self, plan: BlockParallelPlan, num_layers: int):
        self.plan = plan
        self.num_layers = num_layers
        self.layers: list[Any] = []
        self.workspace = None  # GDNVerifyWorkspace with a layer dimension (kernel path), group-major layer order
        self.kv_groups: list[list[int]] = []       # KV-cache group -> its layers (indices into self.layers)
        self.kv_group_of: dict[int, int] = {}      # layer -> KV-cache group
        self.workspace_row: dict[int, int] = {}    # layer -> its index in the workspace's layer dimension
        self.pending: dict[int, VerifiedRows | None] = {}  # KV-cache group -> this step's spec rows
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # reference: layer -> x, a, b
        self._state_tables: dict[int, Any] = {}

    def add_layer(self, layer: Any) -> int:
        if len(self.layers) >= self.num_layers:
            raise RuntimeError(f"more GDN layers than the {self.num_layers} the model config declares")
        self.layers.append(layer)
        return len(self.layers) - 1

    def allocate_workspace(self, layer: Any, device: torch.device, input_dtype: torch.dtype) -> None:
        """Allocated while the model is built, so that vLLM's memory profiling counts it outside the KV cache."""
        if self.workspace is not None or not self.plan.use_kernels:
            return
        from hybridspec_kernels.gdn_verify import GDNVerifyWorkspace

        tp = layer.tp_size
        self.workspace = GDNVerifyWorkspace.allocate(
            self.num_layers, self.plan.max_requests, self.plan.max_verify_len,
            layer.num_k_heads // tp, layer.num_v_heads // tp, layer.head_k_dim, layer.head_v_dim,
            input_dtype=input_dtype, device=device,
        )

    def add_kv_group(self, layer_names: list[str]) -> int:
        """Called by each metadata builder: its layers share a block table. Returns the KV-cache group id."""
        members = [i for i, layer in enumerate(self.layers) if layer.prefix in set(layer_names)]
        if not members:
            raise RuntimeError(f"no block-parallel GDN layer among {layer_names}")
        if members in self.kv_groups:  # another builder of the same group (micro-batching)
            return self.kv_groups.index(members)
        if any(i in self.kv_group_of for i in members):
            raise RuntimeError(f"GDN layers {layer_names} are split differently between metadata builders")
        kv_group = len(self.kv_groups)
        self.kv_groups.append(members)
        for i in members:
            self.kv_group_of[i] = kv_group
            self.workspace_row[i] = len(self.workspace_row)
        return kv_group

    def workspace_of(self, layer_index: int):
        return self.workspace.layer(self.workspace_row[layer_index])

    def record(self, kv_group: int, rows: VerifiedRows | None) -> None:
        self.pending[kv_group] = rows

    def step_computed(self) -> BlockCheckpoints | None:
        """The block checkpoints a builder recorded this step (rows and computed counts are the batch's, the block
        table its group's), for a group that reuses that builder's metadata."""
        return next((rows.blocks for rows in self.pending.values() if rows is not None and rows.blocks is not None),
                    None)

    def commit(self, accepted_per_batch_row: torch.Tensor | int) -> None:
        """Advance every layer's committed state of this step's spec rows by their accepted tokens.

        `accepted_per_batch_row`: [num_reqs] tokens of each batch row's verified block to commit (vLLM's
        num_accepted_tokens / num_sampled: accepted drafts + 1), or one int for all rows.
        """
        pending, self.pending = self.pending, {}
        if not any(rows is not None for rows in pending.values()):
            return
        COUNTERS.commits += 1
        for kv_group, rows in pending.items():
            if rows is None:
                continue
            accepted = _accepted_per_spec_row(rows, accepted_per_batch_row)
            boundary = None if rows.blocks is None else checkpoints(rows.blocks, accepted)
            if boundary is not None:
                COUNTERS.checkpoint_commits += 1
            if self.plan.use_kernels:
                self._reconstruct_kernel(kv_group, rows, accepted, boundary)
            else:
                self._reconstruct_reference(kv_group, rows, accepted, boundary)

    def _reconstruct_kernel(self, kv_group: int, rows: VerifiedRows, accepted: torch.Tensor, boundary) -> None:
        from hybridspec_kernels.gdn_verify import GDNStateTable, GDNVerifyWorkspace, gdn_reconstruct

        members = self.kv_groups[kv_group]
        table = self._state_tables.get(kv_group)
        if table is None or table.ssm_states[0].data_ptr() != self.layers[members[0]].kv_cache[1].data_ptr():
            table = self._state_tables[kv_group] = GDNStateTable(
                [self.layers[i].kv_cache[1] for i in members],
                [self.layers[i].kv_cache[0] for i in members],
                self.layers[members[0]].conv_kernel_size,
            )
        start = self.workspace_row[members[0]]
        stop = start + len(members)
        ws = self.workspace
        workspace = GDNVerifyWorkspace(ws.u[start:stop], ws.k[start:stop], ws.g[start:stop], ws.x[start:stop])
        checkpoint_indices, checkpoint_lens = (None, None) if boundary is None else boundary
        gdn_reconstruct(table, workspace, rows.state_indices, accepted, rows.cu_seqlens,
                        checkpoint_indices=checkpoint_indices, checkpoint_lens=checkpoint_lens)
        COUNTERS.reconstructions += 1

    def _reconstruct_reference(self, kv_group: int, rows: VerifiedRows, accepted: torch.Tensor, boundary) -> None:
        from vllm_hybridspec.gdn.reference import reference_reconstruct

        committed = int(accepted.clamp(min=0).sum())
        if boundary is not None:  # the reference path syncs anyway; counting boundary states costs nothing more
            COUNTERS.checkpoints_written += int((boundary[0] > 0).sum()) * len(self.kv_groups[kv_group])
        for index in self.kv_groups[kv_group]:
            if index not in self.inputs:
                raise RuntimeError(f"GDN layer {self.layers[index].prefix} did not verify the rows it must commit")
            mixed_qkv, a, b = self.inputs.pop(index)
            reference_reconstruct(self.layers[index], mixed_qkv, a, b, rows.state_indices, rows.cu_seqlens, accepted,
                                  boundary)
            COUNTERS.reconstructions += 1
            COUNTERS.committed_tokens += committed


def _accepted_per_spec_row(rows: VerifiedRows, accepted: torch.Tensor | int) -> torch.Tensor:
    num_rows = rows.batch_rows.shape[0]
    device = rows.cu_seqlens.device
    if isinstance(accepted, int):
        return torch.full((num_rows,), max(accepted, 1), dtype=torch.int32, device=device)
    accepted = accepted.to(device=device, dtype=torch.int32)
    # Rows past the sampled batch are cudagraph padding (null slot, no tokens): 0 leaves them alone.
    padded = torch.zeros(max(num_rows, accepted.shape[0]) + 1, dtype=torch.int32, device=device)
    padded[: accepted.shape[0]] = accepted
    return padded[rows.batch_rows.clamp(max=padded.shape[0] - 1)]


def check_prefix_caching_layers(forward_context: dict, group: GDNLayerGroup) -> None:
    """Prefix caching ("align" mamba cache mode): vLLM's align copies move all mamba states of a request with one
    token offset, which the commit hooks keep at 0; a mamba layer that is not ours would then read the wrong token's
    state. True for Qwen3-Next / Qwen3.5, whose only mamba layers are GDN layers. Checked when the metadata builders
    are built (KV-cache initialisation), so a model that breaks it fails before the engine serves."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    ours = {id(layer) for layer in group.layers}
    others = [name for name, layer in forward_context.items() if isinstance(layer, MambaBase) and id(layer) not in ours]
    if others:
        raise ValueError(
            "hybridspec.gdn_verify=block_parallel with prefix caching needs every mamba layer to be a block-parallel "
            f"GDN layer; {others[:4]} are not: pass enable_prefix_caching=False or gdn_verify='vllm'"
        )


# Weak: a finished engine's layers (and, through them, its KV cache) must not outlive it here.
_groups: weakref.WeakValueDictionary[int, GDNLayerGroup] = weakref.WeakValueDictionary()
_groups_lock = threading.Lock()


def group_for(forward_context: dict, plan: BlockParallelPlan | None = None, num_layers: int = 0) -> GDNLayerGroup | None:
    """The group of the model whose layers live in `forward_context` (vLLM's static_forward_context).

    With `plan`, creates it when missing (layer construction); without, only looks it up (builders, hooks).
    """
    key = id(forward_context)
    with _groups_lock:
        group = _groups.get(key)
        if group is not None and group.layers and forward_context.get(group.layers[0].prefix) is not group.layers[0]:
            del _groups[key]  # the dict of a finished engine, reused at the same address
            group = None
        if group is None and plan is not None:
            group = _groups[key] = GDNLayerGroup(plan, num_layers)
        return group
