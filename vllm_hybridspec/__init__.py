"""vllm-hybridspec: fast speculative decoding on hybrid Gated-DeltaNet + MoE targets, as a vLLM plugin."""

__version__ = "0.1.0"
