"""Data loading with PyTorch's habits over the actor runtime: ``DataLoader``, ``Dataset``,
``IterableDataset``, ``TensorDataset``, ``default_collate``."""

from .loader import DataLoader, Dataset, IterableDataset, TensorDataset, default_collate

__all__ = ["DataLoader", "Dataset", "IterableDataset", "TensorDataset", "default_collate"]
