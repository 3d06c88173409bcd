"""gdn_reconstruct's checkpoint form (prefix caching): besides the committed state after n_i tokens, the state after
the first c_i tokens goes to a second slot, from the same workspace, in the same launch.

Against the sequential float64 reference (`naive_gdn_reconstruct` with the same checkpoint arguments) and against
a plain reconstruction of c_i tokens into the checkpoint slot. CPU: Triton interpreter, fp32 / fp16; GPU (marker
gpu): the Qwen3-Next GDN shape with bf16 inputs.
"""
import functools
import os

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (see test_gdn_verify.py)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED or not ON_GPU else "cuda"
if DEVICE == "cuda":
    torch.set_num_threads(1)  # as test_gdn_verify.py: one host thread per xdist worker

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from hybridspec_kernels.gdn_verify import (  # noqa: E402
    GDNStateTable,
    GDNVerifyWorkspace,
    gdn_reconstruct,
    gdn_verify,
    naive_gdn_reconstruct,
)

needs_kernels = pytest.mark.skipif(
    DEVICE == "cpu" and type(tl.standard.sigmoid).__name__ != "InterpretedFunction",
    reason="triton was imported before TRITON_INTERPRET=1 could be set: run with TRITON_INTERPRET=1",
)
WIDTH = 4


def make_layer(lens, num_slots, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=32, dtype=torch.float32,
               state_dtype=torch.float32, seed=0, device=DEVICE):
    """Random inputs and states of one GDN layer for requests of `lens` tokens ([T, D] layout, SD conv states)."""
    gen = torch.Generator().manual_seed(seed)
    conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim

    def randn(*shape, std=1.0, dt=dtype):
        return (torch.randn(*shape, generator=gen) * std).to(dt).to(device)

    return dict(
        mixed_qkv=randn(sum(lens), conv_dim),
        a=randn(sum(lens), num_v_heads),
        b=randn(sum(lens), num_v_heads),
        conv_weight=randn(conv_dim, WIDTH, std=0.5),
        conv_bias=randn(conv_dim, std=0.2),
        A_log=randn(num_v_heads, std=0.5, dt=torch.float32),
        dt_bias=randn(num_v_heads, dt=torch.float32),
        conv_state=randn(num_slots, WIDTH - 1, conv_dim),
        ssm_state=randn(num_slots, num_v_heads, head_v_dim, head_k_dim, std=0.3, dt=state_dtype),
    )


def rel_err(x, ref):
    x, ref = x.double(), ref.to(x.device, torch.float64)
    assert not torch.isnan(x).any(), "NaN in output"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def verified_layers(lens, slots, num_layers, max_len, **shape):
    """Layers verified into one layered workspace (as the engine does before a commit), with their states before."""
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    slots = slots.to(torch.int32).to(DEVICE)
    num_slots = 2 * len(lens) + 4
    layers = [make_layer(lens, num_slots, seed=7 + layer, **shape) for layer in range(num_layers)]
    p0 = layers[0]
    num_v_heads, head_v_dim, head_k_dim = p0["ssm_state"].shape[1:]
    num_k_heads = (p0["mixed_qkv"].shape[1] - num_v_heads * head_v_dim) // (2 * head_k_dim)
    ws = GDNVerifyWorkspace.allocate(num_layers, len(lens), max_len, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                                     p0["mixed_qkv"].dtype, p0["ssm_state"].device)
    before = [(p["ssm_state"].clone(), p["conv_state"].clone()) for p in layers]
    for layer, p in enumerate(layers):
        gdn_verify(**p, state_indices=slots, cu_seqlens=cu, workspace=ws.layer(layer), max_seqlen=max(lens))
    table = GDNStateTable([p["ssm_state"] for p in layers], [p["conv_state"] for p in layers], WIDTH)
    return layers, before, table, ws, slots, cu


