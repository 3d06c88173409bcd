"""The conv's SiLU sigmoid in four instructions where the kernels are compiled.

`tl.sigmoid(x)` = 1 / (1 + exp(-x)) compiles (sm_90, triton 3.6) to about twelve instructions an element: ex2.approx
with the denormal range check around it, and div.full's reciprocal with its large-divisor check. The GDN verify
kernels take it on every conv output ([L, 128] q and k, [L, BV] v a program), where it was the largest elementwise
cost of the prep's instruction stream. `sigmoid` here is mul + ex2.approx.ftz + add + rcp.approx.ftz: the same
exp approximation, a reciprocal within one ulp where div.full allows two, and results flushed to zero only where
the sigmoid itself is below 1.2e-38 or exp(-x) is (then 1 either way). Under the Triton interpreter, which cannot run
inline PTX, it is `tl.sigmoid`.
"""
import triton
import triton.language as tl

from ._pdl import interpreted


@triton.jit
def _probe():
    pass


COMPILED = tl.constexpr(not interpreted(_probe))


@triton.jit
def sigmoid(x):
    """Elementwise fp32 1 / (1 + exp(-x)) (see the module)."""
    if COMPILED:
        return tl.inline_asm_elementwise(
            """{
            .reg .f32 %sg_t;
            mul.f32 %sg_t, $1, 0fBFB8AA3B;
            ex2.approx.ftz.f32 %sg_t, %sg_t;
            add.f32 %sg_t, %sg_t, 0f3F800000;
            rcp.approx.ftz.f32 $0, %sg_t;
            }""", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.sigmoid(x)
