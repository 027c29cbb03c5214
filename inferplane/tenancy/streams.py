"""Counting the tokens of streams whose client did not ask for usage.

The gateway sets `stream_options.include_usage` on such requests so the engine reports the
stream's tokens in a final usage-only event (`"choices":[]`), and removes that event again
before it reaches the client, which then sees the stream it asked for.
"""

from __future__ import annotations

import orjson

_EVENT_END = b"\n\n"


def ask_for_usage(data: dict[str, object]) -> bool:
    """Turn on include_usage in a streaming request body; True when it was off (the usage
    event must then be stripped). A malformed stream_options is left to the engine."""
    opts = data.get("stream_options")
    if opts is None:
        data["stream_options"] = {"include_usage": True}
        return True
    if isinstance(opts, dict) and not opts.get("include_usage"):
        data["stream_options"] = {**opts, "include_usage": True}
        return True
    return False


class UsageStripper:
    """Feeds SSE bytes through, holding back an incomplete trailing event, and drops the
    usage-only event (remembered in `usage` for the ledger)."""

    __slots__ = ("pending", "usage")

    def __init__(self) -> None:
        self.pending = b""
        self.usage = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self.pending = data
            return b""
        if cut + 2 == len(data):  # (the usual case: no copy of a whole stream read)
            complete, self.pending = data, b""
        else:
            complete, self.pending = data[: cut + 2], data[cut + 2 :]
        at = complete.find(b'"usage"')
        if at < 0:
            return complete
        # Only the events that name "usage" are looked at: a stream read in one piece holds
        # every event, and splitting them all cost 16% of a streamed request's CPU.
        out = []
        kept_from = 0
        while at >= 0:
            start = complete.rfind(_EVENT_END, 0, at)
            start = 0 if start < 0 else start + 2
            end = complete.find(_EVENT_END, at)  # found: `complete` ends with an event end
            event = complete[start:end]
            if event.startswith(b"data: {") and _usage_only(event):
                self.usage = event
                out.append(complete[kept_from:start])
                kept_from = end + 2
            at = complete.find(b'"usage"', end)
        out.append(complete[kept_from:])
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


def _usage_only(event: bytes) -> bool:
    try:
        payload = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(payload, dict)
        and payload.get("choices") == []
        and isinstance(payload.get("usage"), dict)
    )
