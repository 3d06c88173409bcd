"""A copy that lets the next launch start before it writes (GPU tests of programmatic dependent launch).

`late_copy(dst, src)` launches one kernel that first signals griddepcontrol.launch_dependents (so a kernel launched
after it with PDL may start at once), then spins, then copies src into dst. A PDL-launched kernel right after it
that read dst before its griddepcontrol.wait would read the old contents: the tests' way to show the wait is there.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _late_copy_kernel(src, dst, n, SPIN: tl.constexpr, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()
    acc = tl.program_id(0).to(tl.float32) + 1.0
    for _ in range(SPIN):  # a dependent chain: ~4 cycles an iteration, tens of us in all
        acc = acc * 0.9999 + 1.0
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask)
    tl.store(dst + offs, tl.where(acc > 0.0, x, x + 1), mask=mask)  # the store waits for the spin


def late_copy(dst: torch.Tensor, src: torch.Tensor, spin: int = 20000) -> None:
    assert dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype and dst.numel() == src.numel()
    block = 1024
    _late_copy_kernel[(triton.cdiv(dst.numel(), block),)](src.view(-1), dst.view(-1), dst.numel(), SPIN=spin,
                                                           BLOCK=block)
