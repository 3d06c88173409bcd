"""One launch that moves every GDN layer's committed ssm and/or conv state of every request to its accepted position.

Grid (state blocks + conv blocks, request, layer). A state program owns one [BV, K] block of one head:
    S_n = exp(G_{n-1}) S_0 + (u[:n] * exp(G_{n-1} - G[:n]))^T k[:n]
read once and written once, in place. A conv program owns a block of channels: the new window is the last W-1
rows of [old window, x_0 .. x_{n-1}], loaded whole before it is stored (in place, same program).

Checkpoints (prefix caching): a request may also name a second slot that receives the state after its first c <= n
tokens (the state exactly at a KV-block boundary). A first launch of the same kernel (HAS_CKPT) reads S_0 and writes
S_c there, before the usual launch overwrites S_0 in place. Computing both in one program was measured slower
(H200, 12 layers, Qwen3-Next shape): keeping S_0 beside S_n cost every launch 16 % at batch 32 even when no row had
a checkpoint, while rows reach a block boundary once every block_size / accepted steps; the checkpoint launch costs
an early exit per program when no row has one, and S_0's read again for the rows that do.
"""
import torch
import triton
import triton.language as tl

from .verify import _check_index, _check_workspace, _tuned_by_len, nearest_tuned, work_batch
from .reconstruct_short import reconstruct_short
from .workspace import GDNStateTable, GDNVerifyWorkspace, conv_window_after


