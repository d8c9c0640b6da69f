"""Estimators and baselines that work on the same model and data objects as CE-EM."""
