"""A neighbour that holds whole SMs for a while (GPU only): programs of 128 KiB of shared memory each, so no walk
program (> 100 KiB) fits beside one, kept busy by dependent shared-memory rounds. The walk's co-residency checks
(bench_head_walk.py --neighbour-check, test_head_walk's cooperative-launch test) launch it on another stream."""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

HOLD_WORDS = 32 * 1024  # int32: 128 KiB a program
_BUSY = 512


@gluon.jit
def hold_sms_kernel(out_ptr, rounds, WORDS: gl.constexpr, BUSY: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([BUSY // 128], [32], [4], [0])
    smem = gl.allocate_shared_memory(gl.int32, [WORDS], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    busy = smem.slice(0, BUSY)
    offs = gl.arange(0, BUSY, layout)
    busy.store(offs)
    acc = gl.zeros([BUSY], gl.int32, layout)
    for i in range(rounds):
        acc = acc * 3 + busy.load(layout) + i
        busy.store(acc)
    gl.store(out_ptr + gl.program_id(0) * BUSY + offs, acc)


_rounds_per_ms: dict = {}


def hold_sms(programs: int, ms: float, device: torch.device) -> None:
    """Launches `programs` holders on the current stream, each busy for about `ms` milliseconds (calibrated once
    per device, alone)."""
    out = torch.empty(programs * _BUSY, dtype=torch.int32, device=device)
    key = str(device)
    if key not in _rounds_per_ms:
        probe = 20000
        hold_sms_kernel[(1,)](out, probe, WORDS=HOLD_WORDS, BUSY=_BUSY, num_warps=4)  # compiled outside the timing
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        hold_sms_kernel[(1,)](out, probe, WORDS=HOLD_WORDS, BUSY=_BUSY, num_warps=4)
        end.record()
        torch.cuda.synchronize(device)
        _rounds_per_ms[key] = probe / max(start.elapsed_time(end), 1e-3)
    hold_sms_kernel[(programs,)](out, max(1, int(ms * _rounds_per_ms[key])), WORDS=HOLD_WORDS, BUSY=_BUSY,
                                 num_warps=4)
