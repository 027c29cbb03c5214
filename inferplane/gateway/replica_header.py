"""`x-inferplane-replica`: the replica that answered, by name (`Backend.label`: chat-0, a
discovered pod, chat-endpoint-0; never its URL), for whom it is meant.

It tells clients how the fleet is laid out, so it is off for API clients by default
(`gateway.expose_replica_header: true` sends it on every response). The console's
playground still shows it: its page carries `token`, a random value of this gateway process
that only someone who can open the console sees, and its requests send it back in
`x-inferplane-replica-token`.
"""

from __future__ import annotations

import hmac
import secrets

HEADER = b"x-inferplane-replica"
TOKEN_HEADER = b"x-inferplane-replica-token"


class ReplicaHeader:
    def __init__(self, always: bool) -> None:
        self.always = always
        self.token = secrets.token_urlsafe(24)
        self._token = self.token.encode()

    def granted(self, value: bytes) -> bool:
        """Whether a request's `x-inferplane-replica-token` value is this gateway's."""
        return hmac.compare_digest(value, self._token)
