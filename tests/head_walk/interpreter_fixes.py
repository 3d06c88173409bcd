"""Triton-interpreter fixes the DSpark tests need, applied only in their child processes (not in pytest's).

1. Triton 3.9's interpreter can turn `bool_block & bool_scalar` into int32 data, which its masked load / store then
reject ("mask has unsupported dtype"). vLLM's Gumbel sampler hits it whenever it caches draft logits
(`mask & is_valid_req` in `gumbel_block_argmax`), so under the MRV2 shim every DSpark step with probabilistic
drafting fails without this. Compiled Triton treats such a mask as i1; so does this fix.
2. libdevice functions are not interpreted (`use_numpy_log1p`).
"""


def use_bool_masks() -> None:
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_hybridspec_bool_masks", False):
        return
    store, load = builder.create_masked_store, builder.create_masked_load

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, as_bool(mask), cache_policy)

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    builder.create_masked_store = create_masked_store
    builder.create_masked_load = create_masked_load
    builder._hybridspec_bool_masks = True


def use_numpy_log1p() -> None:
    """The interpreter runs `tl` and `tl.math` through numpy but leaves libdevice's stubs, which return None:
    vLLM's probabilistic rejection sampler (`_resample_kernel`: `tldevice.log1p(-ratio)`) then fails. np.log1p
    stands in, for the interpreter only."""
    import numpy as np
    import triton.language as tl
    import triton.language.extra.libdevice as libdevice
    from triton.runtime import interpreter

    if getattr(libdevice, "_hybridspec_log1p", False):
        return

    def log1p(arg0, _semantic=None):
        handle = arg0.handle
        return tl.core.tensor(interpreter.TensorHandle(np.log1p(handle.data), handle.dtype.scalar), arg0.type)

    libdevice.log1p = log1p
    libdevice._hybridspec_log1p = True


def apply_all() -> None:
    use_bool_masks()
    use_numpy_log1p()
