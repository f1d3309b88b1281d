"""The HTTP layer: OpenAI routes, bounded admission, SSE, metrics, the load report, drain on SIGTERM.

Torch-free: it reaches the engine through `flotilla_server.engine.client` only (docs/architecture.md,
"Layers").
"""
