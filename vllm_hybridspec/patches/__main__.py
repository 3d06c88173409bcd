from vllm_hybridspec.patches import manifest_table

print(manifest_table())
