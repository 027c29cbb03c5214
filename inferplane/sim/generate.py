"""One chat or completions call through the engine: its choices, their tokens, the bodies.

A call has one or more prompts (completions accepts a list) and `n` choices per prompt;
every choice is its own engine request (they share the prompt's prefix-cache blocks), and
choice `p * n + j` is output `j` of prompt `p`, as vLLM numbers them. All choices deliver
their tokens to one queue; the SSE stream interleaves their chunks as tokens arrive.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferplane.sim.engine import SimEngine
from inferplane.sim.fields import Fields
from inferplane.sim.outputs import (
    Output,
    PromptToken,
    chat_logprobs,
    completion_logprobs,
    filler_output,
    fixed_output,
    json_pieces,
    prompt_logprobs,
)
from inferplane.sim.protocol import (
    SYSTEM_FINGERPRINT,
    ApiError,
    SamplingRequest,
    chat_choice,
    chat_chunk,
    chat_message,
    chat_response,
    completion_choice,
    completion_chunk,
    completion_response,
    engine_dead,
    prompt_too_long,
    stream_usage,
    usage,
    usage_chunk,
)
from inferplane.sim.scheduler import SimRequest, TokenEvent


@dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids, and for echo the text of each token (None: unknown)."""

    ids: list[int]
    text: str | None = None
    pieces: tuple[str, ...] | None = None  # the text of each token, when known


