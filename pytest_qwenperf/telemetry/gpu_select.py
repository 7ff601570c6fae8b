"""Which GPUs a run's servers see: NVML indices from each replica's ``CUDA_VISIBLE_DEVICES``."""

from __future__ import annotations

from collections.abc import Sequence


def select_devices(
    visible: Sequence[str | None], uuids: Sequence[str | None]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """NVML indices of the GPUs some replica sees, and the entries that name no GPU here.

    ``visible`` holds each replica's ``CUDA_VISIBLE_DEVICES`` (None: unset, every GPU);
    ``uuids`` are the UUIDs of NVML devices 0..n-1 (None: unreadable, cannot be sampled).
    Entries are indices or (prefixes of)
    ``GPU-…`` UUIDs. As CUDA does, an entry that names no device ends its list (``-1``
    is the usual way of hiding every GPU and is not reported). Indices are taken in NVML
    (PCI bus) order, which matches CUDA's only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or
    identical GPUs; UUIDs are unambiguous.
    """
    chosen: list[int] = []
    unresolved: list[str] = []
    for value in visible:
        if value is None:
            chosen.extend(i for i, uuid in enumerate(uuids) if uuid is not None)
            continue
        for token in (t.strip() for t in value.split(",")):
            index = _device_index(token, uuids)
            if index is None:
                if token and not token.startswith("-"):
                    unresolved.append(token)
                break
            chosen.append(index)
    return tuple(dict.fromkeys(chosen)), tuple(unresolved)


def _device_index(token: str, uuids: Sequence[str | None]) -> int | None:
    if token.isdigit():
        index = int(token)
        return index if index < len(uuids) and uuids[index] is not None else None
    if token.startswith("GPU-"):
        matches = [i for i, uuid in enumerate(uuids) if uuid is not None and uuid.startswith(token)]
        return matches[0] if len(matches) == 1 else None
    return None  # MIG instances and anything else: not sampled per device here
