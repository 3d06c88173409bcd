"""`hybridspec_kernels._fast_math.sigmoid` (the GDN conv's SiLU): under the interpreter tl.sigmoid; compiled, the
inline-PTX form, no further from the float64 sigmoid than tl.sigmoid's own compiled form (within 2 fp32 ulps),
over the whole fp32 range."""
import os

import pytest
import torch

# Without CUDA the kernels run in the Triton interpreter, which Triton fixes when a function is defined: set the flag
# before triton is first imported in this process (as tests/ops/test_gdn_verify.py does).
ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from hybridspec_kernels._fast_math import COMPILED, sigmoid  # noqa: E402


@triton.jit
def _sigmoid_kernel(x, y, n, FAST: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + o, mask=o < n, other=0.0)
    tl.store(y + o, sigmoid(v) if FAST else tl.sigmoid(v), mask=o < n)


def _inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(30001, generator=g) * 8.0  # odd size: a partial last block
    wide = torch.linspace(-120.0, 120.0, 4097)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, 88.8, 89.0, -87.0, -88.8, -89.0, 103.0, -103.0,
                          float("inf"), float("-inf")])
    return torch.cat([dense, wide, edges]).to(device)


def _run(x, fast=True):
    y = torch.empty_like(x)
    _sigmoid_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), FAST=fast, BLOCK=1024)
    return y


def _error(x, y):
    return (y.double() - torch.sigmoid(x.double())).abs()


def test_sigmoid_under_the_interpreter_is_tl_sigmoid():
    if not INTERPRETED:
        pytest.skip("interpreter path")
    assert not COMPILED
    x = _inputs("cpu")
    assert torch.equal(_run(x), _run(x, fast=False))
    assert (_error(x, _run(x)) <= 2.0 ** -22 * torch.sigmoid(x.double()) + 2.0 ** -126).all()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or INTERPRETED, reason="needs CUDA")
def test_gpu_fast_sigmoid_within_ulps():
    assert COMPILED
    x = _inputs("cuda", seed=1)
    fast, slow = _run(x), _run(x, fast=False)
    ref = torch.sigmoid(x.double())
    # 2 ulps of the value more than tl.sigmoid's error, or fp32's smallest normal: the fast form flushes below it
    excess = _error(x, fast) - _error(x, slow) - 2.0 ** -22 * ref
    worst = int(excess.argmax())
    assert (excess <= 2.0 ** -126).all(), (float(x[worst]), float(fast[worst]), float(slow[worst]), float(ref[worst]))
    assert torch.equal(fast[x == float("inf")], slow[x == float("inf")]) and (fast[x == float("-inf")] == 0).all()
    assert torch.isnan(_run(torch.tensor([float("nan")], device="cuda"))).all()
