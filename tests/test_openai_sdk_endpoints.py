"""The official `openai` SDK through the gateway in front of simulated vLLM engines: every
endpoint of issue 18.8 either works or answers the exact error a client would see."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from model_factory import embed_model_dir
from test_gateway_fakes import Harness

from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.app import GatewayApp, build_app
from inferplane.sim.config import FaultConfig, SimEngineConfig
from inferplane.sim.host import EngineHandle, EngineHost
from inferplane.sim.responses import STORE_ENV
from inferplane.tenancy.service import Tenancy


@dataclass
class SimFleet:
    """Simulated engines and a gateway in front of them, on 127.0.0.1."""

    harness: Harness
    host: EngineHost
    engines: list[EngineHandle]
    app: GatewayApp
    url: str

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def close(self) -> None:
        self.harness.close()
        self.host.stop()


def start_fleet(
    embed_dir: Path,
    tenancy: Tenancy | None = None,
    store_responses: bool = True,
    harness: Harness | None = None,
    slowdown: float = 1.0,
) -> SimFleet:
    """Two replicas of `chat` (so response ids must find their replica) and one `embed`.
    A tenancy's store must live on `harness`'s loop (the gateway's)."""
    faults = FaultConfig(slowdown=slowdown)
    configs = [
        SimEngineConfig(model="sim-chat", max_model_len=2048, eos_after_tokens=16,
                        faults=faults),
        SimEngineConfig(model="sim-chat", max_model_len=2048, eos_after_tokens=16,
                        faults=faults),
        SimEngineConfig(model="sim-embed", model_dir=embed_dir, max_model_len=2048),
    ]
    host = EngineHost(configs)
    with pytest.MonkeyPatch.context() as mp:  # read once when each engine is built
        mp.setenv(STORE_ENV, "1" if store_responses else "0")
        engines = host.start()
    config = GatewayConfig(
        models=(
            ModelRoute("chat", endpoints=(engines[0].url, engines[1].url),
                       served_name="sim-chat", max_tokens_cap=64),
            ModelRoute("embed", endpoints=(engines[2].url,), served_name="sim-embed"),
        ),
        access_log=False,
    )  # fmt: skip
    harness = harness or Harness()
    app = build_app(config, tenancy)
    return SimFleet(harness, host, engines, app, harness.serve(app))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    f = start_fleet(embed_model_dir(tmp_path_factory.mktemp("embed")))
    yield f
    f.close()


@pytest.fixture(scope="module")
def client(fleet: SimFleet) -> openai.OpenAI:
    return fleet.client()


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["chat", "embed"]
    model = client.models.retrieve("chat")
    assert (model.id, model.object, model.owned_by) == ("chat", "model", "inferplane")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"
    assert caught.value.body == {
        "message": "The model `no-such-model` does not exist or you do not have access to it.",
        "type": "invalid_request_error", "param": None, "code": "model_not_found",
    }  # fmt: skip


def test_responses_create_plain(client: openai.OpenAI) -> None:
    reply = client.responses.create(model="chat", input="hello there", max_output_tokens=5)
    assert reply.id.startswith("resp_")
    assert reply.object == "response" and reply.model == "sim-chat"
    assert reply.output_text == "sim filler token lorem ipsum"
    assert reply.status == "incomplete"  # stopped by max_output_tokens, as vLLM reports it
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 5
    assert reply.usage.input_tokens > 0
    natural = client.responses.create(model="chat", input="hi", instructions="be brief")
    assert natural.status == "completed" and natural.usage is not None
    assert natural.usage.output_tokens == 16  # the simulated model's EOS, under the cap
    assert natural.instructions == "be brief"


def test_responses_streamed(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="chat", input="stream it", stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1]
    assert done.type == "response.completed"
    assert done.response.output_text == deltas and done.response.status == "completed"
    assert done.response.usage is not None and done.response.usage.output_tokens == 16
    assert events[0].response.id == done.response.id  # type: ignore[union-attr]


def test_responses_retrieve_finds_the_replica_that_made_each(
    fleet: SimFleet, client: openai.OpenAI
) -> None:
    made = [client.responses.create(model="chat", input=f"n{i}", max_output_tokens=3)
            for i in range(6)]  # fmt: skip
    owners = {fleet.app.responses.get(r.id).url for r in made}  # type: ignore[union-attr]
    assert owners == {fleet.engines[0].url, fleet.engines[1].url}  # both replicas hold some
    streamed = list(client.responses.create(model="chat", input="s", stream=True))[-1]
    assert streamed.type == "response.completed"
    for reply in [*made, streamed.response]:
        again = client.responses.retrieve(reply.id)
        assert again.id == reply.id and again.output_text == reply.output_text
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve("resp_unknown")
    assert caught.value.body == {
        "message": "Response with id 'resp_unknown' not found.",
        "type": "invalid_request_error", "param": "response_id", "code": 404,
    }  # fmt: skip


def test_responses_continue_a_stored_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model="chat", input="my name is Ada", max_output_tokens=4)
    follow = client.responses.create(
        model="chat", input="what is my name?", previous_response_id=first.id,
        max_output_tokens=4,
    )
    alone = client.responses.create(model="chat", input="what is my name?", max_output_tokens=4)
    assert follow.previous_response_id == first.id
    assert first.usage is not None and follow.usage is not None and alone.usage is not None
    # The earlier turn (its input and output) is part of the prompt.
    assert follow.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="chat", input="x", previous_response_id="resp_gone")


def test_responses_cancel_and_background_errors(client: openai.OpenAI) -> None:
    reply = client.responses.create(model="chat", input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.cancel(reply.id)  # vLLM: only background responses can be
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"] == "Cannot cancel a synchronous response."
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="chat", input="x", background=True)
    assert refused.value.param == "background"
    assert "use stream=true" in refused.value.message


def test_responses_for_an_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="nope", input="x")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_found"  # as models.retrieve says it
    assert "The model `nope` does not exist" in caught.value.body["message"]


def test_embeddings_completions_chat(client: openai.OpenAI) -> None:
    emb = client.embeddings.create(model="embed", input=["a b", "c"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
    assert emb.usage.prompt_tokens > 0
    done = client.completions.create(model="chat", prompt="Once", max_tokens=4)
    assert done.choices[0].text == "sim filler token lorem"
    chat = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.content == "sim filler token"
    # vLLM registers the chat route only for generate models: FastAPI's 404 elsewhere
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 404


def test_responses_need_the_store_to_be_retrieved(tmp_path: Path) -> None:
    fleet = start_fleet(embed_model_dir(tmp_path), store_responses=False)
    try:
        client = fleet.client()
        reply = client.responses.create(model="chat", input="x", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError) as caught:  # vLLM ignored store=true
            client.responses.retrieve(reply.id)
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["message"] == f"Response with id '{reply.id}' not found."
    finally:
        fleet.close()
