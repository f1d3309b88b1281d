"""Start-up errors as users see them: one line, exit status 2, naming the flag or the environment variable
the bad value came from, and never a traceback for a value a user can type (docs/serving.md, "Flags").

The settings, the engine and the loader phrase their errors with field names (`block_size must be …`) or
flag names (`--port must be …`): they do not know where a value came from. This module alone does, so it
rewrites those names into what the user typed: `--block-size` for a flag, `FLOTILLA_BLOCK_SIZE` for the
environment.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Mapping, Sequence

from flotilla_contract.flags import SERVER_FLAGS


def given_on_command_line(argv: Sequence[str] | None) -> set[str]:
    """The settings fields whose value the command line gave (abbreviations and --flag=value included)."""
    probe = argparse.ArgumentParser(add_help=False)
    for flag in SERVER_FLAGS:
        probe.add_argument(flag.flag, dest=flag.dest, default=argparse.SUPPRESS)
    known, _ = probe.parse_known_args(argv)
    return set(vars(known))


def name_sources(message: str, from_command_line: set[str], environ: Mapping[str, str]) -> str:
    """`message` with each field or flag name replaced by where its value came from: the flag, or the
    FLOTILLA_* variable when the environment set it and the command line did not."""
    for flag in SERVER_FLAGS:
        from_env = flag.dest not in from_command_line and flag.env in environ
        source = flag.env if from_env else flag.flag
        # a field name is replaced where it cannot be an ordinary word: with an underscore, or leading the message
        if "_" in flag.dest:
            message = re.sub(rf"(?<![\w-]){flag.dest}(?!\w)", source, message)
        elif message.startswith(f"{flag.dest} "):
            message = source + message[len(flag.dest):]
        message = re.sub(rf"(?<![\w-]){re.escape(flag.flag)}(?![\w-])", source, message)
    return message


def check_listen(host: str, port: int) -> None:
    """Raises ValueError, naming --host or --port, if the server could not listen there; before the model
    loads, so a typo costs a second rather than a model load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"host {host!r} is not an address this machine can listen on ({error}); "
                         "pass an IP address such as 0.0.0.0 or 127.0.0.1") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            raise ValueError(f"port {port} on {host} cannot be listened on ({error.strerror}); pick another "
                             "port, or stop what holds it") from None


def check_device(device: str) -> None:
    """Raises ValueError, saying what to install or pass, if torch cannot use `device`."""
    if not device.startswith("cuda"):
        return
    import torch  # only here: the flags are valid by now, and the engine is about to import it anyway

    if not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} is not available: this torch ({torch.__version__}) sees no CUDA GPU; "
            "install a CUDA build of torch (docs/serving.md, \"GPU\") or pass --device cpu"
        )
    suffix = device.removeprefix("cuda").removeprefix(":")
    if not suffix.isdigit() and suffix:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    index = int(suffix or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} is not available: this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s); pass --device cuda:0 .. cuda:N-1")
