"""hybridspec_kernels: Triton kernels of vllm-hybridspec.

Installed under the import name `hybridspec_kernels` (the folder is `triton_kernels/` in the repository).
Each op lives in its own folder with the fast path and a `naive` reference side by side.
"""
