"""UnsupportedModelError, apart from config.py so that config.py and the modules it builds on (moe_config.py)
raise the same error without importing each other in a cycle. config.py re-exports it, its usual address."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A config that Flotilla's runtime cannot run; the message says what to change."""
