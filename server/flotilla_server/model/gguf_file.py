"""GGUFFile: the metadata and tensor index of a `.gguf` file, read in well under a second; GGUFModel, the
view of it that the loader and the tokenizer builder both read (here, so neither imports the other).

The `gguf` package's own GGUFReader builds a numpy view for every element of every array; for a
tokenizer of 49,152 tokens and as many merges that takes 7 s or more, on every server start. This
reader follows the same file format (llama.cpp's gguf.md: a header, typed key-value pairs, tensor
infos, aligned tensor data) but decodes the arrays in one pass with `struct`, and leaves each
tensor's bytes mapped from the file, in the byte shape `gguf.quants.dequantize` expects.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value type -> struct format of one scalar (8 = string, 9 = array are handled apart)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int  # a GGMLQuantizationType value, or an id this gguf package does not know
    shape: tuple[int, ...]  # numpy order: (rows..., columns); GGUF stores it reversed
    data: np.ndarray  # uint8, (rows..., bytes per row), mapped from the file

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"unknown type id {self.type_id}"


class GGUFFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._map[:4] != MAGIC:
            raise GGUFFormatError(f"{path} is not a GGUF file (no GGUF magic): pass a .gguf file or a model directory")
        self._pos = 4
        version, num_tensors, num_fields = self._unpack("<IQQ")
        if version not in (2, 3):
            raise GGUFFormatError(f"{path} is GGUF version {version}: Flotilla reads versions 2 and 3 (little-endian)")
        self.fields: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            (value_type,) = self._unpack("<I")
            self.fields[key] = self._value(value_type)
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            type_id, offset = self._unpack("<IQ")
            infos.append((name, dims, type_id, offset))
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(name, dims, type_id, start + offset) for name, dims, type_id, offset in infos]

    def _tensor(self, name: str, dims: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
        shape = tuple(reversed(dims))
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        except (ValueError, KeyError):  # an unknown type: the loader refuses it by name before reading data
            return TensorInfo(name, type_id, shape, np.empty(0, np.uint8))
        if not shape or shape[-1] % block:
            raise GGUFFormatError(f"{self.path}: tensor {name} has {shape[-1] if shape else 0} columns, not a multiple "
                                  f"of its type's {block}-weight blocks: the file is damaged; download it again")
        row_bytes = shape[-1] // block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        end = offset + rows * row_bytes
        if end > len(self._map):  # checked before any kernel or dequantizer reads past the file's end
            raise GGUFFormatError(f"{self.path}: tensor {name} ends at byte {end}, but the file has {len(self._map)}: "
                                  "the file is cut short; download it again")
        data = np.frombuffer(self._map, np.uint8, rows * row_bytes, offset).reshape(*shape[:-1], row_bytes)
        return TensorInfo(name, type_id, shape, data)

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        text = self._map[self._pos:self._pos + n].decode("utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            item_type, count = self._unpack("<IQ")
            if item_type in _SCALAR:
                return list(self._unpack(f"<{count}{_SCALAR[item_type]}"))
            return [self._value(item_type) for _ in range(count)]
        if value_type not in _SCALAR:
            raise GGUFFormatError(f"{self.path}: unknown GGUF value type {value_type} at byte {self._pos}")
        return self._unpack(f"<{_SCALAR[value_type]}")[0]


class GGUFModel:
    """The parts of one GGUF file the runtime needs, read without loading the tensor data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        self.tensors = self.file.tensors
        self.architecture = str(self.field("general.architecture"))

    def field(self, key: str, default: Any = None) -> Any:
        return self.file.fields.get(key, default)

    def arch_field(self, key: str, default: Any = None) -> Any:
        return self.field(f"{self.architecture}.{key}", default)
