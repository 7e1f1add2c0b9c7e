"""Reading a file a person gave (a config, a schedule): one error naming the
file and what is wrong with it, never a traceback or an unnamed decode error."""

from __future__ import annotations

import os
from pathlib import Path


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of `path`; ValueError "PATH: why" when it cannot be read
    (missing, a directory, no permission) or is not UTF-8."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
