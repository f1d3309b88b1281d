"""flotilla-sim: a fleet simulator that drives the operator's and gateway's own decision code.

It exists to answer, before a fleet is built, what a placement policy will cost and what TTFT it will
hold (docs/simulation.md). It is torch-free and effect-free; .importlinter keeps it so.
"""
