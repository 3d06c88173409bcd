"""The block-parallel GDN layers of one model, and the per-step bookkeeping of the folded reconstruction.

Every block-parallel GDN layer of a model joins one `GDNLayerGroup`, found through the model's
`static_forward_context` (which the metadata builders and the runner hooks reach too).

vLLM splits a model's GDN layers into KV-cache groups (strided: group i = GDN layers i, i+G, ...), each with its
own block table and metadata builder, so a request's state slot differs between groups. Each step, per group:
0. when the step starts, a runner hook calls `start_step` with the requests finished or preempted since the
   last step (their pending is dropped) and how to read the batch's request ids.
1. the metadata builder calls `begin_step` with the step's spec rows (slots, cu_seqlens, batch positions; None
   without spec rows). It consumes the group's pending (see the package docstring): spec rows whose slot has
   pending get fold rows/counts in the group's persistent `StepRows`; every other pending slot of a live request
   is flushed by one ssm-only reconstruct launch right there. It also sets the workspace rows this step writes
   (r + parity x max_requests). Builders run every step, also when a FULL CUDA graph replays the forward, which
   is why all of this happens here and the forward only reads the persistent tensors.
2. each layer's forward verifies those rows (`verify`): fold, then verify, from the committed states; the kernel
   fills the workspace (laid out group-major so that a KV-cache group's layers are consecutive).
3. after rejection sampling a runner hook calls `commit(accepted)`: one conv-only reconstruct launch per group
   (the conv windows are current from here on), and the step's (slot, workspace row, accepted count) become the
   group's pending; the parity flips.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from vllm_hybridspec.gdn.plan import BlockParallelPlan


@dataclass
class GDNCounters:
    """Per-process counters of the block-parallel path (tests and the demo read them)."""

    verify_calls: int = 0       # layer forwards that verified spec rows (eager forwards only)
    commits: int = 0            # steps whose accepted tokens were committed
    reconstructions: int = 0    # conv-window commits (kernel: one launch per KV-cache group; reference: per layer)
    flushes: int = 0            # ssm-only flushes of pending rows (kernel: one launch per group; reference: per layer)
    mixed_batches: int = 0      # layer forwards whose batch had non-spec rows (prefill chunks) beside spec rows
    # reference path only (counting needs host syncs), summed over layers:
    committed_tokens: int = 0   # tokens committed into conv windows
    folded_tokens: int = 0      # pending tokens folded into ssm states by the verify
    flushed_tokens: int = 0     # pending tokens flushed into ssm states before a forward

    def reset(self) -> None:
        for name in vars(self):
            setattr(self, name, 0)


COUNTERS = GDNCounters()


@dataclass(frozen=True)
class VerifiedRows:
    """One KV-cache group's spec rows of the current step."""

    state_indices: torch.Tensor  # [R] int32 committed-state slot per spec row (0 = vLLM's null block)
    cu_seqlens: torch.Tensor     # [R+1] int32: verified tokens of spec row r are cu[r]:cu[r+1]
    batch_rows: torch.Tensor     # [R] long: batch position of each spec row (its row in the sampler output)
    batch_rows_cpu: tuple[int, ...] = ()  # the same on the host (rows past the batch are cudagraph padding)


@dataclass(frozen=True)
class PendingRows:
    """The rows of one group's last commit: slot state_indices[j] holds a current conv window but an ssm state that
    still misses the first counts[j] tokens of workspace row workspace_rows[j] (0: nothing missing)."""

    state_indices: torch.Tensor   # [P] int32
    workspace_rows: torch.Tensor  # [P] int32
    counts: torch.Tensor          # [P] int32
    cu_seqlens: torch.Tensor      # [P+1] int32 (the committed step's)
    req_ids: tuple[str | None, ...] = ()  # host: the request of each row, where known


class StepRows:
    """One group's per-step verify arguments, in persistent tensors (a FULL CUDA graph bakes their addresses).

    Spec row r writes workspace row workspace_rows[r]; before verifying it folds fold_counts[r] tokens of workspace
    row fold_rows[r] into its slot's ssm state (0: nothing; fold_rows[r] is then unused)."""

    def __init__(self, max_rows: int, device: torch.device):
        self.workspace_rows = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.fold_rows = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.fold_counts = torch.zeros(max_rows, dtype=torch.int32, device=device)