def reference(p, before, slots, cu, counts, ckpt_slots=None, ckpt_lens=None, parts="all"):
    """The float64 replay from the states `before`, on DEVICE (on the GPU its small float64 ops stay off the host's
    cores, which the other xdist workers share); the index tensors it reads one element at a time on the host."""
    ref = {**p, "ssm_state": before[0].to(torch.float64, copy=True),
           "conv_state": before[1].to(torch.float64, copy=True)}
    naive_gdn_reconstruct(**ref, state_indices=slots.cpu(), cu_seqlens=cu.cpu(), num_accepted=counts.cpu(),
                          checkpoint_indices=None if ckpt_slots is None else ckpt_slots.cpu(),
                          checkpoint_lens=None if ckpt_lens is None else ckpt_lens.cpu(), parts=parts, device=DEVICE)
    return ref["ssm_state"], ref["conv_state"]


def every_checkpoint_position(length):
    """One request per (n, c), 0 <= c <= n <= length, plus requests without a checkpoint (slot 0), one whose
    checkpoint slot is its own, one with c > n (clamped to n) and a null request (slot 0)."""
    pairs = [(n, c) for n in range(length + 1) for c in range(n + 1)]
    counts = [n for n, _ in pairs] + [length, 2, length, 3, 1]
    ckpt_lens = [c for _, c in pairs] + [2, 1, 1, 5, 1]
    num_requests = len(counts)
    # running slots 1..B, checkpoint slots B+1..2B (distinct, none a running slot)
    slots = torch.arange(1, num_requests + 1)
    slots[-1] = 0
    ckpt_slots = torch.arange(num_requests + 1, 2 * num_requests + 1)
    ckpt_slots[len(pairs)] = 0       # no checkpoint
    ckpt_slots[len(pairs) + 1] = -1  # none either
    ckpt_slots[len(pairs) + 2] = slots[len(pairs) + 2]  # its own slot: the committed state wins
    as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)  # noqa: E731
    return [length] * num_requests, slots, as_int(counts), ckpt_slots.to(torch.int32).to(DEVICE), as_int(ckpt_lens)


@functools.cache
def _verified_every_checkpoint_position(length, num_layers, **shape):
    lens, slots, counts, ckpt_slots, ckpt_lens = every_checkpoint_position(length)
    layers, before, _, ws, slots, cu = verified_layers(lens, slots, num_layers=num_layers, max_len=16, **shape)
    return layers, before, ws, slots, cu, counts, ckpt_slots, ckpt_lens


def verified_every_checkpoint_position(length, num_layers, **shape):
    """`every_checkpoint_position(length)` through `verified_layers` (max_len 16), verified once per arguments and
    shared by the cases that differ only in how they commit (CI time: the interpreted verify was ~80 % of each such
    case). Each call gets its own copies of the verified states; the reconstruction only reads the workspace."""
    verified, before, ws, slots, cu, counts, ckpt_slots, ckpt_lens = _verified_every_checkpoint_position(
        length, num_layers, **shape)
    layers = [{**p, "ssm_state": p["ssm_state"].clone(), "conv_state": p["conv_state"].clone()} for p in verified]
    table = GDNStateTable([p["ssm_state"] for p in layers], [p["conv_state"] for p in layers], WIDTH)
    return layers, before, table, ws, slots, cu, counts, ckpt_slots, ckpt_lens


@needs_kernels
@pytest.mark.parametrize("length", [5, 2])
@pytest.mark.parametrize("outer_loop", [False, True], ids=["product", "loop"])
def test_every_checkpoint_position_over_layers(length, outer_loop):
    layers, before, table, ws, slots, cu, counts, ckpt_slots, ckpt_lens = verified_every_checkpoint_position(length, 2)
    gdn_reconstruct(table, ws, slots, counts, cu, outer_loop=outer_loop, block_v=16,
                    checkpoint_indices=ckpt_slots, checkpoint_lens=ckpt_lens)
    for p, state in zip(layers, before):
        ref_ssm, ref_conv = reference(p, state, slots, cu, counts, ckpt_slots, ckpt_lens)
        assert rel_err(p["ssm_state"], ref_ssm) < 1e-5
        assert rel_err(p["conv_state"], ref_conv) < 1e-7
        # slots that no row wrote (checkpoints of rows with c = 0 or n = 0) kept their contents
        written = (ref_ssm - state[0].double()).flatten(1).abs().amax(1) > 0
        untouched = (~written).nonzero().flatten()
        assert torch.equal(p["ssm_state"][untouched.to(DEVICE)], state[0][untouched.to(DEVICE)])


