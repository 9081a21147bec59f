"""Neural-network modules with PyTorch's habits: ``Module``, ``Parameter``, the layers,
the losses, ``nn.functional``, ``nn.init`` and ``nn.utils``."""

from . import functional, init, utils
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv2d, MaxPool2d
from .graph import Graph
from .layers import (
    GELU,
    BatchNorm1d,
    BatchNorm2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Identity,
    LayerNorm,
    Linear,
    LogSoftmax,
    ModuleDict,
    ModuleList,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
from .module import Module, Parameter
from .transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "ReLU",
    "GELU",
    "Tanh",
    "Sigmoid",
    "Softmax",
    "LogSoftmax",
    "Sequential",
    "Dropout",
    "LayerNorm",
    "Embedding",
    "Identity",
    "Flatten",
    "BatchNorm1d",
    "BatchNorm2d",
    "GroupNorm",
    "SiLU",
    "ModuleList",
    "ModuleDict",
    "CrossEntropyLoss",
    "NLLLoss",
    "MSELoss",
    "Graph",
    "functional",
    "init",
    "utils",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
]
