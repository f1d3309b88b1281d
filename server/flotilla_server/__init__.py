"""Flotilla's data plane: a continuous-batching, OpenAI-compatible LLM server."""
