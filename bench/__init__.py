"""Benchmarks that print their figures (``make bench``). Nothing here asserts."""
