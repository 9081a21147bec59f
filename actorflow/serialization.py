"""``af.save`` / ``af.load``: a state dict (names to tensors, nested dicts allowed; an
optimizer's state_dict too) in numpy's ``.npz`` format: arrays, and plain values as JSON
text, never pickled code, so loading a file cannot run anything."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .creation import tensor
from .dtype import bfloat16, bfloat16_bits, bfloat16_values
from .tensor.tensor import Tensor

_SEP = "/"
_PLAIN = "#"  # marks a plain value (number, string, None, list): JSON text
_INT_KEY = "%"  # marks an int key (an optimizer's state by parameter index)
_BFLOAT16 = "!"  # marks a bfloat16 tensor, saved as its bits (uint16: numpy has no
# bfloat16)


def _key(k, prefix: str) -> str:
    if isinstance(k, int) and not isinstance(k, bool):
        return f"{_INT_KEY}{k}"
    if (
        not isinstance(k, str)
        or _SEP in k
        or not k
        or k[0] in (_PLAIN, _INT_KEY, _BFLOAT16)
        or _item_index(k) is not None
    ):
        raise ValueError(
            f"af.save: keys must be ints or non-empty strings without {_SEP!r} "
            f"that do not start with {_PLAIN!r}, {_INT_KEY!r} or {_BFLOAT16!r} "
            f"and are not written like a list's item ('[0]', '(0)'); got {k!r} at "
            f"{prefix or 'the top'!r}"
        )
    return k


def _item_index(part: str):
    """``('[', 3)`` for ``'[3]'`` (an item of a list), ``('(', 3)`` for ``'(3)'`` (of a
    tuple); None for any other key."""
    if len(part) > 2 and (part[0], part[-1]) in (("[", "]"), ("(", ")")) and part[1:-1].isdigit():
        return part[0], int(part[1:-1])
    return None


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
            raise ValueError(
                f"af.save: {prefix!r} is on the {obj.device} device, which has no data"
            )
        if obj.dtype is bfloat16:
            out[_BFLOAT16 + prefix] = bfloat16_bits(obj.detach().numpy())  # (exact)
        else:
            out[prefix] = obj.detach().numpy()
    elif isinstance(obj, (np.ndarray, np.generic)):
        out[prefix] = np.asarray(obj)
    elif _plain(obj):
        out[_PLAIN + prefix] = np.array(json.dumps(obj))  # comes back as it was (a tuple
    elif isinstance(obj, (list, tuple)):  # as a list)
        # a list or tuple holding tensors, arrays or dicts (param_groups): item by item
        form = "[{}]" if isinstance(obj, list) else "({})"
        for i, x in enumerate(obj):
            _flatten(x, f"{prefix}{_SEP}{form.format(i)}", out)
    else:
        raise TypeError(
            f"af.save: {prefix or 'the object'!r} is a {type(obj).__name__}; a "
            f"saved state holds tensors, arrays, numbers, strings, None, and "
            f"lists, tuples and dicts of them"
        )


def save(obj: dict[Any, Any], path: str | os.PathLike[str]) -> None:
    """Writes ``obj`` (``model.state_dict()``, ``opt.state_dict()``, or a dict of them) to
    ``path`` as ``.npz``. Values may be tensors, arrays, numbers, strings, None, and lists,
    tuples and dicts of them; ``load`` gives back the same nesting (tensors as tensors, a
    tuple of tensors as a tuple; a list or tuple of plain values only comes back as a list).

    Example::

        af.save({"model": model.state_dict(), "history": [loss0, loss1]}, "ckpt.npz")
    """
    if not isinstance(obj, dict):
        raise TypeError(f"af.save: expected a dict (a state_dict), got {type(obj).__name__}")
    arrays: dict = {}
    _flatten(obj, "", arrays)
    path = os.fspath(path)
    with open(path, "wb") as f:  # (np.savez would append .npz to a bare name)
        np.savez(f, **arrays)


def _part(p: str):
    return int(p[1:]) if p.startswith(_INT_KEY) else p


def load(path: str | os.PathLike[str]) -> dict[Any, Any]:
    """Reads what ``save`` wrote: tensors, plain values, lists, tuples and dicts, in the
    same nesting."""
    out: dict = {}
    with np.load(os.fspath(path), allow_pickle=False) as data:
        for key in data.files:
            a = data[key]
            if key.startswith(_PLAIN):
                key, value = key[1:], json.loads(str(a))
            elif key.startswith(_BFLOAT16):
                key, value = key[1:], tensor(bfloat16_values(a), dtype=bfloat16)
            else:
                value = tensor(a)
            d = out
            parts = key.split(_SEP)
            for p in parts[:-1]:
                d = d.setdefault(_part(p), {})
            d[_part(parts[-1])] = value
    return _lists(out)


def _lists(d):
    """Dicts whose keys are all ``[i]`` back into lists, and all ``(i)`` into tuples."""
    if not isinstance(d, dict):
        return d
    d = {k: _lists(v) for k, v in d.items()}
    items = [_item_index(k) if isinstance(k, str) else None for k in d]
    if items and all(items):
        kind = {b for b, _ in items}
        if len(kind) == 1 and sorted(i for _, i in items) == list(range(len(items))):
            by_index = {i: v for (_, i), v in zip(items, d.values(), strict=True)}
            values = [by_index[i] for i in range(len(items))]
            return values if kind == {"["} else tuple(values)
    return d
