"""vllm-hybridspec: fast speculative decoding on hybrid Gated-DeltaNet + MoE targets (a vLLM general plugin)."""
__version__ = "0.1.0"
