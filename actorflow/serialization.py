"""``af.save`` / ``af.load``: a state dict (names to tensors, nested dicts allowed; an
optimizer's state_dict too) in numpy's ``.npz`` format: arrays, and plain values as JSON
text, never pickled code, so loading a file cannot run anything."""

from __future__ import annotations

import json
import os

import numpy as np

from .creation import tensor
from .tensor.tensor import Tensor

_SEP = "/"
_PLAIN = "#"            # marks a plain value (number, string, None, list): JSON text
_INT_KEY = "%"          # marks an int key (an optimizer's state by parameter index)


def _key(k, prefix: str) -> str:
    if isinstance(k, int) and not isinstance(k, bool):
        return f"{_INT_KEY}{k}"
    if not isinstance(k, str) or _SEP in k or not k or k[0] in (_PLAIN, _INT_KEY):
        raise ValueError(f"af.save: keys must be ints or non-empty strings without {_SEP!r} "
                         f"that do not start with {_PLAIN!r} or {_INT_KEY!r}; got {k!r} at "
                         f"{prefix or 'the top'!r}")
    return k


def _plain(obj) -> bool:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return True
    return isinstance(obj, (list, tuple)) and all(_plain(x) for x in obj)


def _flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        if not obj and prefix:
            raise ValueError(f"af.save: the dict at {prefix!r} is empty; nothing to save there")
        for k, v in obj.items():
            name = _key(k, prefix)
            _flatten(v, f"{prefix}{_SEP}{name}" if prefix else name, out)
        return
    if isinstance(obj, Tensor):
        if not obj._impl.blob.backend.has_data:
            raise ValueError(f"af.save: {prefix!r} is on the {obj.device} device, which has "
                             f"no data")
        out[prefix] = obj.detach().numpy()
    elif isinstance(obj, (np.ndarray, np.generic)):
        out[prefix] = np.asarray(obj)
    elif isinstance(obj, (list, tuple)) and obj and all(isinstance(x, dict) for x in obj):
        for i, x in enumerate(obj):               # a list of dicts (param_groups): by index
            _flatten(x, f"{prefix}{_SEP}[{i}]", out)
    elif _plain(obj):
        out[_PLAIN + prefix] = np.array(json.dumps(obj))    # comes back as it was (a tuple
    else:                                                   # as a list)
        raise TypeError(f"af.save: {prefix or 'the object'!r} is a {type(obj).__name__}; a "
                        f"saved state holds tensors, arrays, numbers, strings and lists of "
                        f"them in (nested) dicts")


def save(obj: dict, path) -> None:
    """Writes ``obj`` (``model.state_dict()``, ``opt.state_dict()``, or a dict of them) to
    ``path`` as ``.npz``."""
    if not isinstance(obj, dict):
        raise TypeError(f"af.save: expected a dict (a state_dict), got {type(obj).__name__}")
    arrays: dict = {}
    _flatten(obj, "", arrays)
    path = os.fspath(path)
    with open(path, "wb") as f:         # (np.savez would append .npz to a bare name)
        np.savez(f, **arrays)


def _part(p: str):
    return int(p[1:]) if p.startswith(_INT_KEY) else p


def load(path) -> dict:
    """Reads what ``save`` wrote: tensors, plain values and lists of dicts, in the same
    nesting."""
    out: dict = {}
    with np.load(os.fspath(path), allow_pickle=False) as data:
        for key in data.files:
            a = data[key]
            if key.startswith(_PLAIN):
                key, value = key[1:], json.loads(str(a))
            else:
                value = tensor(a)
            d = out
            parts = key.split(_SEP)
            for p in parts[:-1]:
                d = d.setdefault(_part(p), {})
            d[_part(parts[-1])] = value
    return _lists(out)


def _lists(d):
    """Dicts whose keys are all ``[i]`` back into lists."""
    if not isinstance(d, dict):
        return d
    d = {k: _lists(v) for k, v in d.items()}
    keys = list(d)
    if keys and all(isinstance(k, str) and k.startswith("[") and k.endswith("]") for k in keys):
        return [d[f"[{i}]"] for i in range(len(keys))]
    return d
