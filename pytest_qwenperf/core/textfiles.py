"""Reading the text files users hand us (suites, baselines, endpoint sets), one message per failure.

A binary file, a file saved in another encoding or a path that is a folder must give one
line that names the file, what is wrong with it and what was expected, not a
``UnicodeDecodeError`` from deep inside the standard library.
"""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path, what: str, expected: str, error: type[ValueError]) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark is dropped: Windows editors write one).

    Raises ``error`` when the file cannot be read ("cannot read the {what}: ...") or is not
    UTF-8 text ("...; expected {expected}").
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); expected {expected}") from None
