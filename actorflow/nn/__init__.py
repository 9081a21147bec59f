"""Neural-network modules with PyTorch's habits: ``Module``, ``Parameter``, the layers,
the losses, ``nn.functional`` and ``nn.init``."""

from . import functional, init
from .layers import (GELU, Dropout, Embedding, Flatten, Identity, LayerNorm, Linear,
                     LogSoftmax, ModuleDict, ModuleList, ReLU, Sequential, Sigmoid, Softmax,
                     Tanh)
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv2d, MaxPool2d
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
from .graph import Graph
from .module import Module, Parameter

__all__ = ["Module", "Parameter", "Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax",
           "LogSoftmax", "Sequential", "Dropout", "LayerNorm", "Embedding", "Identity",
           "Flatten", "ModuleList", "ModuleDict", "Conv2d", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "CrossEntropyLoss", "NLLLoss", "MSELoss", "Graph", "functional", "init"]
