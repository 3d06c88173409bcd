"""Package layout only; metadata lives in pyproject.toml.

The kernel folder is `triton_kernels/` in the repository but is installed under the import name
`hybridspec_kernels`: vLLM probes for a top-level `triton_kernels` (OpenAI's MoE kernels) and must never
find ours.
"""
from setuptools import find_packages, setup

KERNEL_FOLDER, KERNEL_IMPORT_NAME = "triton_kernels", "hybridspec_kernels"

kernel_packages = [
    KERNEL_IMPORT_NAME + name[len(KERNEL_FOLDER):] for name in find_packages(include=[KERNEL_FOLDER, KERNEL_FOLDER + ".*"])
]
setup(
    packages=find_packages(include=["vllm_hybridspec", "vllm_hybridspec.*"]) + kernel_packages,
    package_dir={KERNEL_IMPORT_NAME: KERNEL_FOLDER},
    package_data={"vllm_hybridspec": ["data/*"], KERNEL_IMPORT_NAME: ["*/*.json"]},
)
