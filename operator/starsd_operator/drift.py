"""Whether a child as it exists still holds what the operator applies: the fields of the desired object
(the ones the operator's server-side apply owns) compared one by one with the live object.

Fields that only the live object has (defaults the API server filled in, a controller's status, labels or
annotations someone else added, an ``HPA``'s or a user's field the operator does not set) are not compared:
they are not the operator's. Lists of objects are matched by their merge key (``name``, else a port number),
as server-side apply merges them, so an entry someone else added does not count either; lists of plain
values (a command, its arguments) must be equal. :func:`differences` is pure; the controller re-applies a
child that has any (docs/architecture.md, "Level-triggered").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Merge keys of the lists of objects the children hold, in the order tried (the API's patchMergeKey).
MERGE_KEYS = ("name", "containerPort", "port", "key", "ip")


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """The paths (``spec.template.spec.containers[target].image``) where ``live`` does not hold ``desired``."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [] if _empty(desired) and live is None else [path or "."]
        out: list[str] = []
        for key, want in desired.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in live:
                if not _empty(want):
                    out.append(where)
                continue
            out += differences(want, live[key], where)
        return out
    if isinstance(desired, list):
        if not isinstance(live, list):
            return [] if not desired and live is None else [path]
        if desired and all(isinstance(x, Mapping) for x in desired):
            return _object_list(desired, live, path)
        return [] if desired == live else [path]
    return [] if _same_scalar(desired, live) else [path]


def _object_list(desired: Sequence[Mapping[str, Any]], live: Sequence[Any], path: str) -> list[str]:
    key = next((k for k in MERGE_KEYS if all(k in x for x in desired)), None)
    if key is None:  # an atomic list: same length, each entry in place
        if len(desired) != len(live):
            return [path]
        return [d for i, want in enumerate(desired) for d in differences(want, live[i], f"{path}[{i}]")]
    by_key = {x.get(key): x for x in live if isinstance(x, Mapping)}
    out: list[str] = []
    for want in desired:
        where = f"{path}[{want[key]}]"
        if want[key] not in by_key:
            out.append(where)
            continue
        out += differences(want, by_key[want[key]], where)
    return out


def _empty(value: Any) -> bool:
    """The API server drops empty maps and lists, and zero values of optional fields (``omitempty``:
    ``minReadySeconds: 0``): asking for one is asking for nothing."""
    return value is None or (isinstance(value, Mapping | list | str | int | float) and not value)


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have and type(want) is type(have):
        return True
    # A number the API server gives back as the other kind (an int-or-string field, 1 vs "1", 1 vs 1.0).
    if isinstance(want, bool) or isinstance(have, bool):
        return False
    if isinstance(want, int | float | str) and isinstance(have, int | float | str):
        number = _as_number(want)
        return str(want) == str(have) or (number is not None and number == _as_number(have))
    return False


def _as_number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
