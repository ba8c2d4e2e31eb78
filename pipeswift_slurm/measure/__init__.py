"""Measuring what the core predicts: the layer profiler (torch, on a real device) and the
fidelity of the cost model against published Megatron step times.

Imports the core only; torch is imported inside the profiler's functions.
"""
