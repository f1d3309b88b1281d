#!/usr/bin/env bash
# Placeholder until the chart work lands: fails loudly so nobody mistakes it for an installed helm.
echo "scripts/install-helm.sh: not written yet" >&2
exit 1
