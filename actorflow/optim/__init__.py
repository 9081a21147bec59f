"""Optimizers with PyTorch's update rules: ``SGD``, ``Adam``, ``AdamW``."""

from .optimizer import Optimizer
from .sgd import SGD, Adam, AdamW

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
