"""DSpark's serial head walk through hybridspec's resident-W2 megakernel (hybridspec_kernels.head_walk).

With `additional_config={"hybridspec": {"enabled": true, "head_walk": "megakernel"}}` and a `dspark` speculative
config, `DSparkSpeculator._sample_sequential` runs `walk.sample_sequential`; the config's `head_walk: reference`
runs the kernel's torch reference instead. Anything the kernel does not reproduce exactly (draft top-k mode, a
draft watermarker, fp64 Gumbel, other head types, a vLLM whose walk changed, no GPU and no Triton interpreter)
leaves vLLM's walk in place, logged and recorded in `vllm_hybridspec.status` ("head_walk").

- walk.py: `sample_sequential` (the step), `why_not` (the fallbacks), `WalkPlan`.
- patches.py: `UseHybridSpecHeadWalk`, the one patched vLLM method.
- upstream.py: digests of the vLLM code the walk reproduces, per vLLM release.

walk.py (torch, vLLM) loads only when the walk first runs.
"""
# The patch manifest imports patches.py, and patches.py the framework inside the manifest's package: loading the
# manifest first keeps that cycle in one order whichever module is imported first.
import vllm_hybridspec.patches  # noqa: F401
