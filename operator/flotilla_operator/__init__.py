"""Flotilla's control plane: the InferenceModel CRD and the kopf operator that reconciles it."""