def verified_rows(metadata: Any) -> VerifiedRows | None:
    """The spec rows of vLLM's GDNAttentionMetadata, as the layers verify them; None without spec rows."""
    if metadata.spec_sequence_masks is None:
        return None
    # A copy: the column can be a view of a block table that the next step rewrites, and commit keeps it.
    state_indices = metadata.spec_state_indices_tensor[:, 0].clone()
    num_rows = state_indices.shape[0]
    device = state_indices.device
    if metadata.num_prefills == 0 and metadata.num_decodes == 0:
        # spec rows lead the batch; FULL-cudagraph padding rows (slot 0, no tokens) trail it
        batch_rows_cpu = torch.arange(num_rows)
        batch_rows = torch.arange(num_rows, device=device)
    else:
        batch_rows_cpu = metadata.spec_sequence_masks_cpu.nonzero().flatten()
        batch_rows = batch_rows_cpu.to(device, non_blocking=True)
    return VerifiedRows(state_indices, metadata.spec_query_start_loc[: num_rows + 1], batch_rows,
                        tuple(batch_rows_cpu.tolist()))


class GDNLayerGroup:
    def __init__(self, plan: BlockParallelPlan, num_layers: int):
        self.plan = plan
        self.num_layers = num_layers
        self.layers: list[Any] = []
        self.workspace = None  # GDNVerifyWorkspace with a layer dimension (kernel path), group-major layer order
        self.reference_workspaces: dict[int, Any] = {}  # reference path: layer -> ReferenceWorkspace
        self.kv_groups: list[list[int]] = []       # KV-cache group -> its layers (indices into self.layers)
        self.kv_group_of: dict[int, int] = {}      # layer -> KV-cache group
        self.workspace_row: dict[int, int] = {}    # layer -> its index in the workspace's layer dimension
        self.step_rows: dict[int, StepRows] = {}   # KV-cache group -> its persistent verify arguments
        self.verified: dict[int, VerifiedRows | None] = {}  # KV-cache group -> this step's spec rows
        self.pending: dict[int, PendingRows] = {}  # KV-cache group -> the last commit's rows
        self.parity = 0                            # this step's half of the workspace rows
        # Host-side request identity (runner hooks, patches.py): the requests of the current batch by row, and the
        # requests finished or preempted since the last commit - their slots may already belong to someone else.
        self.batch_req_ids: Callable[[], Sequence[str | None]] | None = None
        self.gone_req_ids: set[str] = set()
        self._verified_req_ids: dict[int, tuple[str | None, ...]] = {}
        self._parity_rows: torch.Tensor | None = None  # [2, max_requests] int32: r + parity * max_requests
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
            # 2 rows per request: this step's block, and the previous step's until it is folded or flushed
            self.num_layers, 2 * self.plan.max_requests, self.plan.max_verify_len,
            layer.num_k_heads // tp, layer.num_v_heads // tp, layer.head_k_dim, layer.head_v_dim,
            input_dtype=input_dtype, device=device,
        )

    def add_kv_group(self, layer_names: list[str], device: torch.device | str = "cpu") -> int:
        """Called by each metadata builder: its layers share a block table. Returns the KV-cache group id."""
        members = [i for i, layer in enumerate(self.layers) if layer.prefix in set(layer_names)]
        if not members:
            raise RuntimeError(f"no block-parallel GDN layer among {layer_names}")
        if members in self.kv_groups:  # another builder of the same group
            return self.kv_groups.index(members)
        if any(i in self.kv_group_of for i in members):
            raise RuntimeError(f"GDN layers {layer_names} are split differently between metadata builders")
        kv_group = len(self.kv_groups)
        self.kv_groups.append(members)
        for i in members:
            self.kv_group_of[i] = kv_group
            self.workspace_row[i] = len(self.workspace_row)
        max_requests = self.plan.max_requests
        if self._parity_rows is None:
            self._parity_rows = torch.arange(2 * max_requests, dtype=torch.int32, device=device).view(2, max_requests)
        self.step_rows[kv_group] = StepRows(max_requests, self._parity_rows.device)
        return kv_group

    def workspace_of(self, layer_index: int):
        return self.workspace.layer(self.workspace_row[layer_index])

    # ---- the step ---------------------------------------------------------------------------------------
    def start_step(self, gone_req_ids, batch_req_ids: Callable[[], Sequence[str | None]] | None = None) -> None:
        """Called by the runner hooks when a step starts, before its metadata build: the requests finished or
        preempted since the last step (their pending is dropped: never folded, never flushed, since vLLM may
        already have handed their blocks to another request and zeroed them) and, where the runner keeps it on
        the host, how to read the batch's request ids at build time."""
        self.gone_req_ids.update(gone_req_ids)
        if batch_req_ids is not None:
            self.batch_req_ids = batch_req_ids

    def begin_step(self, kv_group: int, rows: VerifiedRows | None) -> None:
        """Called by the group's metadata builder, before the forward: consumes the group's pending (fold for the
        rows verified again, one ssm-only flush launch for every other pending row of a live request, nothing for
        the rows of finished or preempted requests) and sets this step's rows."""
        pending = self.pending.pop(kv_group, None)
        self.verified[kv_group] = rows
        verified_req_ids: tuple[str | None, ...] = ()
        if rows is not None and self.batch_req_ids is not None:
            batch_req_ids = self.batch_req_ids()
            verified_req_ids = tuple(batch_req_ids[b] if b < len(batch_req_ids) else None for b in rows.batch_rows_cpu)
            self._verified_req_ids[kv_group] = verified_req_ids
        if pending is not None and rows is not None and self._same_requests(pending, verified_req_ids):
            # The steady state: the batch verifies the same requests in the same rows, so each row folds its own
            # pending and nothing is left to flush (a padding row's count is 0).
            step = self._prepare_rows(kv_group, rows)
            step.fold_counts[: len(verified_req_ids)].copy_(pending.counts)
            step.fold_rows[: len(verified_req_ids)].copy_(pending.workspace_rows)
            return
        live = None
        if pending is not None:
            live = (pending.state_indices > 0) & (pending.counts > 0)
            gone = [req_id in self.gone_req_ids for req_id in pending.req_ids]
            if any(gone):
                gone = torch.tensor(gone, dtype=torch.bool, pin_memory=live.is_cuda)
                live &= ~gone.to(live.device, non_blocking=True)
        folded = None
        if rows is not None:
            step = self._prepare_rows(kv_group, rows)
            num_rows = rows.state_indices.shape[0]
            if pending is None:
                step.fold_counts[:num_rows].zero_()
            else:
                # [R, P] on device, no host sync: slot 0 (null block, cudagraph padding) never matches
                match = (rows.state_indices[:, None] == pending.state_indices[None, :]) & live[None, :]
                weights = match.to(torch.int32)
                step.fold_counts[:num_rows].copy_((weights * pending.counts[None, :]).sum(dim=1))
                step.fold_rows[:num_rows].copy_((weights * pending.workspace_rows[None, :]).sum(dim=1))
                folded = match.any(dim=0)
        if pending is not None and not self._nothing_to_flush(pending, verified_req_ids):
            flush = live if folded is None else live & ~folded
            self._advance(kv_group, pending.state_indices, pending.workspace_rows,
                          pending.counts.masked_fill(~flush, 0), pending.cu_seqlens, "ssm")

    def _prepare_rows(self, kv_group: int, rows: VerifiedRows) -> StepRows:
        step = self.step_rows[kv_group]
        num_rows = rows.state_indices.shape[0]
        if num_rows > self.plan.max_requests:
            raise RuntimeError(f"{num_rows} spec rows in one step, above max_num_seqs {self.plan.max_requests}")
        step.workspace_rows[:num_rows].copy_(self._parity_rows[self.parity, :num_rows])
        return step

    def _same_requests(self, pending: PendingRows, verified_req_ids: tuple[str | None, ...]) -> bool:
        return (
            bool(pending.req_ids) and self.batch_req_ids is not None and pending.req_ids == verified_req_ids
            and not any(req_id in self.gone_req_ids for req_id in pending.req_ids)
        )

    def _nothing_to_flush(self, pending: PendingRows, verified_req_ids: tuple[str | None, ...]) -> bool:
        """True when the host knows every pending row is folded this step or dropped, so the flush launch (which
        would find only zero counts) can be skipped: the steady state, where the batch keeps its requests.
        Needs both request-id lists (rows past a batch are padding, None); without them the flush always runs."""
        if not pending.req_ids or self.batch_req_ids is None:
            return False
        verified = set(verified_req_ids)
        return all(req_id is None or req_id in self.gone_req_ids or req_id in verified for req_id in pending.req_ids)

    def verify(self, layer_index: int, mixed_qkv, a, b, state_indices, cu_seqlens, out=None) -> torch.Tensor:
        """[T, HV, V] core attention output of the spec tokens of one layer: folds this step's fold rows into the
        committed ssm states, then verifies from them; fills this step's workspace rows. `out` (kernel path):
        a contiguous [T, HV, V] slice of vLLM's core_attn_out to write."""
        step = self.step_rows[self.kv_group_of[layer_index]]
        num_rows = state_indices.shape[0]
        workspace_rows, fold_rows, fold_counts = (
            t[:num_rows] for t in (step.workspace_rows, step.fold_rows, step.fold_counts)
        )
        layer = self.layers[layer_index]
        if self.plan.use_kernels:
            from vllm_hybridspec.gdn.kernel_path import kernel_verify

            workspace = self.workspace_of(layer_index)
            return kernel_verify(layer, workspace, mixed_qkv, a, b, state_indices, cu_seqlens,
                                 self.plan.max_verify_len, out, workspace_rows, fold_rows, fold_counts)
        from vllm_hybridspec.gdn import reference

        workspace = self.reference_workspaces.get(layer_index)
        if workspace is None:
            workspace = self.reference_workspaces[layer_index] = reference.ReferenceWorkspace.allocate(
                layer, 2 * self.plan.max_requests, self.plan.max_verify_len, mixed_qkv.dtype
            )
        COUNTERS.folded_tokens += reference.reference_advance(
            layer, workspace, state_indices, fold_rows, fold_counts, "ssm"
        )
        reference.reference_record(layer, workspace, state_indices, workspace_rows, cu_seqlens, mixed_qkv, a, b)
        return reference.reference_verify(layer, mixed_qkv, a, b, state_indices, cu_seqlens)

    def commit(self, accepted_per_batch_row: torch.Tensor | int) -> None:
        """Commit this step's spec rows: conv windows advance now, ssm states become pending.

        `accepted_per_batch_row`: [num_reqs] tokens of each batch row's verified block to commit (vLLM's
        num_accepted_tokens / num_sampled: accepted drafts + 1), or one int for all rows.
        """
        verified, self.verified = self.verified, {}
        req_ids, self._verified_req_ids = self._verified_req_ids, {}
        # The batch's request ids are re-announced by the next step; builds in between (dummy runs) go without.
        self.batch_req_ids = None
        if not any(rows is not None for rows in verified.values()):
            return
        # Requests gone before this commit are not in it; later pending must not be matched against their ids.
        self.gone_req_ids.clear()
        COUNTERS.commits += 1
        for kv_group, rows in verified.items():
            if rows is None:
                continue
            counts = _accepted_per_spec_row(rows, accepted_per_batch_row)
            workspace_rows = self._parity_rows[self.parity, : counts.shape[0]]  # what begin_step gave the verify
            self._advance(kv_group, rows.state_indices, workspace_rows, counts, rows.cu_seqlens, "conv")
            self.pending[kv_group] = PendingRows(rows.state_indices, workspace_rows, counts, rows.cu_seqlens.clone(),
                                                 req_ids.get(kv_group, ()))
        self.parity ^= 1

    def _advance(self, kv_group, state_indices, workspace_rows, counts, cu_seqlens, parts: str) -> None:
        """Advance the group's conv windows (parts="conv") or ssm states ("ssm") by counts[j] tokens of workspace
        row workspace_rows[j], for slot state_indices[j]."""
        if self.plan.use_kernels:
            from hybridspec_kernels.gdn_verify import gdn_reconstruct

            gdn_reconstruct(self._state_table(kv_group), self._group_workspace(kv_group), state_indices, counts,
                            cu_seqlens, parts=parts, workspace_rows=workspace_rows)
            tokens = 0
        else:
            from vllm_hybridspec.gdn.reference import reference_advance

            tokens = 0
            for index in self.kv_groups[kv_group]:
                workspace = self.reference_workspaces.get(index)
                if workspace is None:
                    raise RuntimeError(f"GDN layer {self.layers[index].prefix} did not verify the rows it must commit")
                tokens += reference_advance(self.layers[index], workspace, state_indices, workspace_rows, counts, parts)
        if parts == "conv":
            COUNTERS.reconstructions += 1 if self.plan.use_kernels else len(self.kv_groups[kv_group])
            COUNTERS.committed_tokens += tokens
        else:
            COUNTERS.flushes += 1 if self.plan.use_kernels else len(self.kv_groups[kv_group])
            COUNTERS.flushed_tokens += tokens

    def _state_table(self, kv_group: int):
        from hybridspec_kernels.gdn_verify import GDNStateTable

        members = self.kv_groups[kv_group]
        table = self._state_tables.get(kv_group)
        if table is None or table.ssm_states[0].data_ptr() != self.layers[members[0]].kv_cache[1].data_ptr():
            table = self._state_tables[kv_group] = GDNStateTable(
                [self.layers[i].kv_cache[1] for i in members],
                [self.layers[i].kv_cache[0] for i in members],
                self.layers[members[0]].conv_kernel_size,
            )
        return table

    def _group_workspace(self, kv_group: int):
        from hybridspec_kernels.gdn_verify import GDNVerifyWorkspace

        members = self.kv_groups[kv_group]
        start = self.workspace_row[members[0]]
        ws = self.workspace
        layers = slice(start, start + len(members))
        return GDNVerifyWorkspace(ws.u[layers], ws.k[layers], ws.g[layers], ws.x[layers])


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
