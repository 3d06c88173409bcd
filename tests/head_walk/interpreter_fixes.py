"""A Triton-interpreter fix the DSpark tests need, applied only in their child processes (not in pytest's).

Triton 3.9's interpreter can turn `bool_block & bool_scalar` into int32 data, which its masked load / store then
reject ("mask has unsupported dtype"). vLLM's Gumbel sampler hits it whenever it caches draft logits
(`mask & is_valid_req` in `gumbel_block_argmax`), so under the MRV2 shim every DSpark step with probabilistic
drafting fails without this. Compiled Triton treats such a mask as i1; so does this fix.
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
