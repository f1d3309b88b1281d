"""Compatibility shim: the operator on this branch still reads the server's defaults here.

The defaults live in flotilla_contract.flags (docs/architecture.md, "Layers"); the engine's configuration
in flotilla_server.engine.config. Delete this module once the operator imports the contract.
"""

from flotilla_contract.flags import (  # noqa: F401
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_QUEUE_DEPTH_PER_SLOT,
    DEFAULT_QUEUE_TIMEOUT_S,
    DTYPES,
)
