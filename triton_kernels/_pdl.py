"""Programmatic dependent launch (PDL) as this package's kernels take it: a kernel launched with `launch_pdl` may
start while the launch before it ends, and its first statement, `wait_for_the_launch_before`, waits
(griddepcontrol.wait) until that launch has finished and its writes are visible. So the stream's order holds whatever
comes before; only the launches overlap."""
import torch
import triton
import triton.language as tl

# Set by eval/offline_sass.py, which captures launches on CPU tensors to compile them for sm_90 offline: there PDL
# counts as available, so the offline builds are the GPU's.
OFFLINE_SM90 = False


@triton.jit
def wait_for_the_launch_before(PDL: tl.constexpr):
    """With PDL: wait, before any memory access, until the launch before this one has finished (see the module)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


def interpreted(kernel) -> bool:
    """Whether `kernel` runs under the Triton interpreter (fixed when it was defined: TRITON_INTERPRET=1, true, on)."""
    return type(kernel).__name__ == "InterpretedFunction"


def pdl_available(device: torch.device, kernel) -> bool:
    """PDL needs a compiled kernel (not the interpreter) on an sm_90 or later GPU."""
    if interpreted(kernel):
        return False
    if device.type != "cuda":
        return OFFLINE_SM90
    return torch.cuda.get_device_capability(device) >= (9, 0)
