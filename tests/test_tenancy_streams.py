"""The usage event the gateway asks for is removed from the client's stream, however the
bytes are split, and its usage is kept for the ledger."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from inferplane.tenancy.streams import UsageStripper, ask_for_usage

EVENTS = [
    b'data: {"id":"1","choices":[{"index":0,"delta":{"content":"a \\"usage\\""}}]}\n\n',
    b'data: {"id":"1","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
STREAM = b"".join(EVENTS)
EXPECTED = EVENTS[0] + EVENTS[1] + EVENTS[3]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_strips_exactly_the_usage_event(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    s = UsageStripper()
    out = b"".join(s.feed(p) for p in pieces if p) + s.flush()
    assert out == EXPECTED
    assert orjson.loads(s.usage[6:])["usage"] == {"prompt_tokens": 7, "completion_tokens": 2}


def _reference(stream: bytes) -> tuple[bytes, bytes]:
    """The stream without its usage-only events, event by event (and the last one dropped)."""
    out, usage = [], b""
    body, _, rest = stream.rpartition(b"\n\n")
    for event in body.split(b"\n\n") if body else []:
        payload = orjson.loads(event[6:]) if event.startswith(b"data: {") else None
        if (
            isinstance(payload, dict)
            and payload.get("choices") == []
            and isinstance(payload.get("usage"), dict)
        ):
            usage = event
        else:
            out.append(event + b"\n\n")
    return b"".join(out) + rest, usage


@given(
    st.lists(st.sampled_from([*EVENTS, b'data: {"usage":"no","choices":[1]}\n\n']), max_size=8),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_the_usage_scan_matches_an_event_by_event_reference(
    events: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(events)
    points = sorted({c for c in cuts if c < len(stream)})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    s = UsageStripper()
    out = b"".join(s.feed(p) for p in pieces if p) + s.flush()
    assert (out, s.usage) == _reference(stream)


def test_ask_for_usage() -> None:
    data: dict[str, object] = {"stream": True}
    assert ask_for_usage(data) and data["stream_options"] == {"include_usage": True}
    data = {"stream_options": {"include_usage": True}}
    assert not ask_for_usage(data)
    data = {"stream_options": {"continuous_usage_stats": False}}
    assert ask_for_usage(data)
    assert data["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
