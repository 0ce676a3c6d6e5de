"""A streamed chat completion, told as the Responses API's server-sent events.

The chat pipeline streams `chat.completion.chunk`s from the policy's endpoint; a Responses
client expects the events of `client.responses.create(stream=True)`. Each event goes out as

    event: <type>\\ndata: <json with "type" and a sequence_number counting from 0>\\n\\n

in this order (no `data: [DONE]`: the Responses API ends with its closing event):

    response.created, response.in_progress                    start(): status in_progress
    response.output_item.added {item: reasoning}              feed(): as chunks bring them
      response.content_part.added {part: reasoning_text}
      response.reasoning_text.delta ...
    response.output_item.added {item: message}
      response.content_part.added {part: output_text}
      response.output_text.delta ...                          (logprobs when `include` asks)
    response.output_item.added {item: function_call}          one per tool call `index`
      response.function_call_arguments.delta ...
    response.output_text.done, response.content_part.done,   finish(): every open item, in
      response.output_item.done                               output_index order
    response.function_call_arguments.done, response.output_item.done
    response.completed                                        the whole response, usage included
      (or response.incomplete, when the answer was cut at max_output_tokens or filtered:
       OpenAI's event for that status; or response.failed, when the upstream broke off)

Items open when their first non-empty delta arrives and close together in finish(): a chat
stream can add to any of its items until it ends (tool calls by `index`, text after a call),
so an item is done only when the stream is. A tool call opens once its id and name are
known; argument fragments that came before are sent in one delta.

The closing response is built from what was streamed, with the helpers `to_response` uses
(translate.py), so it equals `to_response` of the assembled completion whenever the chunks
bring reasoning, then text, then tool calls (the order of vLLM's parsers). Differences,
both deliberate: the stream's order of items is the order they arrived in; an answer whose
text came after a tool call lists its message after the call, where `to_response` lists the
message first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.endpoints.responses.translate import (
    fallback_call_id,
    final_status,
    function_call_id,
    function_call_item,
    logprobs_requested,
    message_id,
    message_item,
    output_text_part,
    reasoning_id,
    reasoning_item,
    reasoning_text,
    response_object,
    response_usage,
    responses_logprob,
    set_item_statuses,
)

# ResponseError.code values the SDK accepts; an upstream failure is a server_error unless rate limited.
RATE_LIMITED = "rate_limit_exceeded"
SERVER_ERROR = "server_error"


def sse_event(event: dict[str, Any]) -> bytes:
    """One server-sent event: `event: <type>`, `data: <json>`, a blank line."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


@dataclass(slots=True)
class _Reasoning:
    output_index: int
    item_id: str
    text: str = ""


@dataclass(slots=True)
class _Message:
    output_index: int
    item_id: str
    parts: list[str] = field(default_factory=list)  # "output_text" / "refusal", by content index
    text: str = ""
    refusal: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # of the text, as streamed

    def content(self, with_logprobs: bool) -> list[dict[str, Any]]:
        return [
            output_text_part(self.text, self.logprobs if with_logprobs else None)
            if kind == "output_text"
            else {"type": "refusal", "refusal": self.refusal}
            for kind in self.parts
        ]


@dataclass(slots=True)
class _Call:
    index: int  # the chat chunks' tool call index
    item_id: str
    output_index: int | None = None  # set when the item is opened
    call_id: str | None = None
    name: str = ""
    arguments: str = ""
    sent: int = 0  # how much of `arguments` has gone out in deltas