@needs_kernels
def test_short_form_commits_after_the_checkpoint_pass(monkeypatch):
    """Where the tuned file claims the short form (max_len <= 4), it commits the running states after the checkpoint
    pass of the general kernel; the result is the reference's, checkpoints included."""
    from hybridspec_kernels.gdn_verify import reconstruct_short as short

    claimed = []
    monkeypatch.setattr(short, "_tuned_short", lambda *a: claimed.append(a) or dict(short=True, block_v=16,
                                                                                      num_warps=2))
    lens, slots, counts, ckpt_slots, ckpt_lens = every_checkpoint_position(4)
    layers, before, table, ws, slots, cu = verified_layers(lens, slots, num_layers=2, max_len=4)
    gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=ckpt_slots, checkpoint_lens=ckpt_lens)
    assert claimed, "the short form was not offered the plain pass"
    for p, state in zip(layers, before):
        ref_ssm, ref_conv = reference(p, state, slots, cu, counts, ckpt_slots, ckpt_lens)
        assert rel_err(p["ssm_state"], ref_ssm) < 1e-5
        assert rel_err(p["conv_state"], ref_conv) < 1e-7


@needs_kernels
def test_checkpoint_equals_reconstruction_to_its_length():
    """The checkpoint slot holds what a plain reconstruction of c tokens into that slot gives (same kernel)."""
    lens = [7, 3, 6, 1]
    counts = torch.tensor([6, 3, 6, 1], dtype=torch.int32, device=DEVICE)
    ckpt_lens = torch.tensor([3, 1, 6, 1], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([2, 5, 1, 7])
    ckpt = torch.tensor([3, 4, 6, 8], dtype=torch.int32, device=DEVICE)
    layers, before, table, ws, slots, cu = verified_layers(lens, slots, num_layers=1, max_len=8, num_v_heads=2,
                                                           num_k_heads=1, head_v_dim=16)
    p = layers[0]
    gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=ckpt, checkpoint_lens=ckpt_lens)
    got_ssm, got_conv = p["ssm_state"][ckpt.long()].clone(), p["conv_state"][ckpt.long()].clone()
    p["ssm_state"].copy_(before[0][0])
    p["conv_state"].copy_(before[0][1])
    p["ssm_state"][ckpt.long()] = before[0][0][slots.long()]
    p["conv_state"][ckpt.long()] = before[0][1][slots.long()]
    gdn_reconstruct(table, ws, ckpt, ckpt_lens, cu)  # the same rows of the workspace, c tokens, into the copies
    assert rel_err(got_ssm, p["ssm_state"][ckpt.long()]) < 1e-6
    assert torch.equal(got_conv, p["conv_state"][ckpt.long()])


@needs_kernels
@pytest.mark.parametrize("parts", ["conv", "ssm"])
def test_checkpoint_follows_parts(parts):
    layers, before, table, ws, slots, cu, counts, ckpt_slots, ckpt_lens = verified_every_checkpoint_position(
        3, 1, dtype=torch.float16)
    gdn_reconstruct(table, ws, slots, counts, cu, parts=parts, checkpoint_indices=ckpt_slots,
                    checkpoint_lens=ckpt_lens)
    ref_ssm, ref_conv = reference(layers[0], before[0], slots, cu, counts, ckpt_slots, ckpt_lens, parts=parts)
    assert rel_err(layers[0]["ssm_state"], ref_ssm) < 1e-5
    assert rel_err(layers[0]["conv_state"], ref_conv) < 1e-7
    untouched = "ssm_state" if parts == "conv" else "conv_state"
    assert torch.equal(layers[0][untouched], before[0][0 if parts == "conv" else 1])


@needs_kernels
def test_without_checkpoint_rows_commit_as_before():
    """A checkpoint call whose rows all lack a slot changes exactly what the call without checkpoints changes."""
    lens = [5, 3, 1]
    counts = torch.tensor([4, 3, 1], dtype=torch.int32, device=DEVICE)
    layers, before, table, ws, slots, cu = verified_layers(lens, torch.tensor([3, 1, 2]), num_layers=1, max_len=8)
    none = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=none, checkpoint_lens=counts)
    with_none = layers[0]["ssm_state"].clone(), layers[0]["conv_state"].clone()
    layers[0]["ssm_state"].copy_(before[0][0])
    layers[0]["conv_state"].copy_(before[0][1])
    gdn_reconstruct(table, ws, slots, counts, cu)
    assert torch.equal(with_none[0], layers[0]["ssm_state"]) and torch.equal(with_none[1], layers[0]["conv_state"])


