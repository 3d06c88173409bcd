"""`hybridspec_kernels._fast_math.sigmoid` (the GDN conv's SiLU): the interpreter's tl.sigmoid, and on the GPU the
inline-PTX form, both within a few fp32 ulps of the float64 sigmoid over the whole fp32 range."""
import os

import pytest
import torch
import triton
import triton.language as tl

from hybridspec_kernels._fast_math import COMPILED, sigmoid

ON_GPU = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _sigmoid_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, sigmoid(tl.load(x + o, mask=o < n, other=0.0)), mask=o < n)


def _inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(30001, generator=g) * 8.0  # odd size: a partial last block
    wide = torch.linspace(-120.0, 120.0, 4097)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, 88.8, 89.0, -87.0, -88.8, -89.0, 103.0, -103.0,
                          float("inf"), float("-inf")])
    return torch.cat([dense, wide, edges]).to(device)


def _run(x):
    y = torch.empty_like(x)
    _sigmoid_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def _check(x, y):
    ref = torch.sigmoid(x.double())
    err = (y.double() - ref).abs()
    # relative to the value: a few ulps, plus |x| ulps where exp(-x) is large (x * log2(e) rounded to fp32 before
    # ex2, as tl.exp does it too); an absolute floor at fp32's smallest normal: the GPU form flushes results below it
    bound = (4.0 + x.double().abs().nan_to_num(posinf=0.0)) * 2.0 ** -24 * ref.abs() + 2.0 ** -126
    assert (err <= bound).all(), float((err / bound).max())
    assert torch.equal(y[x == float("inf")].cpu(), torch.ones(1)) and (y[x == float("-inf")] == 0).all()


def test_sigmoid_under_the_interpreter_is_tl_sigmoid():
    if not INTERPRETED:
        pytest.skip("interpreter path")
    assert not COMPILED
    x = _inputs("cpu")
    _check(x, _run(x))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or INTERPRETED, reason="needs CUDA")
def test_gpu_fast_sigmoid_within_ulps():
    assert COMPILED
    x = _inputs("cuda", seed=1)
    _check(x, _run(x))
    assert torch.isnan(_run(torch.tensor([float("nan")], device="cuda"))).all()
