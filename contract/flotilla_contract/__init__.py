"""The torch-free contract shared by flotilla-server, flotilla-operator and flotilla-gateway.

Each name the three programs must agree on is defined here once: the server's flags and their defaults,
metric names, label keys, sizes, and the load report the servers publish. This package imports only the
standard library and pydantic (docs/architecture.md, "Layers").
"""
