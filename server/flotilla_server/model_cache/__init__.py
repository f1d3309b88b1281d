"""The LRU model cache of a multi-model server: a pure policy (policy.py) and its loader shell."""
