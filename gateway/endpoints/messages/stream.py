"""A chat completion chunk stream -> Anthropic's Messages stream (server-sent events).

Each event is written as Anthropic writes it, `event: <type>\\ndata: <json>\\n\\n`:

    message_start        {"type", "message": {id, type, role, model, content: [], stop_reason: null,
                          stop_sequence: null, usage: {input_tokens: 0, ..., output_tokens: 0}}}
    content_block_start  {"type", "index", "content_block": {"type": "text", "text": ""}
                                                       or {"type": "tool_use", "id", "name", "input": {}}}
    content_block_delta  {"type", "index", "delta": {"type": "text_delta", "text"}
                                                 or {"type": "input_json_delta", "partial_json"}}
    content_block_stop   {"type", "index"}
    message_delta        {"type", "delta": {"stop_reason", "stop_sequence"},
                          "usage": {input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
                                    output_tokens}}
    message_stop         {"type"}
    error                {"type": "error", "error": {"type", "message"}}   (instead of the closing events)

Usage is only known at the end (the chat stream's last chunk, `choices: []`), so
`message_start` says 0 input tokens and `message_delta` carries the real counts: Anthropic's
SDKs take every count a `message_delta` gives as the cumulative total.

Blocks come one after another, as Anthropic sends them: text deltas go to the open text block
(one is started when text follows a tool call), and a tool call's block starts once its name is
known (its id comes with it; arguments that came first are sent right after). Argument
fragments are sent as they arrive while the arguments so far are the beginning of one JSON
object (`_ObjectPrefix`); the first fragment that breaks that, and all after it, are held
back: the SDKs re-parse a tool's input after every fragment and would fail the whole stream
on invalid JSON. The client then holds the input its SDK parses from what was sent, where
`to_message` says `{}` (a call cut off by max_tokens, or malformed). Otherwise the message a
client accumulates equals `to_message` of the assembled completion, with two exceptions from
upstreams that interleave: text after a tool call is a block of its own (to_message joins all
text into one block first), and a fragment for an earlier tool call goes to that call's block
after its `content_block_stop` (the SDKs apply it by index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.endpoints.messages.errors import ERROR_TYPES, error_object, error_type_for, openai_error_message
from gateway.endpoints.messages.translate import fallback_tool_id, first_choice, stop_reason_of, usage_of


def sse(event_type: str, data: dict[str, Any]) -> bytes:
    """One server-sent event as Anthropic writes them."""
    return b"event: " + event_type.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(error: dict[str, Any]) -> bytes:
    """An `error` event for an error dict in OpenAI's shape (`{"error": {"message", "type", ...}}`,
    bare or wrapped, an HTTP `status` where known) or already in Anthropic's types.

    An Anthropic `error.type` is kept; otherwise the type follows `status`, and an upstream
    that broke off without one is an `api_error` (what Anthropic reports for its own failures
    mid-stream; the SDKs raise it as an APIStatusError).
    """
    wrapped = error.get("error")
    inner: dict[str, Any] = wrapped if isinstance(wrapped, dict) else error
    message = openai_error_message(error) or "the upstream stream failed"
    kind = inner.get("type")
    status = inner.get("status", error.get("status"))
    if status is None and isinstance(inner.get("code"), int):  # vLLM puts the HTTP status in `code`
        status = inner["code"]
    if kind not in set(ERROR_TYPES.values()):
        kind = error_type_for(status) if isinstance(status, int) and status >= 400 else "api_error"
    return sse("error", error_object(500, message, kind))


@dataclass
class _ToolCall:
    index: int  # the chat stream's tool call index
    id: str | None = None
    name: str = ""
    block: int | None = None  # the Anthropic content block, once started
    pending: str = ""  # argument text not sent yet
    json: _ObjectPrefix = field(default_factory=lambda: _ObjectPrefix())


class MessagesStream:
    """Turns a chat completion chunk stream into Anthropic's SSE events.

    `start()` once, `feed()` per chat.completion.chunk (a dict), `finish()` once; each returns
    the bytes to send (possibly none). Only choice 0 is read: a Messages request never asks
    for more. An error object fed as a chunk ends the stream with an `error` event, and
    `finish()` then sends nothing.
    """

    def __init__(self, *, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self._blocks = 0  # content blocks started so far
        self._open: int | None = None  # the open block
        self._text_open = False  # ... and whether it is a text block
        self._calls: dict[int, _ToolCall] = {}
        self._finish_reason: Any = None
        self._matched_stop: Any = None
        self._usage: dict[str, Any] | None = None
        self._refused = False
        self._finished = False

    def start(self) -> bytes:
        """`message_start`: the message shell, usage 0 until the last chunk tells."""
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_of(None),
        }
        return sse("message_start", {"type": "message_start", "message": message})

    @staticmethod
    def ping() -> bytes:
        """A `ping` event, to keep an idle connection open (clients skip it)."""
        return sse("ping", {"type": "ping"})

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One chat.completion.chunk -> zero or more events."""
        if self._finished or not isinstance(chunk, dict):
            return b""
        if chunk.get("object") == "error" or isinstance(chunk.get("error"), dict):
            # vLLM writes an error object into the stream when generation fails after the
            # headers went out: the stream ends there, as Anthropic ends a failed one.
            self._finished = True
            return error_event(chunk)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]  # vLLM's continuous usage repeats it: the last one counts
        out: list[bytes] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self._text(delta["content"]))
            if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                self._refused = True
                out.append(self._text(delta["refusal"]))
            for tool_delta in delta.get("tool_calls") or []:
                if isinstance(tool_delta, dict):
                    out.append(self._tool_delta(tool_delta))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
            if choice.get("stop_reason") is not None:
                self._matched_stop = choice["stop_reason"]
        return b"".join(out)

    def finish(self, chat: dict[str, Any] | None, error: dict[str, Any] | None) -> bytes:
        """The closing events: `content_block_stop` for the open block, `message_delta`,
        `message_stop`; with `error` (an upstream that broke off) only an `error` event, as
        Anthropic ends a stream that failed.

        `chat`, the assembled completion, fills in what the chunks did not say (finish
        reason, vLLM's matched stop string, usage).
        """
        if self._finished:
            return b""
        self._finished = True
        if error is not None:
            return error_event(error)
        choice = first_choice(chat or {})
        finish_reason = self._finish_reason or choice.get("finish_reason")
        matched_stop = self._matched_stop if self._matched_stop is not None else choice.get("stop_reason")
        usage = self._usage if self._usage is not None else (chat or {}).get("usage")
        out: list[bytes] = []
        for call in sorted(self._calls.values(), key=lambda c: c.index):
            if call.block is None:  # never named: shown nameless rather than lost
                out.append(self._start_tool(call))
                out.append(self._send_arguments(call))
        out.append(self._close())
        stop_reason, stop_sequence = stop_reason_of(
            finish_reason, matched_stop, has_tool_calls=bool(self._calls), refused=self._refused
        )
        out.append(
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": usage_of(usage),
                },
            )
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    # --- blocks ---

    def _text(self, text: str) -> bytes:
        out = b""
        if not self._text_open:
            out = self._close()
            self._open, self._text_open = self._new_block(), True
            out += sse(
                "content_block_start",
                {"type": "content_block_start", "index": self._open, "content_block": {"type": "text", "text": ""}},
            )
        delta = {"type": "text_delta", "text": text}
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self._open, "delta": delta})

    def _tool_delta(self, tool_delta: dict[str, Any]) -> bytes:
        index = tool_delta.get("index")
        if not isinstance(index, int):  # as assembly.py does: an unindexed delta is a new call
            index = max(self._calls) + 1 if self._calls else 0
        call = self._calls.setdefault(index, _ToolCall(index))
        function = tool_delta.get("function") or {}
        if call.block is None:  # id and name are sent with the block's start, and fixed there
            if isinstance(tool_delta.get("id"), str) and tool_delta["id"]:
                call.id = tool_delta["id"]
            if isinstance(function.get("name"), str):
                call.name += function["name"]
        if isinstance(function.get("arguments"), str):
            call.pending += function["arguments"]
        out = b""
        if call.block is None and call.name:
            out = self._start_tool(call)
        if call.block is not None:
            out += self._send_arguments(call)
        return out

    def _start_tool(self, call: _ToolCall) -> bytes:
        out = self._close()
        call.block = self._open = self._new_block()
        block = {
            "type": "tool_use",
            "id": call.id or fallback_tool_id(self.message_id, call.index),
            "name": call.name,
            "input": {},
        }
        start = {"type": "content_block_start", "index": call.block, "content_block": block}
        return out + sse("content_block_start", start)

    def _send_arguments(self, call: _ToolCall) -> bytes:
        text, call.pending = call.pending, ""
        accepted = call.json.accept(text)
        if not accepted:
            return b""
        delta = {"type": "input_json_delta", "partial_json": accepted}
        return sse("content_block_delta", {"type": "content_block_delta", "index": call.block, "delta": delta})

    def _new_block(self) -> int:
        self._blocks += 1
        return self._blocks - 1

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._text_open = self._open, None, False
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})


