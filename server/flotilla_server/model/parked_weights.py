"""Park a loaded model's weights where they cost the memory budget nothing that matters, and bring them back.

Why: a pool server evicts a model to make room, and loading it again from its source pays for reading,
dequantizing and repacking every weight (docs/architecture.md, "Model cache", "Parked models"). A parked model
keeps its weights in the form the runtime uses, outside the budget:
- on CPU, in a file written once (the parked file) and memory-mapped: clean page-cache pages the kernel may
  drop under pressure and read again on use, never anonymous memory;
- on a GPU, in pinned host memory: the GPU's memory goes back to the budget, a reload is one copy per tensor.

Rules:
- every tensor the model registers (parameters and buffers, views and tied weights included) is moved with
  `Tensor.set_`, so each Python object that holds it (a module's cached `_direct` product, a tied head) sees
  the new storage; one storage is written once however many tensors view it;
- tensors smaller than SMALL_TENSOR_BYTES (norms, biases) stay as they are: a page each would cost more;
- oneDNN's packed copies (model/linear.py PackedWeight) are dropped: they are anonymous memory, and they are
  keyed by storage, so the next step packs them again from the parked weights;
- a CPU model stays mapped once it serves again (llama.cpp's default): its pages are still the file's.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

SMALL_TENSOR_BYTES = 64 * 1024
ALIGN_BYTES = 64  # every storage starts on a cache line of the file (and so on an element boundary)


@dataclass(frozen=True)
class ParkedWeights:
    """Where a model's weights went: `path` (the parked file, CPU) or pinned host memory (GPU)."""

    bytes: int  # the weights moved: the parked file's size, or the pinned host bytes
    path: str | None  # None: pinned host memory


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    for module in model.modules():
        yield from (p for p in module._parameters.values() if p is not None)
        yield from (b for b in module._buffers.values() if b is not None)


def _movable(t: torch.Tensor) -> bool:
    storage = t.untyped_storage()
    return t.layout == torch.strided and storage.nbytes() >= SMALL_TENSOR_BYTES and storage.device.type != "meta"


def _by_storage(model: nn.Module, device_type: str) -> dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]]:
    """Storage address -> (the storage, every registered tensor viewing it), for the large tensors on device."""
    groups: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
    seen: set[int] = set()
    for t in _tensors(model):
        if id(t) in seen or t.device.type != device_type or not _movable(t):
            continue
        seen.add(id(t))
        storage = t.untyped_storage()
        groups.setdefault(storage.data_ptr(), (storage, []))[1].append(t)
    return groups


@torch.no_grad()
def _rebase(tensors: list[torch.Tensor], old: torch.UntypedStorage, new: torch.UntypedStorage,
            new_offset_bytes: int) -> None:
    """Point each tensor at `new`, at the same byte offset its view had in `old`."""
    for t in tensors:
        offset_bytes = t.storage_offset() * t.element_size()
        assert (new_offset_bytes + offset_bytes) % t.element_size() == 0, "parked file misaligned"
        t.set_(new, (new_offset_bytes + offset_bytes) // t.element_size(), t.size(), t.stride())


def _drop_packed_copies(model: nn.Module) -> None:
    from .linear import PackedWeight

    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, PackedWeight):
                value.forget()


# this process's parked file and its mapping, once parked: parked again unchanged, the model is not rewritten
_mapped: tuple[str, torch.UntypedStorage] | None = None


def park_to_file(model: nn.Module, path: Path) -> ParkedWeights:
    """CPU: write the model's large tensors to `path` (created; its folder must exist) and map them from it.
    A model whose every large tensor is still mapped from its last parked file stays there (nothing written)."""
    global _mapped
    groups = _by_storage(model, "cpu")
    if _mapped is not None and all(key == _mapped[1].data_ptr() for key in groups) and \
            Path(_mapped[0]).is_file() and Path(_mapped[0]).stat().st_size == _mapped[1].nbytes():
        _drop_packed_copies(model)
        return ParkedWeights(_mapped[1].nbytes(), _mapped[0])
    offsets: dict[int, int] = {}
    at = 0
    with path.open("wb") as f:
        for key, (storage, _) in groups.items():
            at = -(-at // ALIGN_BYTES) * ALIGN_BYTES
            f.seek(at)
            offsets[key] = at
            f.write(memoryview(torch.tensor([], dtype=torch.uint8).set_(storage).numpy()))  # the bytes, no copy
            at += storage.nbytes()
        f.truncate(at)
    if not groups:
        return ParkedWeights(0, str(path))
    mapped = _map_read_only(path, at)
    for key, (storage, tensors) in groups.items():
        _rebase(tensors, storage, mapped, offsets[key])
    _mapped = (str(path), mapped)
    _drop_packed_copies(model)
    release_freed_heap()
    return ParkedWeights(at, str(path))


def _map_read_only(path: Path, nbytes: int) -> torch.UntypedStorage:
    """The file as a read-only shared mapping: its pages stay the page cache's (a writable private mapping's
    were seen counted as Private_Dirty once the engine ran on them), and a stray write faults loudly instead
    of copying the weights into anonymous memory unseen."""
    with path.open("rb") as f:
        mapping = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable": as intended
        return torch.frombuffer(mapping, dtype=torch.uint8).untyped_storage()  # keeps `mapping` alive


def park_to_host(model: nn.Module) -> ParkedWeights:
    """GPU: copy the model's large device tensors to pinned host memory and free their device memory."""
    moved = 0
    for storage, tensors in _by_storage(model, "cuda").values():
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True)
        host.copy_(torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage))
        _rebase(tensors, storage, host.untyped_storage(), 0)
        moved += storage.nbytes()
    torch.cuda.empty_cache()
    return ParkedWeights(moved, None)


def unpark_from_host(model: nn.Module, device: str) -> None:
    """GPU: copy the pinned host tensors back to `device` (the inverse of park_to_host)."""
    for storage, tensors in _by_storage(model, "cpu").values():
        if not storage.is_pinned():
            continue
        dev = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
        dev.copy_(torch.tensor([], dtype=torch.uint8).set_(storage), non_blocking=True)
        _rebase(tensors, storage, dev.untyped_storage(), 0)
    torch.cuda.synchronize(device)


def release_freed_heap() -> None:
    """Give the allocator's freed pages back to the kernel (glibc keeps them otherwise); no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def private_anonymous_bytes(pid: int | None = None) -> int:
    """Anonymous memory this process (or `pid`) alone holds, bytes; 0 if unknown: what a parked engine process
    holds beside its weights and would give back by exiting (its heap, the forkserver's pages it wrote to).
    Per mapping, the lesser of Private_Dirty and Anonymous: not the pages it still shares with the forkserver,
    nor the parked file's page cache (dirty until written back, yet file pages the kernel may drop)."""
    try:
        text = Path(f"/proc/{pid or os.getpid()}/smaps").read_text()
    except OSError:
        return 0
    total, fields = 0, {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("Private_Dirty", "Anonymous"):
            fields[key] = int(value.split()[0])
            if len(fields) == 2:
                total += min(fields.values())
                fields = {}
    return total * 1024