@triton.jit(do_not_specialize=["WS_REQS", "WS_LEN"])
def _gdn_reconstruct_kernel(
    ssm_ptrs, conv_ptrs, ssm_ref, conv_ref, state_indices, num_accepted, cu_seqlens, ws_rows,
    ws_u, ws_k, ws_g, ws_x, stride_ssm_slot, stride_conv_slot, WS_REQS, WS_LEN, ckpt_indices, ckpt_lens,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr, OUTER_LOOP: tl.constexpr,
    FIRST_BLOCK: tl.constexpr, HAS_WS_ROWS: tl.constexpr, HAS_CKPT: tl.constexpr, ALIGNED: tl.constexpr,
):
    """Program (block, request, layer). Blocks 0 .. HV*V/BV - 1 are state blocks, the rest conv blocks; FIRST_BLOCK
    offsets program 0 (HV*V/BV: conv blocks only, parts="conv"); parts="ssm" launches the state blocks only.
    HAS_CKPT (the checkpoint launch): the state after c_i = min(ckpt_lens[i_n], n_i) tokens goes to slot
    ckpt_indices[i_n] instead of the request's own, which stays as it is; rows whose checkpoint slot is <= 0 or their
    own, or whose c_i <= 0, do nothing. ALIGNED: every table pointer is a multiple of 16 (`GDNStateTable.aligned16`)."""
    i_blk, i_n, i_l = tl.program_id(0) + FIRST_BLOCK, tl.program_id(1), tl.program_id(2)
    if HAS_CKPT:  # most rows have no checkpoint: exit on the first load
        out_slot = tl.load(ckpt_indices + i_n).to(tl.int64)
        if out_slot <= 0:
            return
    slot = tl.load(state_indices + i_n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n)
    n = tl.minimum(tl.load(num_accepted + i_n), seqlen).to(tl.int64)
    if (slot <= 0) | (n <= 0):
        return
    if HAS_CKPT:
        n = tl.minimum(tl.load(ckpt_lens + i_n).to(tl.int64), n)
        if (out_slot == slot) | (n <= 0):
            return
    if HAS_WS_ROWS:
        row = tl.load(ws_rows + i_n).to(tl.int64)
    else:
        row = i_n.to(tl.int64)
    ws_base = (i_l.to(tl.int64) * WS_REQS + row) * WS_LEN  # workspace row of this request's token 0
    NUM_V_BLOCKS: tl.constexpr = V // BV
    if i_blk < HV * NUM_V_BLOCKS:
        i_hv = i_blk // NUM_V_BLOCKS
        i_h = i_hv // (HV // H)
        o_v = (i_blk % NUM_V_BLOCKS) * BV + tl.arange(0, BV)
        o_k = tl.arange(0, K)
        ssm = tl.load(ssm_ptrs + i_l).to(tl.pointer_type(ssm_ref.dtype.element_ty))
        if ALIGNED:  # a table pointer's alignment is unknown to the compiler: without this, scalar loads and stores
            ssm = tl.multiple_of(ssm, 16)
        p_h = ssm + slot * stride_ssm_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_h).to(tl.float32)
        b_Gn = tl.load(ws_g + (ws_base + n - 1) * HV + i_hv)
        b_h *= tl.exp(b_Gn)
        if OUTER_LOOP:  # rank-1 updates in fp32 registers, token by token
            for s in tl.range(0, n):
                b_coef = tl.exp(b_Gn - tl.load(ws_g + (ws_base + s) * HV + i_hv))
                b_u = tl.load(ws_u + ((ws_base + s) * HV + i_hv) * V + o_v)
                b_k = tl.load(ws_k + ((ws_base + s) * H + i_h) * K + o_k)
                b_h += (b_coef * b_u)[:, None] * b_k[None, :]
        else:  # one [BV, BT] x [BT, K] product, split tf32 (x3) to stay fp32-accurate
            o_t = tl.arange(0, BT)
            m_t = o_t < n
            b_G = tl.load(ws_g + (ws_base + o_t) * HV + i_hv, mask=m_t, other=0.0)
            b_coef = tl.where(m_t, tl.exp(b_Gn - b_G), 0.0)
            b_u = tl.load(ws_u + ((ws_base + o_t[:, None]) * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None],
                          other=0.0)
            b_k = tl.load(ws_k + ((ws_base + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_t[:, None],
                          other=0.0)
            # decay on u (not on k as the fold does): the k-scaled form ran 8-13 % slower here (H200, final3 run)
            b_h += tl.dot(tl.trans(b_u * b_coef[:, None]), b_k, input_precision="tf32x3")
        if HAS_CKPT:
            p_h += (out_slot - slot) * stride_ssm_slot
        tl.store(p_h, b_h.to(ssm_ref.dtype.element_ty))
    else:
        p_win, m_win, b_win = conv_window_after(conv_ptrs, conv_ref, i_l, slot, out_slot if HAS_CKPT else slot,
                                                stride_conv_slot, ws_x, ws_base, n, i_blk - HV * NUM_V_BLOCKS, D, W,
                                                BD, BW, ALIGNED)
        # In place: every row read before any is stored (conv_window_after says why; seen wrong on the H200).
        tl.debug_barrier()
        tl.store(p_win, b_win, mask=m_win)


# Before any sweep on this GPU: v2's H200 winner (3.5 TB/s on the states at batch 64)
FALLBACK_RECONSTRUCT = dict(block_v=32, num_warps=4)


def default_reconstruct_config(num_requests, max_len=None, state_dtype=None, num_v_heads=None):
    """{block_v, num_warps} of the nearest measured (workspace length, batch) in `tuned_verify_configs.json` when it
    was measured on this GPU (state_dtype bf16: its bf16-state table, when it has one; num_v_heads: value heads on this
    rank, looked up by `work_batch`), else `FALLBACK_RECONSTRUCT`."""
    tuned = nearest_tuned(_tuned_by_len("reconstruct_by_len", state_dtype), work_batch(num_requests, num_v_heads),
                          max_len)
    return dict(tuned) if tuned is not None else dict(FALLBACK_RECONSTRUCT)


def gdn_reconstruct(
    states: GDNStateTable,
    workspace: GDNVerifyWorkspace,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    cu_seqlens: torch.Tensor,
    block_v: int | None = None,
    block_d: int = 512,
    num_warps: int | None = None,
    outer_loop: bool = False,
    parts: str = "all",
    workspace_rows: torch.Tensor | None = None,
    checkpoint_indices: torch.Tensor | None = None,
    checkpoint_lens: torch.Tensor | None = None,
) -> None:
    """Advance every layer's committed ssm and conv state of every request by its accepted tokens, in place.

    One launch for all layers. Layer l uses `workspace.layer(l)` as filled by this step's `gdn_verify` of layer l,
    which must have been called with the same `state_indices` and `cu_seqlens` (same request order).

        states         `GDNStateTable` over the layers' ssm [num_slots, HV, V, K] and conv [num_slots, >=W-1, D]
        workspace      `GDNVerifyWorkspace` with a layer dimension: [num_layers, requests, max_len, ...]
        state_indices  [B] int  slot per request; 0 (vLLM's null block) is skipped
        num_accepted   [B] int  n_i = tokens of the verified block [last sampled token, draft_1, ...] to commit:
                       the committed state becomes the state after the first n_i tokens. With a accepted drafts,
                       n_i = a + 1 (vLLM's `num_accepted_tokens`, i.e. its num_sampled). 0 leaves the request's
                       states untouched; values above L_i are clamped to L_i.
        cu_seqlens     [B+1] int  as passed to `gdn_verify`
        block_v, block_d, num_warps, outer_loop   launch tuning (state block rows, conv channels per program,
                       warps, rank-1 loop vs one tf32x3 product for the state update); block_v / num_warps None:
                       `default_reconstruct_config(B, workspace.max_len)`, the sweep's fastest on this GPU
                       (block_v = V is one program per (request, head)); the loop was 2.3x slower (H200)
        parts          "all" (ssm + conv), "conv" (conv windows only) or "ssm" (ssm states only). A caller that folds
                       the ssm part into the next gdn_verify (`GDNFold`) runs parts="conv" right after rejection
                       sampling, so the conv windows stay current and only the ssm states lag ("pending").
                       "conv" + "ssm" in either order == "all" (they touch disjoint state).
        workspace_rows [B] int  workspace row of request i (default i), as given to this step's gdn_verify
        checkpoint_indices, checkpoint_lens   [B] int each, both or neither (prefix caching): request i also writes
                       the state after its first c_i = min(checkpoint_lens[i], n_i) tokens into slot
                       checkpoint_indices[i] (the same `parts`), from the same S_0 and workspace (a second launch,
                       before the usual one). None for rows whose checkpoint slot is <= 0 or equals state_indices[i],
                       or whose c_i <= 0, and for rows that commit nothing (slot 0 or n_i = 0). A checkpoint slot must
                       be no request's state slot in this call.
    """
    if not isinstance(states, GDNStateTable):
        raise ValueError("states must be a GDNStateTable")
    ssm0, conv0 = states.ssm_states[0], states.conv_states[0]
    _, num_v_heads, head_v_dim, head_k_dim = ssm0.shape
    conv_dim = conv0.shape[2]
    num_k_heads = (conv_dim - num_v_heads * head_v_dim) // (2 * head_k_dim)
    if workspace.u.ndim != 5:
        raise ValueError("workspace must carry a layer dimension (GDNVerifyWorkspace.allocate(num_layers, ...))")
    if workspace.num_layers != states.num_layers:
        raise ValueError(f"workspace has {workspace.num_layers} layers, states {states.num_layers}")
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be [B+1], got shape {tuple(cu_seqlens.shape)}")
    num_requests = cu_seqlens.shape[0] - 1
    _check_index("cu_seqlens", cu_seqlens, num_requests + 1)
    _check_index("state_indices", state_indices, num_requests)
    _check_index("num_accepted", num_accepted, num_requests)
    if parts not in ("all", "conv", "ssm"):
        raise ValueError(f'parts must be "all", "conv" or "ssm", got {parts!r}')
    if workspace_rows is not None:
        _check_index("workspace_rows", workspace_rows, num_requests)
        if workspace_rows.device != workspace.u.device:
            raise ValueError(f"workspace_rows is on {workspace_rows.device}, the workspace on {workspace.u.device}")
    if (checkpoint_indices is None) != (checkpoint_lens is None):
        raise ValueError("checkpoint_indices and checkpoint_lens go together: pass both or neither")
    if checkpoint_indices is not None:
        _check_index("checkpoint_indices", checkpoint_indices, num_requests)
        _check_index("checkpoint_lens", checkpoint_lens, num_requests)
        for name, t in (("checkpoint_indices", checkpoint_indices), ("checkpoint_lens", checkpoint_lens)):
            if t.device != state_indices.device:
                raise ValueError(f"{name} is on {t.device}, state_indices on {state_indices.device}")
    _check_workspace(workspace, 0 if workspace_rows is not None else num_requests, 0, num_k_heads, num_v_heads,
                     head_k_dim, head_v_dim, conv_dim, workspace.x.dtype, layered=True)
    width = states.conv_width
    if num_requests == 0:
        return
    # The short form serves plain default calls; a checkpoint pass runs before it on the general kernel.
    offer_short = (parts == "all" and workspace_rows is None and block_v is None and num_warps is None
                   and not outer_loop)
    if block_v is None or num_warps is None:
        tuned = default_reconstruct_config(num_requests, workspace.max_len, states.ssm_states[0].dtype, num_v_heads)
        block_v = tuned["block_v"] if block_v is None else block_v
        num_warps = tuned["num_warps"] if num_warps is None else num_warps
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    block_v = min(block_v, head_v_dim)
    block_t = max(16, triton.next_power_of_2(workspace.max_len))
    num_state_blocks = num_v_heads * (head_v_dim // block_v)
    num_conv_blocks = triton.cdiv(conv_dim, block_d)
    num_blocks = {"all": num_state_blocks + num_conv_blocks, "conv": num_conv_blocks, "ssm": num_state_blocks}[parts]
    grid = (num_blocks, num_requests, states.num_layers)

    def launch(checkpoint, out_slots, out_lens):
        _gdn_reconstruct_kernel[grid](
            states.ssm_ptrs, states.conv_ptrs, ssm0, conv0, state_indices, num_accepted, cu_seqlens,
            state_indices if workspace_rows is None else workspace_rows,
            workspace.u, workspace.k, workspace.g, workspace.x, ssm0.stride(0), conv0.stride(0),
            workspace.max_requests, workspace.max_len, out_slots, out_lens,
            H=num_k_heads, HV=num_v_heads, K=head_k_dim, V=head_v_dim, D=conv_dim, W=width,
            BT=block_t, BV=block_v, BD=block_d, BW=max(2, triton.next_power_of_2(width - 1)),
            OUTER_LOOP=outer_loop, FIRST_BLOCK=num_state_blocks if parts == "conv" else 0,
            HAS_WS_ROWS=workspace_rows is not None, HAS_CKPT=checkpoint, ALIGNED=states.aligned16,
            num_warps=num_warps,
        )

    if checkpoint_indices is not None:  # first: it reads the states the plain pass then overwrites in place
        launch(True, checkpoint_indices, checkpoint_lens)
    if offer_short and reconstruct_short(states, workspace, state_indices, num_accepted, cu_seqlens):
        return
    launch(False, state_indices, num_accepted)