# --- is it still the beginning of a JSON object? -------------------------------------------

_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
# Number grammar (RFC 8259): -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
_NUMBER_STATES = frozenset({"minus", "zero", "int", "dot", "frac", "exp", "exp_sign", "exp_digits"})
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp_digits"})  # where a number may end


def _number_step(state: str, ch: str) -> str | None:
    """The number state after `ch`, or None when `ch` is not part of the number."""
    digit = ch in _DIGITS
    if state == "minus":
        return "zero" if ch == "0" else "int" if digit else None
    if state in ("zero", "int", "frac") and ch in "eE":
        return "exp"
    if state in ("zero", "int") and ch == ".":
        return "dot"
    if state in ("int", "dot", "frac"):
        return ("int" if state == "int" else "frac") if digit else None
    if state == "exp":
        return "exp_sign" if ch in "+-" else "exp_digits" if digit else None
    if state in ("exp_sign", "exp_digits"):
        return "exp_digits" if digit else None
    return None


class _ObjectPrefix:
    """Accepts text, fragment by fragment, while all of it stays a prefix of one JSON object.

    A pushdown automaton over RFC 8259, one character at a time, so fragments may split
    anywhere (inside strings, escapes, numbers, literals). Leading whitespace is dropped: a
    buffer of whitespace alone is not a JSON prefix the SDKs' partial parser accepts.
    """

    def __init__(self) -> None:
        self._state = "start"
        self._stack: list[str] = []
        self._in_key = False
        self._literal = ""
        self._hex = 0
        self.broken = False

    def accept(self, text: str) -> str:
        """The longest beginning of `text` that keeps the whole a JSON object prefix."""
        if self.broken:
            return ""
        begin = 0
        for i, ch in enumerate(text):
            if self._state == "start" and ch in _WHITESPACE:
                begin = i + 1
                continue
            if not self._step(ch):
                self.broken = True
                return text[begin:i]
        return text[begin:]

    def _step(self, ch: str) -> bool:
        state = self._state
        if state == "string":
            if ch == '"':
                self._state = "colon" if self._in_key else "after_value"
            elif ch == "\\":
                self._state = "escape"
            return ch >= " "
        if state == "escape":
            if ch == "u":
                self._state, self._hex = "unicode", 4
                return True
            self._state = "string"
            return ch in _ESCAPES
        if state == "unicode":
            self._hex -= 1
            if self._hex == 0:
                self._state = "string"
            return ch in _HEX
        if state == "literal":
            if ch != self._literal[:1]:
                return False
            self._literal = self._literal[1:]
            if not self._literal:
                self._state = "after_value"
            return True
        if state in _NUMBER_STATES:
            following = _number_step(state, ch)
            if following is not None:
                self._state = following
                return True
            if state not in _NUMBER_ENDS:
                return False
            state = self._state = "after_value"  # the number ended; `ch` is what follows it
        if ch in _WHITESPACE:  # (leading whitespace never gets here: accept() drops it)
            return True
        if state == "start":
            return ch == "{" and self._push("{", "key_or_close")
        if state == "key_or_close" and ch == "}":
            return self._pop("{")
        if state in ("key_or_close", "key"):
            if ch != '"':
                return False
            self._state, self._in_key = "string", True
            return True
        if state == "colon":
            if ch != ":":
                return False
            self._state = "value"
            return True
        if state == "value_or_close" and ch == "]":
            return self._pop("[")
        if state in ("value", "value_or_close"):
            return self._value(ch)
        if state == "after_value":
            if ch == ",":
                self._state = "key" if self._stack[-1] == "{" else "value"
                return True
            return ch in "}]" and self._pop("{" if ch == "}" else "[")
        return False  # "done": only whitespace may follow the object

    def _value(self, ch: str) -> bool:
        if ch == '"':
            self._state, self._in_key = "string", False
        elif ch == "{":
            self._push("{", "key_or_close")
        elif ch == "[":
            self._push("[", "value_or_close")
        elif ch == "-":
            self._state = "minus"
        elif ch == "0":
            self._state = "zero"
        elif ch in _DIGITS:
            self._state = "int"
        elif ch in _LITERALS:
            self._state, self._literal = "literal", _LITERALS[ch]
        else:
            return False
        return True

    def _push(self, bracket: str, state: str) -> bool:
        self._stack.append(bracket)
        self._state = state
        return True

    def _pop(self, bracket: str) -> bool:
        if not self._stack or self._stack[-1] != bracket:
            return False
        self._stack.pop()
        self._state = "after_value" if self._stack else "done"
        return True
