"""Benchmarks of the gateway (`python -m flotilla_gateway.bench.overhead`, `...bench.prefix_routing`): figures, not tests."""