def test_naive_checkpoint_is_the_state_after_c_tokens():
    """The reference's checkpoint equals the reference replaying c tokens (no kernel involved)."""
    lens = [6, 4]
    p = make_layer(lens, num_slots=6, device="cpu")
    cu = torch.tensor([0, 6, 10], dtype=torch.int32)
    slots, ckpt = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([4, 5], dtype=torch.int32)
    counts, ckpt_lens = torch.tensor([5, 4], dtype=torch.int32), torch.tensor([2, 4], dtype=torch.int32)
    ssm, conv = p["ssm_state"].double(), p["conv_state"].double()
    ref = {**p, "ssm_state": ssm.clone(), "conv_state": conv.clone()}
    naive_gdn_reconstruct(**ref, state_indices=slots, cu_seqlens=cu, num_accepted=counts, checkpoint_indices=ckpt,
                          checkpoint_lens=ckpt_lens)
    plain = {**p, "ssm_state": ssm.clone(), "conv_state": conv.clone()}
    plain["ssm_state"][ckpt.long()] = ssm[slots.long()]
    plain["conv_state"][ckpt.long()] = conv[slots.long()]
    naive_gdn_reconstruct(**plain, state_indices=ckpt, cu_seqlens=cu, num_accepted=ckpt_lens)
    assert torch.equal(ref["ssm_state"][ckpt.long()], plain["ssm_state"][ckpt.long()])
    assert torch.equal(ref["conv_state"][ckpt.long()], plain["conv_state"][ckpt.long()])


def test_checkpoint_bad_input():
    lens = [3, 2]
    p = make_layer(lens, num_slots=5, device="cpu")
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    slots, counts = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([2, 2], dtype=torch.int32)
    ws = GDNVerifyWorkspace.allocate(1, 2, 4, 2, 4, 16, 32, torch.float32, torch.device("cpu"))
    table = GDNStateTable([p["ssm_state"]], [p["conv_state"]], WIDTH)
    ckpt = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="pass both or neither"):
        gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=ckpt)
    with pytest.raises(ValueError, match="pass both or neither"):
        gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_lens=counts)
    with pytest.raises(ValueError, match=r"checkpoint_indices must have shape \[2\]"):
        gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=ckpt[:1], checkpoint_lens=counts)
    with pytest.raises(ValueError, match="checkpoint_lens must be int32 or int64"):
        gdn_reconstruct(table, ws, slots, counts, cu, checkpoint_indices=ckpt, checkpoint_lens=counts.float())
    with pytest.raises(ValueError, match="pass both or neither"):
        naive_gdn_reconstruct(**p, state_indices=slots, cu_seqlens=cu, num_accepted=counts, checkpoint_lens=counts)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or INTERPRETED, reason="needs CUDA")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("outer_loop", [False, True], ids=["product", "loop"])
def test_gpu_checkpoint_real_shape_bf16(state_dtype, outer_loop):
    """Qwen3-Next's GDN shape (16 k-heads, 32 v-heads, 128 x 128), bf16 inputs, verify length 4 (MTP K=3), two
    layers: every (n, c) pair of the length plus rows without a checkpoint, against float64 token by token."""
    lens, slots, counts, ckpt_slots, ckpt_lens = every_checkpoint_position(4)
    shape = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, dtype=torch.bfloat16,
                 state_dtype=state_dtype)
    layers, before, table, ws, slots, cu = verified_layers(lens, slots, num_layers=2, max_len=4, **shape)
    gdn_reconstruct(table, ws, slots, counts, cu, outer_loop=outer_loop, checkpoint_indices=ckpt_slots,
                    checkpoint_lens=ckpt_lens)
    for p, state in zip(layers, before):
        ref_ssm, ref_conv = reference(p, state, slots, cu, counts, ckpt_slots, ckpt_lens)
        assert rel_err(p["ssm_state"], ref_ssm) < (1e-3 if state_dtype == torch.float32 else 1e-2)
        assert rel_err(p["conv_state"], ref_conv) == 0
