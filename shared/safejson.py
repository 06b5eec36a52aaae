"""JSON from untrusted bytes, its shape bounded before any parser sees it.

Python's JSON parser recurses once per level of nesting. Under the default recursion
limit a deep body raises RecursionError (a 500 unless caught); under a raised limit
(importing web3 sets 100000) it overflows the C stack and kills the process. And
every array or object costs the parser (and the garbage collector after it) far more
than text does: 256 KiB of `[[],[],...]` took 40 times the CPU of 256 KiB of string.
So the brackets outside strings are counted on the raw bytes first, without
recursion, and a body nested deeper than `MAX_DEPTH` or holding more than
`MAX_CONTAINERS` arrays and objects is never parsed.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Deepest nesting a request body may have (arrays and objects; the top level is 1).
#: Our deepest valid body nests 2 levels.
MAX_DEPTH = 32
#: Most arrays and objects a request body may hold. Ours hold at most a handful.
MAX_CONTAINERS = 1000

#: A JSON string literal (escapes included): brackets inside it are text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but the four brackets (deleted before counting).
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")


class TooComplex(ValueError):
    """The document nests too deep or holds too many arrays and objects to be parsed."""


def problem(
    data: bytes, max_depth: int = MAX_DEPTH, max_containers: int = MAX_CONTAINERS
) -> str | None:
    """Why the JSON text in `data` must not be parsed, or None.

    Linear in the size of `data` and free of recursion. Bracket kinds are not matched:
    a parser refuses mismatched ones, having recursed at most as deep as counted here.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return None  # the common case: too few brackets to matter
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    opened = brackets.count(b"[") + brackets.count(b"{")
    if opened > max_containers or len(brackets) > 2 * max_containers:
        if re.search(rb"[\[{]{%d}" % (max_depth + 1), brackets):
            return f"nests deeper than {max_depth} levels"
        return f"holds more than {max_containers} arrays and objects"
    depth = 0
    for byte in brackets:  # at most 2 * max_containers of them
        depth += 1 if byte in _OPENERS else -1
        if depth > max_depth:
            return f"nests deeper than {max_depth} levels"
    return None


def loads(data: bytes | str) -> Any:
    """`json.loads`, raising TooComplex for a document `problem` refuses.

    Other malformed JSON raises `json.JSONDecodeError` (or ValueError) as usual.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    reason = problem(raw)
    if reason is not None:
        raise TooComplex(reason)
    try:
        return json.loads(data)
    except RecursionError:
        # Only reachable with less than MAX_DEPTH levels of stack left.
        raise TooComplex(f"nests deeper than {MAX_DEPTH} levels") from None
