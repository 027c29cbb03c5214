"""An engine's own error event inside a stream it answered with HTTP 200.

Real vLLM ends a stream it cannot finish (its engine core died: EngineDeadError) with
`data: {"error": {"message", "type", "param", "code"}}` and `data: [DONE]`, then turns
/health 503 and exits. The gateway relays those bytes as they are (they are already
OpenAI-shaped), and reads the event so the request counts as failed (status, replica
failure, billing) rather than as a clean 200.
"""

from __future__ import annotations

import orjson

# An event's start: inside a JSON payload a quote is escaped, so this never matches text.
_MARK = b'data: {"error"'
_MAX_EVENT = 64 * 1024  # an error event longer than this is read as a 500 without parsing


class InbandError:
    """Feed it the relayed chunks; `status` is the first error event's code once seen."""

    __slots__ = ("_event", "_tail", "message", "status")

    def __init__(self) -> None:
        self._tail = b""  # the end of the last chunk: a mark may straddle two chunks
        self._event: bytearray | None = None
        self.status: int | None = None
        self.message = ""

    @property
    def seen(self) -> bool:
        return self._event is not None

    def feed(self, chunk: bytes) -> bool:
        """Whether an error event starts in this chunk (the first one only)."""
        if self.status is not None:
            return False
        if self._event is not None:
            self._event += chunk
            self._ends()
            return False
        data = self._tail + chunk
        at = data.find(_MARK)
        if at < 0:
            self._tail = data[-(len(_MARK) - 1) :]
            return False
        self._event = bytearray(data[at + len(b"data: ") :])
        self._ends()
        return True

    def _ends(self) -> None:
        event = self._event
        assert event is not None
        end = event.find(b"\n\n")
        if end < 0 and len(event) < _MAX_EVENT:
            return
        self._parse(bytes(event[:end] if end >= 0 else event))

    def finish(self) -> None:
        """The stream ended: an error event cut before its blank line still counts."""
        if self._event is not None and self.status is None:
            self._parse(bytes(self._event))

    def _parse(self, payload: bytes) -> None:
        status, message = 500, "the engine ended the stream with an error event"
        try:
            error = orjson.loads(payload).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            error = None
        if isinstance(error, dict):
            code = error.get("code")
            if type(code) is int and 400 <= code <= 599:
                status = code
            if isinstance(error.get("message"), str):
                message = error["message"]
        self.status, self.message = status, message