class ResponsesStream:
    """Turns a chat completion chunk stream into the Responses API's SSE events.

    One instance per response: start(), feed() for each chunk, finish() once. Only the first
    choice is read (a Responses request asks for one). Chunks that carry an error instead of
    choices are ignored: the caller reports the failure through finish(error=...).
    """

    def __init__(self, *, response_id: str, request: dict[str, Any], created_at: float) -> None:
        self.response_id = response_id
        self.request = request
        self.created_at = created_at
        self._logprobs = logprobs_requested(request)
        self._sequence = 0
        self._fed = False
        self._finished = False
        self._order: list[_Reasoning | _Message | _Call] = []  # opened items, by output_index
        self._reasoning: _Reasoning | None = None
        self._message: _Message | None = None
        self._calls: dict[int, _Call] = {}
        self._pending_logprobs: list[dict[str, Any]] = []  # of tokens that brought no text yet
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None

    # ------------------------------------------------------------ the three calls

    def start(self) -> bytes:
        """`response.created` and `response.in_progress`, with an empty in-progress response."""
        response = self._response("in_progress", [])
        return self._emit({"type": "response.created", "response": response}) + self._emit(
            {"type": "response.in_progress", "response": response}
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One chat.completion.chunk dict -> zero or more events."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._fed = True
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out: list[bytes] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if (reasoning := reasoning_text(delta)) is not None:
                out.append(self._reasoning_delta(reasoning))
            if self._logprobs and choice.get("logprobs"):
                content = choice["logprobs"].get("content") or []
                self._pending_logprobs.extend(responses_logprob(entry) for entry in content)
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self._text_delta(delta["content"]))
            if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                out.append(self._refusal_delta(delta["refusal"]))
            for call_delta in delta.get("tool_calls") or []:
                out.append(self._call_delta(call_delta))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def finish(
        self, chat: dict[str, Any] | None, error: dict[str, Any] | None, *, completed_at: float | None = None
    ) -> bytes:
        """The closing events. `chat`: the assembled completion, if the caller has it (its usage
        and finish reason fill in what the chunks lacked; an answer that came whole, without
        chunks, is streamed from it). `error`: the upstream broke off (an OpenAI error object,
        bare or under "error"): `response.failed`, with the items as far as they got.
        """
        if self._finished:
            return b""
        out: list[bytes] = []
        if chat is not None and not self._fed:
            out.append(self.feed(_as_chunk(chat)))
        self._finished = True
        if chat is not None:
            self._usage = self._usage or chat.get("usage")
            choices = chat.get("choices") or [{}]
            self._finish_reason = self._finish_reason or choices[0].get("finish_reason")
        if error is not None:
            output = self._output(with_logprobs=self._logprobs)
            for item in output:
                if item["type"] != "reasoning":
                    item["status"] = "incomplete"
            failed = self._response("failed", output, error=_response_error(error))
            out.append(self._emit({"type": "response.failed", "response": failed}))
            return b"".join(out)

        if self._message is None and not self._calls:
            out.append(self._open_part("output_text"))  # an empty answer is still an (empty) message
        for call in list(self._calls.values()):
            if call.output_index is None:  # id or name never came: open it now
                out.append(self._open_call(call))
        status, reason = final_status(self._finish_reason)
        output = self._output(with_logprobs=self._logprobs)
        set_item_statuses(output, status)
        for entry, item in zip(self._order, output, strict=True):
            out.append(self._close(entry, item))
        response = self._response(
            status,
            output,
            incomplete_reason=reason,
            completed_at=completed_at if status == "completed" else None,
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._emit({"type": kind, "response": response}))
        return b"".join(out)

    # ------------------------------------------------------------ opening items and deltas

    def _next_index(self) -> int:
        return len(self._order)

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self._reasoning is None:
            self._reasoning = _Reasoning(self._next_index(), reasoning_id(self.response_id))
            self._order.append(self._reasoning)
            out += self._item_added(self._reasoning.output_index, reasoning_item(self._reasoning.item_id, None))
            out += self._emit(
                {
                    "type": "response.content_part.added",
                    "item_id": self._reasoning.item_id,
                    "output_index": self._reasoning.output_index,
                    "content_index": 0,
                    "part": {"type": "reasoning_text", "text": ""},
                }
            )
        self._reasoning.text += text
        return out + self._emit(
            {
                "type": "response.reasoning_text.delta",
                "item_id": self._reasoning.item_id,
                "output_index": self._reasoning.output_index,
                "content_index": 0,
                "delta": text,
            }
        )

    def _open_message(self) -> bytes:
        self._message = _Message(self._next_index(), message_id(self.response_id))
        self._order.append(self._message)
        return self._item_added(self._message.output_index, message_item(self._message.item_id, [], "in_progress"))

    def _open_part(self, kind: str) -> bytes:
        """A content part of the message (opened first if need be): output_text or refusal."""
        out = b"" if self._message is not None else self._open_message()
        message = self._message
        assert message is not None
        if kind in message.parts:
            return out
        message.parts.append(kind)
        part = output_text_part("", None) if kind == "output_text" else {"type": "refusal", "refusal": ""}
        return out + self._emit(
            {
                "type": "response.content_part.added",
                "item_id": message.item_id,
                "output_index": message.output_index,
                "content_index": message.parts.index(kind),
                "part": part,
            }
        )

    def _text_delta(self, text: str) -> bytes:
        out = self._open_part("output_text")
        message = self._message
        assert message is not None
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        message.text += text
        message.logprobs.extend(logprobs)
        return out + self._emit(
            {
                "type": "response.output_text.delta",
                "item_id": message.item_id,
                "output_index": message.output_index,
                "content_index": message.parts.index("output_text"),
                "delta": text,
                "logprobs": [_delta_logprob(entry) for entry in logprobs],
            }
        )

    def _refusal_delta(self, text: str) -> bytes:
        out = self._open_part("refusal")
        message = self._message
        assert message is not None
        message.refusal += text
        return out + self._emit(
            {
                "type": "response.refusal.delta",
                "item_id": message.item_id,
                "output_index": message.output_index,
                "content_index": message.parts.index("refusal"),
                "delta": text,
            }
        )

    def _call_delta(self, delta: dict[str, Any]) -> bytes:
        index = int(delta.get("index", len(self._calls)))
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call(index, function_call_id(self.response_id, index))
        function = delta.get("function") or {}
        if delta.get("id") and call.call_id is None:
            call.call_id = str(delta["id"])
        if function.get("name"):
            call.name += str(function["name"])
        if function.get("arguments"):
            call.arguments += str(function["arguments"])
        out = b""
        if call.output_index is None:
            if call.call_id is None or not call.name:
                return out
            out += self._open_call(call)
        return out + self._arguments_delta(call)

    def _open_call(self, call: _Call) -> bytes:
        call.output_index = self._next_index()
        call.call_id = call.call_id or fallback_call_id(self.response_id, call.index)
        self._order.append(call)
        item = function_call_item(call.item_id, call.call_id, call.name, "", "in_progress")
        return self._item_added(call.output_index, item) + self._arguments_delta(call)

    def _arguments_delta(self, call: _Call) -> bytes:
        fresh = call.arguments[call.sent :]
        if not fresh:
            return b""
        call.sent = len(call.arguments)
        return self._emit(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": call.item_id,
                "output_index": call.output_index,
                "delta": fresh,
            }
        )

    def _item_added(self, output_index: int, item: dict[str, Any]) -> bytes:
        return self._emit({"type": "response.output_item.added", "output_index": output_index, "item": item})

    # ------------------------------------------------------------ closing

    def _output(self, *, with_logprobs: bool) -> list[dict[str, Any]]:
        """The items as they stand, in output_index order (statuses set by the caller)."""
        output: list[dict[str, Any]] = []
        for entry in self._order:
            if isinstance(entry, _Reasoning):
                output.append(reasoning_item(entry.item_id, entry.text))
            elif isinstance(entry, _Message):
                if self._pending_logprobs:  # tokens after the last text delta (tool calls, say)
                    entry.logprobs.extend(self._pending_logprobs)
                    self._pending_logprobs = []
                output.append(message_item(entry.item_id, entry.content(with_logprobs), "in_progress"))
            else:
                output.append(
                    function_call_item(entry.item_id, entry.call_id or "", entry.name, entry.arguments, "in_progress")
                )
        return output

    def _close(self, entry: _Reasoning | _Message | _Call, item: dict[str, Any]) -> bytes:
        out = b""
        where = {"item_id": entry.item_id, "output_index": entry.output_index}
        if isinstance(entry, _Reasoning):
            out += self._emit({"type": "response.reasoning_text.done", **where, "content_index": 0, "text": entry.text})
            out += self._emit(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": item["content"][0]}
            )
        elif isinstance(entry, _Message):
            for content_index, part in enumerate(item["content"]):
                if part["type"] == "output_text":
                    out += self._emit(
                        {
                            "type": "response.output_text.done",
                            **where,
                            "content_index": content_index,
                            "text": part["text"],
                            "logprobs": [_delta_logprob(logprob) for logprob in part["logprobs"]],
                        }
                    )
                else:
                    out += self._emit(
                        {
                            "type": "response.refusal.done",
                            **where,
                            "content_index": content_index,
                            "refusal": part["refusal"],
                        }
                    )
                out += self._emit(
                    {"type": "response.content_part.done", **where, "content_index": content_index, "part": part}
                )
        else:
            out += self._emit({"type": "response.function_call_arguments.done", **where, "arguments": entry.arguments})
        return out + self._emit({"type": "response.output_item.done", "output_index": entry.output_index, "item": item})

    # ------------------------------------------------------------ events

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        *,
        incomplete_reason: str | None = None,
        error: dict[str, Any] | None = None,
        completed_at: float | None = None,
    ) -> dict[str, Any]:
        return response_object(
            response_id=self.response_id,
            request=self.request,
            created_at=self.created_at,
            status=status,
            output=output,
            usage=response_usage(self._usage) if status != "in_progress" else None,
            incomplete_reason=incomplete_reason,
            error=error,
            completed_at=completed_at,
        )

    def _emit(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return sse_event(event)


def _delta_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """The text events' logprob shape: {token, logprob, top_logprobs: [{token, logprob}]} (no bytes)."""
    return {
        "token": entry["token"],
        "logprob": entry["logprob"],
        "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]],
    }


def _response_error(error: dict[str, Any]) -> dict[str, Any]:
    """An upstream's error -> the response's `error` ({code, message}); code as the SDK allows."""
    nested = error.get("error")
    inner: dict[str, Any] = nested if isinstance(nested, dict) else error
    message = inner.get("message") if isinstance(inner.get("message"), str) else None
    code = inner.get("code")
    limited = code in (429, "429", RATE_LIMITED) or inner.get("type") in ("rate_limit_error", "rate_limit_exceeded")
    return {
        "code": RATE_LIMITED if limited else SERVER_ERROR,
        "message": message or "The model's endpoint ended the stream early.",
    }


def _as_chunk(chat: dict[str, Any]) -> dict[str, Any]:
    """A whole completion as one chunk, for an answer that reached the stream unchunked."""
    choices = []
    for choice in chat.get("choices") or []:
        message = choice.get("message") or {}
        tool_calls = [{**call, "index": index} for index, call in enumerate(message.get("tool_calls") or [])]
        delta = {key: message.get(key) for key in ("reasoning_content", "reasoning", "content", "refusal")}
        choices.append(
            {
                "index": choice.get("index", 0),
                "delta": {**delta, "tool_calls": tool_calls},
                "logprobs": choice.get("logprobs"),
                "finish_reason": choice.get("finish_reason"),
            }
        )
    return {"choices": choices, "usage": chat.get("usage")}
