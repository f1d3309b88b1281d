"""flotilla-gateway: one OpenAI endpoint for the whole fleet (docs/gateway.md).

It routes on the request's `model`, holds requests for a model at zero replicas while it wakes it, and
picks a pod by load or by prompt prefix. Torch-free: it imports only the contract package, never the
server or the operator (`.importlinter` enforces it; docs/gateway.md, "Layers").
"""
