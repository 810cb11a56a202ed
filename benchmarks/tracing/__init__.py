"""The ledger tracer (``benchmarks/derive_ledger.py``): op recorder, CUDA autocast on CPU, framework steps, fit."""
