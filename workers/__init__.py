"""Execution layer: Ray Tune trainable, Optuna search, scheduling, restore and MLflow tracking."""
