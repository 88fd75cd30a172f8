"""Benchmarks: measured comparisons run as ``python -m benchmarks.NAME`` from the checkout."""
