"""Compact per-step workspace of GDN verification and the per-layer state pointer table.

Verification writes no state. Per layer and request it keeps what reconstruction needs:
    u [R, LMAX, HV, V]  float32  the step's WY "pseudo values": S_n = exp(G_n) S_0 + sum_{s<n} exp(G_n - G_s) u_s k_s^T
    k [R, LMAX, H, K]   float32  L2-normalised keys
    g [R, LMAX, HV]     float32  cumulative log decay G_t = g_0 + ... + g_t
    x [R, LMAX, D]      input dtype  raw (pre-conv) inputs, for the conv window
Row r is the request at batch position r of the verify call (the same order reconstruction must use), unless the
call passes `workspace_rows` (row workspace_rows[r] for request r): the row dimension is just "max rows", and a
caller that folds reconstruction into the next verify (`GDNFold`) allocates two rows per request and alternates.
Each tensor carries a leading layer dimension when allocated for several layers.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_VERIFY_LEN = 32  # tokens per request in one verify: one register chunk of 16 or 32 rows


@dataclass(frozen=True)
class GDNVerifyWorkspace:
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    x: torch.Tensor

    @classmethod
    def allocate(cls, num_layers, max_requests, max_len, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                 input_dtype=torch.bfloat16, device="cuda"):
        if not 1 <= max_len <= MAX_VERIFY_LEN:
            raise ValueError(f"max_len must be in 1..{MAX_VERIFY_LEN}, got {max_len}")
        shape = (num_layers, max_requests, max_len)
        conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        return cls(
            u=torch.empty(*shape, num_v_heads, head_v_dim, dtype=torch.float32, device=device),
            k=torch.empty(*shape, num_k_heads, head_k_dim, dtype=torch.float32, device=device),
            g=torch.empty(*shape, num_v_heads, dtype=torch.float32, device=device),
            x=torch.empty(*shape, conv_dim, dtype=input_dtype, device=device),
        )

    @property
    def num_layers(self):
        """Leading layer count; 1 for the single-layer view that `layer()` returns."""
        return self.u.shape[0] if self.u.ndim == 5 else 1

    @property
    def max_requests(self):
        return self.u.shape[-4]

    @property
    def max_len(self):
        return self.u.shape[-3]

    def layer(self, index):
        """The workspace of one layer (tensors without the layer dimension), as `gdn_verify` takes it."""
        return GDNVerifyWorkspace(self.u[index], self.k[index], self.g[index], self.x[index])

    def bytes_per_request(self):
        """Bytes one request occupies in one layer."""
        return sum(t.numel() // (self.num_layers * self.max_requests) * t.element_size()
                   for t in (self.u, self.k, self.g, self.x))


class GDNStateTable:
    """Device pointer tables over every GDN layer's ssm and conv state, built once per KV-cache allocation.

    ssm_states:  per layer [num_slots, HV, V, K] (vLLM's `kv_cache[1]`), inner three dims contiguous
    conv_states: per layer [num_slots, state_len >= W-1, D] (vLLM's `kv_cache[0]`, SD layout), rows contiguous
    conv_width:  W, the conv kernel size (window = W-1 rows)
    All layers must share shape, strides and dtype (they do in vLLM: one MambaSpec); the slot stride may be
    anything (vLLM interleaves the two states of a block in one page). The tables hold raw pointers: rebuild
    the table if the state tensors are reallocated.
    """

    def __init__(self, ssm_states, conv_states, conv_width):
        if len(ssm_states) == 0 or len(ssm_states) != len(conv_states):
            raise ValueError(f"need one conv state per ssm state, got {len(ssm_states)} and {len(conv_states)}")
        for name, tensors in (("ssm_states", ssm_states), ("conv_states", conv_states)):
            first = tensors[0]
            for t in tensors:
                if t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype:
                    raise ValueError(f"all {name} must share shape, strides and dtype")
                if t.device != first.device:
                    raise ValueError(f"all {name} must be on one device")
        check_ssm_state(ssm_states[0])
        check_conv_state(conv_states[0])
        if not 2 <= conv_width <= 5 or conv_states[0].shape[1] < conv_width - 1:
            raise ValueError(f"conv_width {conv_width} must be in 2..5 and fit the conv state rows")
        if ssm_states[0].shape[0] != conv_states[0].shape[0]:
            raise ValueError("ssm and conv states must have the same number of slots")
        self.conv_width = conv_width
        device = ssm_states[0].device
        self.ssm_states, self.conv_states = list(ssm_states), list(conv_states)
        self.ssm_ptrs = torch.tensor([t.data_ptr() for t in ssm_states], dtype=torch.int64, device=device)
        self.conv_ptrs = torch.tensor([t.data_ptr() for t in conv_states], dtype=torch.int64, device=device)
        # kernels may then tell the compiler (tl.multiple_of) and load / store the states 16 bytes at a time
        self.aligned16 = all(t.data_ptr() % 16 == 0 for t in self.ssm_states + self.conv_states)

    @property
    def num_layers(self):
        return len(self.ssm_states)


def check_ssm_state(ssm_state):
    if ssm_state.ndim != 4:
        raise ValueError(f"ssm_state must be [num_slots, HV, V, K], got shape {tuple(ssm_state.shape)}")
    _, num_v_heads, head_v_dim, head_k_dim = ssm_state.shape
    if ssm_state.stride()[1:] != (head_v_dim * head_k_dim, head_k_dim, 1):
        raise ValueError("ssm_state must be contiguous within a slot ([HV, V, K] row-major)")
    if ssm_state.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"ssm_state dtype must be float32, bfloat16 or float16, got {ssm_state.dtype}")
    for name, dim in (("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim)):
        if dim < 16 or dim & (dim - 1) or dim > 256:
            raise ValueError(f"{name} must be a power of two in 16..256, got {dim}")


def check_conv_state(conv_state):
    if conv_state.ndim != 3:
        raise ValueError(f"conv_state must be [num_slots, state_len, conv_dim], got shape {tuple(conv_state.shape)}")
    if conv_state.stride(2) != 1 or conv_state.stride(1) != conv_state.shape[2]:
        raise ValueError(
            "conv_state rows must be contiguous ([num_slots, state_len, conv_dim], conv_dim innermost: vLLM's "
            "default SD layout; the DS layout is not supported)"
        )
    if conv_state.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"conv_state dtype must be float32, bfloat16 or float16, got {conv_state.dtype}")


@dataclass(frozen=True)
class GDNFold:
    """The previous step's pending ssm-state update, folded into this step's `gdn_verify` (one layer).

        workspace  `GDNVerifyWorkspace` (one layer, no layer dim) holding the previous step's u, k, g; may be the very
                   same tensors as the workspace this step writes, as long as the rows differ (see below)
        rows       [R] int32  per request r of THIS verify call: the workspace row holding the previous step's block
                   of the same request (any value where counts[r] == 0)
        counts     [R] int32  tokens of that block to fold into the committed ssm state before verifying (the
                   previous step's num_accepted; 0 = nothing pending; clamped to workspace.max_len)

    With a fold, gdn_verify first advances each request's committed ssm state S_0 by counts[r] tokens exactly as
    gdn_reconstruct(parts="ssm") would, stores it back to its slot (only where counts[r] > 0), then verifies from
    it: each state is read and written once per step instead of read by verify and read + written again by the
    reconstruction. The conv window is not folded (advance it eagerly with gdn_reconstruct(parts="conv")).
    Rows read here and rows the same call writes (`workspace_rows`) must not overlap; the kernels assume it.
    """

    workspace: GDNVerifyWorkspace
    rows: torch.Tensor
    counts: torch.Tensor

    def __post_init__(self):
        if not isinstance(self.workspace, GDNVerifyWorkspace):
            raise ValueError("GDNFold.workspace must be a GDNVerifyWorkspace")
        if self.workspace.u.ndim != 4:
            raise ValueError("GDNFold.workspace must be one layer's workspace (GDNVerifyWorkspace.layer(l))")
        for name in ("rows", "counts"):
            t = getattr(self, name)
            if not torch.is_tensor(t) or t.ndim != 1:
                raise ValueError(f"GDNFold.{name} must be a 1-D tensor")
            if t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"GDNFold.{name} must be int32 or int64, got {t.dtype}")
            if not t.is_contiguous():
                raise ValueError(f"GDNFold.{name} must be contiguous")
            if t.device != self.workspace.u.device:
                raise ValueError(f"GDNFold.{name} is on {t.device}, its workspace on {self.workspace.u.device}")
        if self.rows.shape != self.counts.shape:
            raise ValueError(f"GDNFold.rows {tuple(self.rows.shape)} and counts {tuple(self.counts.shape)} differ")


@triton.jit
def conv_window_after(conv_ptrs, conv_ref, i_l, slot, out_slot, stride_conv_slot, ws_x, ws_base, n, i_cblk,
                      D: tl.constexpr, W: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr, ALIGNED: tl.constexpr):
    """Channel block i_cblk of a table slot's conv window after the step's first n tokens: the last W-1 rows of
    [old window, x_0 .. x_{n-1}] (x from the workspace row starting at ws_base), loaded whole. The rows of the block
    may sit in different warps, and new row r is old row r + n: a caller storing it in place must put a CTA barrier
    (tl.debug_barrier) between this load and its store, or a warp's store can overtake another warp's load (seen on
    the H200 at 4 warps). Returns (pointers [BW, BD] into out_slot's window, their mask, the window)."""
    o_d = i_cblk * BD + tl.arange(0, BD)
    o_r = tl.arange(0, BW)
    m_r = o_r < W - 1
    src = n - (W - 1) + o_r  # token of this step feeding window row o_r; < 0: an old window row
    conv = tl.load(conv_ptrs + i_l).to(tl.pointer_type(conv_ref.dtype.element_ty))
    if ALIGNED:  # a table pointer's alignment is unknown to the compiler: without this, scalar loads and stores
        conv = tl.multiple_of(conv, 16)
    conv += slot * stride_conv_slot
    m_d = o_d < D
    b_old = tl.load(conv + (o_r + n)[:, None] * D + o_d[None, :], mask=(m_r & (src < 0))[:, None] & m_d[None, :],
                    other=0.0)
    b_new = tl.load(ws_x + (ws_base + src)[:, None] * D + o_d[None, :],
                    mask=(m_r & (src >= 0))[:, None] & m_d[None, :], other=0.0)
    b_win = tl.where((src >= 0)[:, None], b_new.to(conv_ref.dtype.element_ty), b_old)
    conv += (out_slot - slot) * stride_conv_slot
    return conv + o_r[:, None] * D + o_d[None, :], m_r[:, None] & m_d[None, :], b_win
