"""Benchmarks of the gateway itself (`python -m flotilla_gateway.bench.overhead`): figures, not tests."""
