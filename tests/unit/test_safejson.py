"""JSON nesting measured before parsing (shared/safejson.py): exact, linear, no recursion."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import safejson


def reference_depth(data: bytes) -> int:
    """The deepest point of the brackets outside strings, the slow obvious way.

    A string is a quote, then anything with backslash escapes, then a closing quote; a
    quote that is never closed is not a string (the parser refuses the text anyway).
    """
    text, kept, i = data.decode("latin-1"), [], 0
    while i < len(text):
        if text[i] == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j < len(text):
                i = j + 1
                continue
        kept.append(text[i])
        i += 1
    depth = highest = 0
    for char in kept:
        if char in "[{":
            depth += 1
            highest = max(highest, depth)
        elif char in "]}":
            depth -= 1
    return highest


def test_the_caps_are_inclusive() -> None:
    depth, most = safejson.MAX_DEPTH, safejson.MAX_CONTAINERS
    assert safejson.loads(b"[" * depth + b"]" * depth) is not None
    with pytest.raises(safejson.TooComplex, match=f"deeper than {depth} levels"):
        safejson.loads(b"[" * (depth + 1) + b"]" * (depth + 1))
    with pytest.raises(safejson.TooComplex, match=f"deeper than {depth} levels"):
        safejson.loads('{"a":' * (depth + 1) + "1" + "}" * (depth + 1))
    assert len(safejson.loads(b"[" + b"[]," * (most - 2) + b"[]]")) == most - 1
    with pytest.raises(safejson.TooComplex, match=f"more than {most} arrays and objects"):
        safejson.loads(b"[" + b"[]," * (most - 1) + b"[]]")


def test_brackets_in_strings_are_text() -> None:
    text = json.dumps({"a": "[" * 1000, "b": '\\"[{' * 500, "c": ["]" * 50]})
    assert safejson.loads(text)["a"] == "[" * 1000
    assert safejson.problem(text.encode()) is None


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 100_000, "deeper"),  # never closed
        (b"[" * 100_000 + b"]" * 100_000, "deeper"),
        (b"[" * 100_000 + b"}" * 100_000, "deeper"),  # mismatched: a parser recurses first
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "deeper"),
        (b'["x", ' * 40 + b"1" + b"]" * 40, "deeper"),
        ((b"[]" * 20 + b"[") * 40, "deeper"),  # climbs slowly, one level per 41 brackets
        (b"[" + b"[]," * 100_000 + b"[]]", "more than"),  # flat, but costly to build
        (b"[" + b",".join([b"[" * 31 + b"]" * 31] * 2000) + b"]", "more than"),
    ],
)
def test_deep_or_crowded_bodies_are_refused_without_recursing(body: bytes, why: str) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # as web3 leaves it: a recursive parser would crash
    try:
        with pytest.raises(safejson.TooComplex, match=why):
            safejson.loads(body)
    finally:
        sys.setrecursionlimit(limit)


def test_malformed_json_is_still_a_decode_error() -> None:
    # (100,000 closers alone: the parser stops at the first, without recursing)
    for text in (b"{bad", b"[1,]", b"[" * 5 + b"}" * 5, b'"open', b"]" * 100_000):
        with pytest.raises(ValueError) as caught:
            safejson.loads(text)
        assert not isinstance(caught.value, safejson.TooComplex)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"1", b","]), max_size=300),
    st.integers(min_value=0, max_value=40),
)
def test_the_depth_count_agrees_with_the_obvious_one(parts: list[bytes], limit: int) -> None:
    data = b"".join(parts)
    reason = safejson.problem(data, max_depth=limit, max_containers=10**6)
    assert (reason is not None) == (reference_depth(data) > limit)
