"""LoRA adapters behind the gateway: which replica holds which adapter, affinity, and the
bounded load on demand.

A request whose `model` is an adapter (or one of its aliases) goes to a replica of the
adapter's base model. Replicas that already hold the adapter are preferred (the
`AdapterAffinity` scorer, bounded so one hot adapter spills to a second replica instead of
queueing on one), most those that served it among their last `max_cpu_loras` adapters: vLLM
keeps only that many in host memory and reads an evicted one from disk again before the
request runs, however many it lists in /v1/models. When the chosen replica does not
hold it, the gateway loads it there (`POST /v1/load_lora_adapter`, vLLM's run-time
loading) and the request waits for that, at most the model's `max_queue_wait_s`.
Concurrent first requests share one load per replica. What each replica holds is learnt
from load results and from its `/v1/models` (cards with a `parent`), re-read every health
interval: an engine restart loses adapters loaded at run time, and the next read shows it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import orjson

from inferplane.aio import cancel_and_wait
from inferplane.gateway.backend import Backend, failure_text
from inferplane.gateway.scorers import RouteContext

if TYPE_CHECKING:
    from inferplane.gateway.state import GatewayState

LOAD_PATH = "/v1/load_lora_adapter"
MODELS_PATH = "/v1/models"
# A load may outlive the request that started it (the next request finds it loaded): its
# own bound is generous, a request's wait is the model's max_queue_wait_s.
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=600.0, connect=5.0)
_LIST_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
# A holder is preferred while its in-flight load is within this factor of the average
# (+1 for the request being placed): a hot adapter then spreads to a second replica.
HOLDER_LOAD_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class AdapterRoute:
    """One adapter the gateway routes: `name` is what the engines know it by (vLLM's
    lora_name), `model` its base model's gateway name, `source` the PEFT directory the
    engine reads when loading it."""

    name: str
    model: str
    source: str
    aliases: tuple[str, ...] = ()

    @property
    def client_names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


class AdapterAffinity:
    """Prefer replicas that served the requested adapter lately (1.0: likely still in their
    host-memory cache, or loading it now), then those merely holding it (0.5), while their
    load stays within `HOLDER_LOAD_FACTOR` x the average; a request without one scores 0."""

    def __init__(self, weight: float = 5.0) -> None:
        self.weight = weight

    def score(self, candidates: Sequence[Backend], ctx: RouteContext) -> list[float]:
        holders = ctx.holders
        if holders is None:
            return [0.0] * len(candidates)
        warm = ctx.warm or frozenset()
        total = sum(b.outstanding for b in candidates)
        cap = max(1.0, HOLDER_LOAD_FACTOR * (total + 1) / len(candidates))
        return [
            0.0 if b.outstanding >= cap else 1.0 if b.url in warm else
            0.5 if b.url in holders else 0.0
            for b in candidates
        ]


class AdapterLoadError(Exception):
    """The adapter could not be made ready on the chosen replica (-> 503)."""


class AdapterHoldings:
    """Which replica (by URL) holds which adapter, and the loads in flight."""

    def __init__(self, state: GatewayState, session: Callable[[], aiohttp.ClientSession],
                 interval_s: float) -> None:
        self.state = state
        self._session = session
        self.interval_s = interval_s
        self._held: dict[str, set[str]] = {}  # replica URL -> adapter names it serves
        self._loading: dict[tuple[str, str], asyncio.Task[str | None]] = {}
        self._loaded_at: dict[tuple[str, str], float] = {}
        # replica URL -> the adapters it served last, newest last (its host-memory cache)
        self._warm: dict[str, OrderedDict[str, None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.loads = 0  # loads the gateway asked for (benchmarks, tests)
        self.load_failures = 0

    # -- reading -----------------------------------------------------------------------

    def holds(self, url: str, name: str) -> bool:
        return name in self._held.get(url, ())

    def holders(self, name: str) -> frozenset[str]:
        """Replica URLs that hold `name` or are loading it now."""
        found = {url for url, names in self._held.items() if name in names}
        found.update(url for url, adapter in self._loading if adapter == name)
        return frozenset(found)

    def warm(self, name: str) -> frozenset[str]:
        """Replica URLs that served `name` among their last adapters, or are loading it."""
        found = {url for url, recent in self._warm.items() if name in recent}
        found.update(url for url, adapter in self._loading if adapter == name)
        return frozenset(found)

    def served(self, url: str, name: str, slots: int) -> None:
        """`url` runs a request with `name`: it is in its cache of `slots` adapters now."""
        recent = self._warm.setdefault(url, OrderedDict())
        recent[name] = None
        recent.move_to_end(name)
        while len(recent) > slots:
            recent.popitem(last=False)

    def table(self) -> dict[str, list[str]]:
        """Replica URL -> adapters it holds, sorted (status, tests)."""
        return {url: sorted(names) for url, names in self._held.items()}

    # -- learning ----------------------------------------------------------------------

    def learn(self, url: str, names: Iterable[str], since: float | None = None) -> None:
        """What `url`'s /v1/models listed (read at loop time `since`): replaces what was
        known, except adapters whose load finished after that read began."""
        held = set(names)
        if since is not None:
            held.update(a for (u, a), at in self._loaded_at.items() if u == url and at > since)
        self._held[url] = held
        recent = self._warm.get(url)
        for name in [n for n in recent or () if n not in held]:  # lost (engine restarted)
            del recent[name]  # type: ignore[union-attr]

    def forget(self, url: str) -> None:
        self._held.pop(url, None)
        self._warm.pop(url, None)

    async def read(self, backend: Backend) -> None:
        """Re-read one replica's adapters from its /v1/models (cards with a parent)."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        try:
            async with self._session().get(
                backend.url + MODELS_PATH, headers=_auth(backend), timeout=_LIST_TIMEOUT
            ) as resp:
                if resp.status != 200:
                    return
                body = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return  # unreachable: what it held stays as known until it answers
        cards = body.get("data") if isinstance(body, dict) else None
        if isinstance(cards, list):
            self.learn(backend.url, (str(c["id"]) for c in cards if isinstance(c, dict)
                                     and c.get("parent") and "id" in c), since)

    async def read_all(self) -> None:
        jobs = [self.read(b) for pool in self.state.pools.values() if pool.route.adapters
                for b in pool.backends if b.ready]
        if jobs:
            await asyncio.gather(*jobs)

    def start(self) -> None:
        if any(pool.route.adapters for pool in self.state.pools.values()):
            self._task = asyncio.get_running_loop().create_task(self._every())

    async def stop(self) -> None:
        await cancel_and_wait(self._task, *self._loading.values())
        self._task = None
        self._loading.clear()

    async def _every(self) -> None:
        while True:
            await self.read_all()
            await asyncio.sleep(self.interval_s)

    # -- loading -----------------------------------------------------------------------

    async def ensure(self, backend: Backend, adapter: AdapterRoute, wait_s: float) -> None:
        """Return once `backend` holds `adapter`, loading it there if needed (one load per
        replica however many requests wait). Raises AdapterLoadError after `wait_s` or
        when the engine refuses the load."""
        if self.holds(backend.url, adapter.name):
            return
        key = (backend.url, adapter.name)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(backend, adapter))
            self._loading[key] = task
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        try:
            failure = await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            raise AdapterLoadError(
                f"adapter `{adapter.name}` did not load on {backend.public} within "
                f"{wait_s:g} s (model `{adapter.model}`); retry later"
            ) from None
        if failure is not None:
            raise AdapterLoadError(failure)

    async def _load(self, backend: Backend, adapter: AdapterRoute) -> str | None:
        """One load: None when the replica holds the adapter afterwards, else why not."""
        self.loads += 1
        body = {"lora_name": adapter.name, "lora_path": adapter.source}
        try:
            async with self._session().post(
                backend.url + LOAD_PATH, json=body, headers=_auth(backend), timeout=LOAD_TIMEOUT
            ) as resp:
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.load_failures += 1
            return (f"loading adapter `{adapter.name}` on {backend.public} failed: "
                    + failure_text(exc, backend))  # never the engine's address (issue 30)
        if status == 200 or (status == 400 and "has already been loaded" in text):
            self._held.setdefault(backend.url, set()).add(adapter.name)
            self._loaded_at[(backend.url, adapter.name)] = asyncio.get_running_loop().time()
            return None
        self.load_failures += 1
        if status == 404 and "detail" in text:  # FastAPI's: the route is not registered
            return (f"{backend.public} does not hold adapter `{adapter.name}` and does not "
                    "load adapters at run time (its engine runs without "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
        return (f"{backend.public} refused to load adapter `{adapter.name}` "
                f"({status}): {_engine_message(text)}")


def _auth(backend: Backend) -> dict[str, str]:
    return {"Authorization": "Bearer " + backend.api_key} if backend.api_key else {}


def _engine_message(text: str) -> str:
    try:
        body = orjson.loads(text)
        return str(body["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return text[:300]
