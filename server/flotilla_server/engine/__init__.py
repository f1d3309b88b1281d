"""The engine: continuous batching over a paged KV cache, in its own thread.

Policy (scheduler, admission in the pool) apart from mechanism (model runner, KV pool); the HTTP layer
sees only `client.EngineClient` and the torch-free types it hands out (docs/architecture.md, "Layers").
"""
