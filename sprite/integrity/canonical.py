"""Canonical JSON that carries the SHA-256 of its own content, so a change of any single byte is detected.

A record is written as its fields plus ``"self_sha256"``, the digest of the other fields' one-line canonical
bytes, in canonical form (sorted keys, ASCII only, fixed separators). Reading re-encodes what was parsed and
requires the very same bytes: a flipped byte either breaks the JSON, leaves a non-canonical encoding, or changes
the content, which then no longer matches the digest (and a changed digest no longer matches the content).
Stdlib only.
"""

from __future__ import annotations

import hashlib
import json

SELF = "self_sha256"


def dumps(obj, *, one_line: bool = False) -> bytes:
    """Canonical bytes of ``obj``: sorted keys, ASCII, no NaN; one line (no newline) or indented plus newline.

    Raises ValueError for NaN or infinity, TypeError for a value JSON cannot hold.
    """
    if one_line:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()


def digest(obj) -> str:
    """SHA-256 hex digest of ``obj``'s one-line canonical bytes."""
    return hashlib.sha256(dumps(obj, one_line=True)).hexdigest()


def sealed(record: dict, *, one_line: bool = False) -> bytes:
    """The bytes of ``record`` plus its own digest under ``self_sha256``. Raises ValueError if it has that key."""
    if SELF in record:
        raise ValueError(f"{SELF} is reserved")
    return dumps({**record, SELF: digest(record)}, one_line=one_line)


def unseal(data: bytes, *, one_line: bool = False) -> dict:
    """The record (without ``self_sha256``) from bytes that :func:`sealed` wrote.

    Raises:
        ValueError: the bytes are not JSON, not ASCII, not in canonical form, carry no digest, or the content
            does not match its digest; the message says which.
    """
    try:
        outer = json.loads(data.decode("ascii"))
    except RecursionError:
        raise ValueError("it is JSON nested too deep") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"it is not JSON ({err.__class__.__name__})") from None
    if not isinstance(outer, dict) or not isinstance(outer.get(SELF), str):
        raise ValueError(f"it is not a JSON object with {SELF}")
    record = {key: value for key, value in outer.items() if key != SELF}
    try:
        if outer[SELF] != digest(record):
            raise ValueError("its content does not match its own SHA-256")
        if dumps(outer, one_line=one_line) != data:
            raise ValueError("its bytes are not in the canonical form sprite writes")
    except RecursionError:  # parsed just under the limit, encoded just over it
        raise ValueError("it is JSON nested too deep") from None
    return record
