"""load_model: a Hugging Face model directory, a `.gguf` file or the embedded `tiny` to a ready DecoderModel.

A directory holds `config.json`, `*.safetensors` (one file or shards listed in
`model.safetensors.index.json`) and `tokenizer.json` (+ `tokenizer_config.json`). Weights stream
shard by shard into a model built without initialisation, converted to the requested dtype.
A `.gguf` file goes to gguf_loader, which dequantizes it into the same model. With `quantization="int8"`
any of them is loaded as with `none`, then every projection, the embedding and the head are quantized to
per-channel int8 (DecoderModel.to_int8), after source.check_int8 has refused a device or layer shape the
int8 kernels cannot take, before any weight is read. `quantization="fp8"` (a GPU of compute capability 8.9
or later) does the same for the projections only, to e4m3 (DecoderModel.to_fp8, model/fp8_weights.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from flotilla_contract.flags import DTYPES
from safetensors import safe_open

from .config import ModelConfig
from .fp8_weights import fp8_probe
from .gguf_loader import is_gguf, load_gguf
from .llama import DecoderModel
from .source import (
    FP8_DEVICES,
    check_fp8,
    check_int8,
    hf_config,
    neither_message,
    resolve_quantization,
    source_config,
)
from .tiny import TINY_CONFIG, TINY_DESCRIPTION, TINY_NAME, build_tiny_model, build_tiny_tokenizer
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}  # the names are the contract's


@dataclass(frozen=True)
class LoadedModel:
    model: DecoderModel
    tokenizer: Tokenizer
    config: ModelConfig
    name: str  # the served name: "tiny", the directory's name or the GGUF file's (less its quantization)
    description: str = ""  # says "DEMONSTRATION model" for tiny
    is_demonstration: bool = False


def torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return TORCH_DTYPES[dtype]


def load_model(model: str, dtype: str = "float32", device: str = "cpu", quantization: str | None = None) -> LoadedModel:
    """`model` is "tiny", a path to a Hugging Face directory or to a `.gguf` file; `quantization` one of
    flags.QUANTIZATIONS, None for the source's default (source.resolve_quantization). Raises
    FileNotFoundError or ValueError with what to change."""
    torch_type = torch_dtype(dtype)
    quantization = resolve_quantization(model, quantization)
    if model == TINY_NAME:
        _check_requantization(quantization, TINY_CONFIG, device)
        log.warning("%s", TINY_DESCRIPTION)
        net = build_tiny_model(torch_type, device)
        _requantize(net, quantization)
        return LoadedModel(net, build_tiny_tokenizer(), TINY_CONFIG, TINY_NAME, TINY_DESCRIPTION,
                           is_demonstration=True)
    path = Path(model)
    if is_gguf(model):
        if quantization in ("int8", "fp8"):  # before any weight is read
            _check_requantization(quantization, source_config(model), device)
        net, tokenizer, config, name = load_gguf(path, torch_type, device, quantization)
        _requantize(net, quantization)
        held = net.quantization()
        log.info("loaded %s (GGUF %s, %d layers) as %s on %s, weights held as %s: %.1f MiB", path, config.model_type,
                 config.num_layers, dtype, device, held, net.weight_bytes() / 2**20)
        how = {"none": "dequantized", "int8": "quantized to int8 per channel",
               "fp8": "projections quantized to fp8 e4m3 per channel"}.get(
            held, f"blocks kept ({held.removeprefix('gguf:')})")
        return LoadedModel(net, tokenizer, config, name, f"{config.model_type} model from {path.name}, {how}")
    if not path.is_dir():
        raise FileNotFoundError(neither_message(model))
    config = hf_config(path)
    _check_requantization(quantization, config, device)
    tokenizer = Tokenizer.from_dir(path, extra_eos_token_ids=config.eos_token_ids)

    with torch.device("meta"):
        net = DecoderModel(config).to(torch_type)  # dtype on meta first: memory is taken once, in the final dtype
    net = net.to_empty(device=device)
    net.load_hf_state_dict(_read_tensors(path))
    _requantize(net, quantization)
    log.info("loaded %s (%s, %d layers) as %s on %s, weights held as %s: %.1f MiB", path, config.model_type,
             config.num_layers, dtype, device, net.quantization(), net.weight_bytes() / 2**20)
    return LoadedModel(net.eval(), tokenizer, config, path.name, f"{config.model_type} model from {path}")


def _check_requantization(quantization: str, config: ModelConfig, device: str) -> None:
    """ValueError, before any weight is read, where `int8` or `fp8` cannot serve this model on this device."""
    if quantization == "int8":
        check_int8(config, device)
    elif quantization == "fp8":
        check_fp8(config, device)
        major, minor = torch.cuda.get_device_capability(device)
        refusal = (f"quantization fp8 needs a GPU with fp8 tensor cores ({FP8_DEVICES}); "
                   f"{torch.cuda.get_device_name(device)} on {device} is {major}.{minor}")
        if (major, minor) < (8, 9):
            raise ValueError(f"{refusal}: pass --quantization none")
        try:  # one small product: the GPU, the driver and this torch build must all take row-wise fp8 scales
            fp8_probe(device)
        except RuntimeError as e:
            raise ValueError(f"{refusal}, and its fp8 product failed ({str(e).splitlines()[0]}): pass "
                             "--quantization none") from None


def _requantize(net: DecoderModel, quantization: str) -> None:
    """The weights loaded in --dtype, requantized as `int8` or `fp8` asks (others are held as loaded)."""
    if quantization == "int8":
        net.to_int8()
    elif quantization == "fp8":
        net.to_fp8()


def _read_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) over all shards, each tensor loaded on CPU as stored."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        with index.open() as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [path / s for s in shards]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]  # beside it may lie other formats (Mistral's consolidated.*)
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}: Flotilla loads safetensors weights only")
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{file} is listed in {index.name} but missing: re-download the model")
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def load_model_with_weights(model: str, weights: Mapping[str, torch.Tensor], dtype: str = "float32",
                            device: str = "cpu") -> LoadedModel:
    """As `load_model`, with the decoder's weights already loaded (`load_model(...).model.state_dict()`, made
    by another process and shared with this one): only the config and tokenizer are read here, and the
    weights are used in place on CPU (assigned, never copied)."""
    if model == TINY_NAME:
        config, tokenizer, name, description = TINY_CONFIG, build_tiny_tokenizer(), TINY_NAME, TINY_DESCRIPTION
    else:
        path = Path(model)
        config = hf_config(path)
        tokenizer = Tokenizer.from_dir(path, extra_eos_token_ids=config.eos_token_ids)
        name, description = path.name, f"{config.model_type} model from {path}"
    with torch.device("meta"):
        net = DecoderModel(config)
    net.load_state_dict(weights, assign=True, strict=True)
    net = net.to(device=device, dtype=torch_dtype(dtype))
    return LoadedModel(net.eval(), tokenizer, config, name, description, is_demonstration=model == TINY_NAME)
