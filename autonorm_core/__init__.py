"""The science of autonorm-studies, in pure PyTorch: norms, affine-divergence layers, models, data, training.

Imports no Ray, Optuna or MLflow, so it works from a notebook with torch alone.
"""
