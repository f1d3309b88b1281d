"""Benchmarks (`flotilla-bench`): they report figures; the tests check behaviour."""
