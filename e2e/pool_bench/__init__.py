"""The shared-pool benchmark (python -m e2e.pool_bench): see __main__.py."""
