"""``af.save`` / ``af.load``: a state dict (names to tensors, nested dicts allowed) in
numpy's ``.npz`` format: arrays only, never pickled code, so loading a file cannot run
anything."""

from __future__ import annotations

import os

import numpy as np

from .creation import tensor
from .tensor.tensor import Tensor

_SEP = "/"
_NUMBER = "#"           # marks a Python number (it is loaded back as one)


def _flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        if not obj and prefix:
            raise ValueError(f"af.save: the dict at {prefix!r} is empty; nothing to save there")
        for k, v in obj.items():
            if not isinstance(k, str) or _SEP in k or not k or k.startswith(_NUMBER):
                raise ValueError(f"af.save: keys must be non-empty strings without "
                                 f"{_SEP!r} that do not start with {_NUMBER!r}, got {k!r}")
            _flatten(v, f"{prefix}{_SEP}{k}" if prefix else k, out)
        return
    if isinstance(obj, Tensor):
        if not obj._impl.blob.backend.has_data:
            raise ValueError(f"af.save: {prefix!r} is on the {obj.device} device, which has "
                             f"no data")
        out[prefix] = obj.detach().numpy()
    elif isinstance(obj, (bool, int, float)):
        out[_NUMBER + prefix] = np.asarray(obj)       # comes back as a Python number
    elif isinstance(obj, (np.ndarray, np.generic)):
        out[prefix] = np.asarray(obj)
    else:
        raise TypeError(f"af.save: {prefix or 'the object'!r} is a {type(obj).__name__}; a "
                        f"saved state holds tensors, arrays and numbers in (nested) dicts")


def save(obj: dict, path) -> None:
    """Writes ``obj`` (e.g. ``model.state_dict()``) to ``path`` as ``.npz``."""
    if not isinstance(obj, dict):
        raise TypeError(f"af.save: expected a dict (a state_dict), got {type(obj).__name__}")
    arrays: dict = {}
    _flatten(obj, "", arrays)
    path = os.fspath(path)
    with open(path, "wb") as f:         # (np.savez would append .npz to a bare name)
        np.savez(f, **arrays)


def load(path) -> dict:
    """Reads what ``save`` wrote: tensors (and Python numbers) in the same dicts."""
    out: dict = {}
    with np.load(os.fspath(path), allow_pickle=False) as data:
        for key in data.files:
            a = data[key]
            value = tensor(a)
            if key.startswith(_NUMBER):
                key, value = key[1:], a.item()
            d = out
            parts = key.split(_SEP)
            for p in parts[:-1]:
                d = d.setdefault(p, {})
            d[parts[-1]] = value
    return out
