"""Account: what a finished request did, written to metrics, the access log and tenancy.

Runs once per request, after the answer went out (also for a cancelled or refused one):
the per-model/replica series, token counters, one access-log line, and tenancy's
`record` (frees the key's limits, queues the usage ledger row).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from inferplane.gateway.accesslog import AccessLog
from inferplane.gateway.config import ModelRoute
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.gateway.record import Record

if TYPE_CHECKING:
    from inferplane.tenancy.service import Admission, Tenancy


class Accounting:
    def __init__(self, metrics: GatewayMetrics, access_log: AccessLog | None) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def served(
        self, route: ModelRoute, rec: Record, total: float, rid: bytes, name: str | None = None
    ) -> None:
        """A request that reached routing: its series, tokens and access-log line; `name`:
        what it is counted as (a LoRA adapter's name, else the model's)."""
        name = name or route.name
        backend = rec.backend
        replica = backend.label if backend is not None else "-"
        series = self.metrics.series(name, replica)
        series.count(rec.status)
        series.duration.observe(total)
        if rec.ttft:
            series.ttft.observe(rec.ttft)
        self.metrics.observe_queue_wait(name, rec.queue_wait)
        if rec.prompt_tokens or rec.completion_tokens:
            self.metrics.add_tokens(name, rec.prompt_tokens, rec.completion_tokens)
        if self.access_log is not None:
            self.access_log.served((
                rid, time.time() - total, name, replica,
                backend.address if backend is not None else "-", rec.status, rec.prompt_tokens,
                rec.completion_tokens, rec.admitted_s, rec.queue_wait, rec.ttft, total,
                rec.retries,
            ))  # fmt: skip

    def refused(
        self, rid: bytes, model: str, status: int, requested: str | None = None
    ) -> None:
        """A request refused before routing: counted under `model` (never the client's
        name: bounded labels); an unknown model's requested name goes to the log only."""
        self.metrics.series(model, "-").count(status)
        if self.access_log is not None:
            record: dict[str, Any] = {
                "request_id": rid.decode("latin-1"), "received_at": round(time.time(), 6),
                "model": model, "status": status,
            }  # fmt: skip
            if requested is not None:  # what an unknown-model request asked for (trace)
                record["requested_model"] = requested[:256]
            self.access_log.write(record)


def tenancy_done(
    tenancy: Tenancy | None,
    adm: Admission | None,
    est: int,
    rid: bytes,
    model: str,
    rec: Record,
    status: int,
    total: float,
    stream: bool,
) -> None:
    """Hand the finished request to tenancy: frees its limits, writes its usage row."""
    if adm is None or tenancy is None:
        return
    backend = rec.backend
    # A plain tuple in the ledger's column order (inferplane.tenancy.ledger.Usage):
    # ts, request_id, key_id, model, replica, prompt_tokens, completion_tokens, status,
    # stream, duration_s, ttft_s, queue_wait_s.
    tenancy.record(
        adm,
        (
            time.time(),
            rid.decode("latin-1"),
            adm.key_id,
            model,
            backend.label if backend is not None else "-",
            rec.prompt_tokens,
            rec.completion_tokens,
            status,
            stream,
            total,
            rec.ttft,
            rec.queue_wait,
        ),
        est,
    )
