"""Benchmarks: performance targets printed as ratios against a baseline in the same process."""
