"""avbench: benchmark speculative decoding and Adaptive Verification in vLLM."""

__version__ = "0.1.0"