@dataclass
class _Choice:
    index: int
    prompt: Prompt
    output: Output
    sim: SimRequest
    sent: int = 0  # characters of the visible text already streamed
    tool_call_id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class Generation:
    """The choices of one API call, submitted to `engine`; `body()` or `stream()` answers."""

    def __init__(
        self,
        engine: SimEngine,
        prompts: Sequence[Prompt],
        sampling: SamplingRequest,
        fields: Fields,
        *,
        chat: bool,
        request_id: str,
    ) -> None:
        self.engine = engine
        self.sampling = sampling
        self.fields = fields
        self.chat = chat
        self.request_id = request_id
        self.created = int(time.time())  # unix seconds of this call, as vLLM sets it
        self.prompts = list(prompts)
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.choices: list[_Choice] = []
        for p, prompt in enumerate(self.prompts):
            max_tokens = self._max_tokens(len(prompt.ids))
            for j in range(fields.n):
                output = self._output(j, max_tokens)
                index = p * fields.n + j
                sim = SimRequest(
                    request_id=f"{request_id}-{index}",
                    prompt_token_ids=prompt.ids,
                    output_tokens=len(output.pieces),
                    finish_reason=output.finish_reason,
                    arrival_s=0.0,
                    max_tokens_param=max_tokens,
                )
                self.choices.append(_Choice(index, prompt, output, sim))
        self._by_sim = {choice.sim: choice for choice in self.choices}

    # -- planning --------------------------------------------------------------------

    def _max_tokens(self, prompt: int) -> int:
        max_len = self.engine.max_model_len
        if prompt >= max_len:
            raise prompt_too_long(max_len, prompt)
        wanted = self.sampling.max_tokens
        if wanted is not None and wanted > max_len:
            raise ApiError(
                400,
                f"max_tokens={wanted} cannot be greater than max_model_len={max_len}. Please "
                f"request fewer output tokens. (parameter=max_tokens, value={wanted})",
                "max_tokens",
            )
        max_tokens = wanted if wanted is not None else max_len - prompt
        if prompt + max_tokens > max_len:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {max_len} tokens and your request has "
                f"{prompt} input tokens ({max_tokens} > {max_len} - {prompt}).",
                "max_tokens",
            )
        return max_tokens

    def _output(self, choice: int, max_tokens: int) -> Output:
        forced = self.fields.tool.arguments if self.fields.tool else self.fields.json_text
        if forced is not None:  # the grammar ends the output when the JSON is complete
            return fixed_output(json_pieces(forced), max_tokens, self.sampling.stop)
        natural = self.engine.parts.config.eos_after_tokens
        count = max_tokens if self.sampling.ignore_eos else min(max_tokens, natural)
        reason = "length" if count == max_tokens else "stop"
        return filler_output(choice, count, self.sampling.stop, reason)

    # -- engine ----------------------------------------------------------------------

    def submit(self) -> None:
        try:
            self.engine.submit_call([choice.sim for choice in self.choices], self.queue,
                                    "chat" if self.chat else "completions")
        except ValueError as exc:
            self.close()
            raise ApiError(400, str(exc)) from exc

    def close(self) -> None:
        """Abort what has not finished (client gone, error) and forget the streams."""
        for choice in self.choices:
            if choice.sim.finished_s is None:
                self.engine.abort(choice.sim)
            self.engine.release(choice.sim)

    async def _events(self) -> AsyncIterator[tuple[_Choice, TokenEvent]]:
        pending = len(self.choices)
        while pending:
            event = await self.queue.get()
            if self.engine.dead:  # woken by SimEngine.die: no token comes any more
                raise engine_dead()
            choice = self._by_sim.get(event.request)
            if choice is None:
                continue
            if event.finished:
                pending -= 1
            yield choice, event

    # -- answers ---------------------------------------------------------------------

    def _usage(self) -> dict[str, Any]:
        prompt_tokens = sum(len(p.ids) for p in self.prompts)
        completion = sum(c.sim.num_output for c in self.choices)
        n = self.fields.n
        cached = sum(c.sim.cached_tokens for c in self.choices[::n])
        return usage(prompt_tokens, completion, cached)

    def _finish_reason(self, choice: _Choice) -> str:
        tool = self.fields.tool
        if tool is not None and tool.required and choice.output.finish_reason == "stop":
            return "tool_calls"  # vLLM: "tool_calls" for required, "stop" for a named tool
        return choice.output.finish_reason

    def _echo(self, choice: _Choice) -> str:
        return (choice.prompt.text or "") if self.fields.echo else ""

    def _completion_logprobs(self, choice: _Choice, start: int, count: int,
                             with_prompt: bool) -> dict[str, Any] | None:
        k = self.fields.logprobs
        if k is None:
            return None
        tokens: list[str | PromptToken] = list(choice.output.pieces[start:start + count])
        offset = 0
        first = start
        if with_prompt:
            prompt = [PromptToken(t) for t in choice.prompt.pieces or ()]
            tokens = [*prompt, *tokens]
            first = 0
        elif self.fields.echo:
            offset = len(choice.prompt.text or "")
            first = start + len(choice.prompt.pieces or ())
        offset += choice.output.offset(start)
        return completion_logprobs(tokens, first, k, offset)

    async def body(self) -> dict[str, Any]:
        """Wait for every choice to finish; the whole JSON response."""
        try:
            async for _ in self._events():
                pass
        finally:
            self.close()
        model = self.sampling.model
        if self.chat:
            choices = [self._chat_choice(c) for c in self.choices]
            body = chat_response(self.request_id, model, self.created, choices, self._usage())
            body["prompt_logprobs"] = self._prompt_logprobs(self.prompts[0])
            return body
        completions = [
            completion_choice(
                c.index, self._echo(c) + c.output.text,
                self._completion_logprobs(c, 0, len(c.output.pieces), self.fields.echo),
                self._finish_reason(c),
            )
            for c in self.choices
        ]
        for completion, c in zip(completions, self.choices, strict=True):
            # vLLM: echo with logprobs also scores the prompt (prompt_logprobs = logprobs)
            echo_k = self.fields.logprobs if self.fields.echo else None
            completion["prompt_logprobs"] = self._prompt_logprobs(c.prompt, echo_k)
        return completion_response(self.request_id, model, self.created, completions,
                                   self._usage())

    def _prompt_logprobs(self, prompt: Prompt, default: int | None = None) -> list[Any] | None:
        k = self.fields.prompt_logprobs if self.fields.prompt_logprobs is not None else default
        if k is None:
            return None
        return prompt_logprobs(prompt.ids, prompt.pieces, k, self.engine.parts.tokenizer.encode)

    def _chat_choice(self, choice: _Choice) -> dict[str, Any]:
        k = self.fields.logprobs
        logprobs = chat_logprobs(choice.output.pieces, 0, k) if k is not None else None
        message = chat_message(choice.output.text)
        tool = self.fields.tool
        if tool is not None:
            message = chat_message("", [{
                "id": choice.tool_call_id, "type": "function",
                "function": {"name": tool.name, "arguments": choice.output.text},
            }])
        return chat_choice(choice.index, message, logprobs, self._finish_reason(choice))

    async def stream(self) -> AsyncIterator[bytes]:
        """SSE chunks as tokens arrive, `[DONE]` at the end (and usage when asked)."""
        model, created, rid = self.sampling.model, self.created, self.request_id
        # vLLM sends the role chunks on its first engine output (after prefill), so a
        # client's time to the first chunk is the time to the first token, as on vLLM.
        role_due = self.chat
        unfinished = len(self.choices)
        try:
            try:
                async for choice, event in self._events():
                    if role_due:
                        role_due = False
                        for role_chunk in self._role_chunks():
                            yield role_chunk
                    chunks = [self._with_usage(c, choice, event.index + 1)
                              for c in self._chunks(choice, event)]
                    unfinished -= event.finished
                    if not unfinished and not self.sampling.include_usage:
                        chunks[-1]["system_fingerprint"] = SYSTEM_FINGERPRINT  # vLLM's last
                    for payload in chunks:
                        yield _sse(payload)
                    self.engine.count_streamed_token()
                if role_due:  # no token at all: the stream still opens with the role
                    for chunk in self._role_chunks():
                        yield chunk
                if self.sampling.include_usage:
                    obj = "chat.completion.chunk" if self.chat else "text_completion"
                    yield _sse(usage_chunk(rid, model, created, obj, self._usage()))
            except ApiError as exc:  # the engine core died mid-stream: vLLM's error event
                yield _sse(exc.body())
            yield b"data: [DONE]\n\n"
        finally:
            self.close()

    def _role_chunks(self) -> list[bytes]:
        model, created, rid = self.sampling.model, self.created, self.request_id
        return [_sse(self._with_usage(chat_chunk(rid, model, created, choice.index,
                                                 {"role": "assistant", "content": ""}, None,
                                                 role=True),
                                      choice, 0)) for choice in self.choices]  # fmt: skip

    def _with_usage(self, chunk: dict[str, Any], choice: _Choice, tokens: int
                    ) -> dict[str, Any]:
        """vLLM's continuous_usage_stats: every chunk carries its choice's usage so far."""
        if self.sampling.continuous_usage:
            chunk["usage"] = stream_usage(usage(len(choice.prompt.ids), tokens, 0))
        return chunk

    def _chunks(self, choice: _Choice, event: TokenEvent) -> list[dict[str, Any]]:
        """The chunks of one token. A streamed tool call is vLLM's (hermes parser): first a
        chunk naming the function, then argument fragments (`content` null), and an empty
        delta with the finish reason."""
        tool = self.fields.tool
        if not self.chat or tool is None:
            return [self._chunk(choice, event)]
        model, created, rid = self.sampling.model, self.created, self.request_id
        chunks = []
        if event.index == 0:
            chunks.append(chat_chunk(rid, model, created, choice.index, {
                "content": None, "tool_calls": [{"index": 0, "id": choice.tool_call_id,
                                                 "type": "function",
                                                 "function": {"name": tool.name}}]}, None))
        chunk = self._chunk(choice, event)
        reason = chunk["choices"][0]["finish_reason"]
        if reason is not None:
            chunk["choices"][0]["finish_reason"] = None
            chunk["choices"][0].pop("stop_reason", None)
        if chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]:
            chunks.append(chunk)
        if reason is not None:
            chunks.append(chat_chunk(rid, model, created, choice.index, {}, reason))
        return chunks

    def _chunk(self, choice: _Choice, event: TokenEvent) -> dict[str, Any]:
        output = choice.output
        end = len(output.text) if event.finished else min(len(output.text),
                                                           output.offset(event.index + 1))
        piece, choice.sent = output.text[choice.sent:end], max(choice.sent, end)
        reason = self._finish_reason(choice) if event.finished else None
        model, created, rid = self.sampling.model, self.created, self.request_id
        k = self.fields.logprobs
        token = output.pieces[event.index : event.index + 1]
        if not self.chat:
            first = event.index == 0
            text = (self._echo(choice) if first else "") + piece
            logprobs = self._completion_logprobs(choice, event.index, 1,
                                                 first and self.fields.echo)
            ids = list(choice.prompt.ids) if first and self.fields.echo else None
            return completion_chunk(rid, model, created, choice.index, text, reason, logprobs,
                                    ids)
        chat_lp = chat_logprobs(token, event.index, k) if k is not None else None
        tool = self.fields.tool
        if tool is None:
            delta: dict[str, Any] = {"content": piece}
        else:  # an argument fragment (`_chunks` adds the name chunk and the end)
            delta = {"content": None,
                     "tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        return chat_chunk(rid, model, created, choice.index, delta, reason, chat_lp)
