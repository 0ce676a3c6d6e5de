"""Anthropic Messages <-> OpenAI chat completions, for models served by chat endpoints.

A policy's own endpoints (vLLM, the local server) and hosted non-Anthropic models speak only
chat completions. `POST /v1/messages` turns the client's request into a chat request
(`to_chat_request`), runs it through the chat pipeline, which records the chat form with exact
token ids (what the learner trains on), and turns the chat answer back into Anthropic's
`message` (`to_message`; streams: stream.py). Pure functions: no I/O.

Request, Messages -> chat:

    system: str | [{"type": "text", "text"}]          -> {"role": "system", "content"} first
    messages[i] {"role": "user", "content": str}        -> {"role": "user", "content": str}
      content blocks: text, image                       -> user content (a string for one text
                                                           block, else text / image_url parts)
                      tool_result {tool_use_id, content,  -> {"role": "tool", "tool_call_id",
                                   is_error}               "content": text}, one per result,
                                                           BEFORE the user message with the rest
    messages[i] {"role": "assistant"}: text, tool_use   -> {"role": "assistant", "content",
                                                           "tool_calls": [{id, type: function,
                                                           function: {name, arguments}}]}
                 thinking, redacted_thinking            -> dropped (see below)
    messages[i] {"role": "system", "content"}           -> {"role": "system", "content"}
    max_tokens (required), temperature, top_p, top_k   -> the same names (vLLM takes top_k)
    stop_sequences -> stop; stream -> stream (+ stream_options.include_usage);
    metadata.user_id -> user; tools -> function tools; tool_choice -> tool_choice
    (+ parallel_tool_calls: false); output_config.format (json_schema) -> response_format

Refused with 400 (Anthropic's error format, errors.py), naming the field as Anthropic does
(`messages.2.content.0.tool_use_id: Field required`): a missing `max_tokens`, wrong types,
`document` and `search_result` blocks, image `file` sources (Anthropic's Files API), server
tools (`web_search_*`, `bash_*`, `computer_*`, `text_editor_*`, ...), their result blocks, and
`mcp_servers`: none of these exist for a model behind chat completions.

Dropped on purpose: `thinking`/`redacted_thinking` blocks (their signatures are Anthropic's,
and chat templates drop earlier turns' reasoning anyway), the `thinking` and `service_tier`
parameters, `cache_control` marks (our prefix cache needs none), and any field this module
does not know (newer clients send more; ignoring beats refusing a working agent).

A last assistant message (Anthropic's "prefill") goes to the chat request as it is: a chat
server answers with a new assistant turn after it rather than continuing it.

Images in a tool result (Claude Code's Read tool returns image files that way) cannot ride in
a chat `tool` message (text only); they go, in order, at the head of the user message that
follows the tool messages.

Answer, chat -> Messages (`to_message`): the text (when non-empty) as a `text` block, each
tool call as a `tool_use` block; finish reasons map as `stop -> end_turn` (or `stop_sequence`
when vLLM names the matched stop string in `stop_reason`), `length -> max_tokens`,
`tool_calls -> tool_use`, `content_filter -> refusal`; usage as Anthropic counts it (see
`usage_of`). A reasoning parser's `reasoning_content` is not shown: thinking blocks need
Anthropic's signatures, and the recorded chat completion keeps it.

Tool call ids pass through both ways unchanged, and tool inputs are serialized as vLLM's tool
parsers write arguments (`json.dumps`, `ensure_ascii=False`): the assistant turn an agent echoes
back then usually equals the recorded answer, which is what trajectory stitching hashes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.endpoints.messages.errors import invalid

# Content blocks that need Anthropic's servers (documents, search results, server tools'
# blocks): refused, since a chat model behind this gateway cannot honour them.
UNSUPPORTED_BLOCKS = {
    "document": "documents (PDF, plain-text or content sources) are not supported by this model; send the text "
    "as a text block",
    "search_result": "search_result blocks are not supported by this model; send the results as text",
    "container_upload": "container_upload blocks need Anthropic's code execution tool, not supported here",
}
CLIENT_TOOL_TYPES = (None, "custom")
ROLES = ("user", "assistant", "system")

# The prefix a tool result with `is_error: true` gets in the chat `tool` message: chat
# completions has no error flag, so the model reads it in the text.
TOOL_ERROR_PREFIX = "Error: "


# --- request: Messages -> chat completions -------------------------------------------------


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request -> the chat completions request body (see the module docstring).

    Raises MessagesError (400, `invalid_request_error`) for what Anthropic would refuse and
    for what a chat model cannot do.
    """
    body = _object(body, "")
    model = _required(body, "model", "")
    _string(model, "model")
    if body.get("max_tokens") is None:
        raise invalid("max_tokens", "Field required")
    max_tokens = _integer(body["max_tokens"], "max_tokens")
    if max_tokens < 1:
        raise invalid("max_tokens", "Input should be greater than or equal to 1")
    chat: dict[str, Any] = {"model": model, "messages": chat_messages(body), "max_tokens": max_tokens}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = _number(body[name], name)
    if body.get("top_k") is not None:
        chat["top_k"] = _integer(body["top_k"], "top_k")
    if body.get("stop_sequences") is not None:
        sequences = _array(body["stop_sequences"], "stop_sequences")
        stops = [_string(s, f"stop_sequences.{i}") for i, s in enumerate(sequences)]
        if stops:
            chat["stop"] = stops
    stream = body.get("stream")
    if stream is not None and _boolean(stream, "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # usage arrives in the last chunk
    if body.get("metadata") is not None:
        metadata = _object(body["metadata"], "metadata")
        if metadata.get("user_id") is not None:
            chat["user"] = _string(metadata["user_id"], "metadata.user_id")
    if body.get("mcp_servers"):
        raise invalid("mcp_servers", "MCP servers are run by Anthropic's API and are not supported by this model")
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        choice, parallel = _tool_choice(body["tool_choice"], {t["function"]["name"] for t in tools})
        if tools:  # chat completions refuses a tool_choice without tools
            chat["tool_choice"] = choice
            if parallel is False:
                chat["parallel_tool_calls"] = False
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat `messages` of a Messages request: `system` first, then each message translated."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _system_text(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    if "messages" not in body:
        raise invalid("messages", "Field required")
    messages = _array(body["messages"], "messages")
    if not messages:
        raise invalid("messages", "at least one message is required")
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        message = _object(message, path)
        role = _required(message, "role", path)
        if role not in ROLES:
            raise invalid(f"{path}.role", "Input should be 'user', 'assistant' or 'system'")
        content = _required(message, "content", path)
        if not isinstance(content, (str, list)):
            raise invalid(f"{path}.content", "Input should be a valid string or a list of content blocks")
        if role == "system":
            out.append({"role": "system", "content": _system_text(content, f"{path}.content")})
        elif role == "user":
            out.extend(_user_messages(content, f"{path}.content"))
        else:
            out.append(_assistant_message(content, f"{path}.content"))
    return out


def _system_text(value: Any, path: str) -> str:
    """`system` as one string: text blocks joined by newlines (chat servers join parts so too)."""
    if isinstance(value, str):
        return value
    texts = []
    for j, block in enumerate(_array(value, path)):
        if _block_type(block, f"{path}.{j}") != "text":
            raise invalid(f"{path}.{j}.type", "Input should be 'text'")
        texts.append(_string(_required(block, "text", f"{path}.{j}"), f"{path}.{j}.text"))
    return "\n".join(texts)


def _user_messages(content: str | list[Any], path: str) -> list[dict[str, Any]]:
    """One user message -> chat messages: a `tool` message per tool_result, then the rest.

    Chat completions needs the tool messages right after the assistant's tool calls, so they
    come first whatever the block order.
    """
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    moved_images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        block_path = f"{path}.{j}"
        kind = _block_type(block, block_path)
        if kind == "text":
            parts.append({"type": "text", "text": _string(_required(block, "text", block_path), f"{block_path}.text")})
        elif kind == "image":
            parts.append(_image_part(block, block_path))
        elif kind == "tool_result":
            message, images = _tool_message(block, block_path)
            tool_messages.append(message)
            moved_images.extend(images)
        elif kind == "tool_use":
            raise invalid(f"{block_path}.type", "tool_use blocks are only allowed in assistant messages")
        else:
            _refuse_block(kind, block_path)
    out = tool_messages
    parts = moved_images + parts
    if parts or not tool_messages:
        out.append({"role": "user", "content": _user_content(parts)})
    return out


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part as a plain string (the common case, and the simplest record)."""
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _tool_message(block: dict[str, Any], path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A tool_result -> a chat `tool` message, and the images it held (moved: see the docstring)."""
    tool_use_id = _string(_required(block, "tool_use_id", path), f"{path}.tool_use_id")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    content = block.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif content is not None:
        for k, inner in enumerate(_array(content, f"{path}.content")):
            inner_path = f"{path}.content.{k}"
            kind = _block_type(inner, inner_path)
            if kind == "text":
                texts.append(_string(_required(inner, "text", inner_path), f"{inner_path}.text"))
            elif kind == "image":
                images.append(_image_part(inner, inner_path))
            else:
                _refuse_block(kind, inner_path)
    text = "\n".join(texts)
    if block.get("is_error") is not None and _boolean(block["is_error"], f"{path}.is_error"):
        text = TOOL_ERROR_PREFIX + text if text else TOOL_ERROR_PREFIX.rstrip(": ")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}, images


def _assistant_message(content: str | list[Any], path: str) -> dict[str, Any]:
    """An assistant message -> one chat assistant message: its text, and its tool_use blocks as
    `tool_calls`. Thinking blocks are dropped (see the module docstring)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        block_path = f"{path}.{j}"
        kind = _block_type(block, block_path)
        if kind == "text":
            texts.append(_string(_required(block, "text", block_path), f"{block_path}.text"))
        elif kind == "tool_use":
            calls.append(_tool_call(block, block_path))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind in ("tool_result", "image"):
            raise invalid(f"{block_path}.type", f"{kind} blocks are only allowed in user messages")
        else:
            _refuse_block(kind, block_path)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: dict[str, Any], path: str) -> dict[str, Any]:
    call_id = _string(_required(block, "id", path), f"{path}.id")
    name = _string(_required(block, "name", path), f"{path}.name")
    arguments = _object(_required(block, "input", path), f"{path}.input")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": tool_arguments(arguments)}}


def tool_arguments(tool_input: dict[str, Any]) -> str:
    """A tool_use `input` as chat `arguments`, written as vLLM's tool parsers write them."""
    return json.dumps(tool_input, ensure_ascii=False)


def _image_part(block: dict[str, Any], path: str) -> dict[str, Any]:
    """An image block -> a chat `image_url` part (base64 sources as a data URL)."""
    source = _object(_required(block, "source", path), f"{path}.source")
    kind = _required(source, "type", f"{path}.source")
    if kind == "base64":
        media_type = _string(_required(source, "media_type", f"{path}.source"), f"{path}.source.media_type")
        data = _string(_required(source, "data", f"{path}.source"), f"{path}.source.data")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if kind == "url":
        url = _string(_required(source, "url", f"{path}.source"), f"{path}.source.url")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "file":
        raise invalid(
            f"{path}.source.type", "file sources (Anthropic's Files API) are not supported: send base64 or url"
        )
    raise invalid(f"{path}.source.type", "Input should be 'base64' or 'url'")


def _refuse_block(kind: str, path: str) -> None:
    if kind in UNSUPPORTED_BLOCKS:
        raise invalid(path, UNSUPPORTED_BLOCKS[kind])
    raise invalid(
        f"{path}.type",
        f"content blocks of type '{kind}' are not supported by this model "
        "(supported: text, image, tool_use, tool_result, thinking)",
    )


def chat_tools(value: Any) -> list[dict[str, Any]]:
    """Client tools -> chat function tools. Server tools (any `type` but `custom`) -> 400 naming them all."""
    if value is None:
        return []
    tools: list[dict[str, Any]] = []
    server_tools: list[str] = []
    for i, tool in enumerate(_array(value, "tools")):
        path = f"tools.{i}"
        tool = _object(tool, path)
        kind = tool.get("type")
        if kind not in CLIENT_TOOL_TYPES:
            server_tools.append(f"{tool.get('name') or kind} ({kind})")
            continue
        function: dict[str, Any] = {"name": _string(_required(tool, "name", path), f"{path}.name")}
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"{path}.description")
        function["parameters"] = _object(_required(tool, "input_schema", path), f"{path}.input_schema")
        if tool.get("strict") is not None:
            function["strict"] = _boolean(tool["strict"], f"{path}.strict")
        tools.append({"type": "function", "function": function})
    if server_tools:
        raise invalid(
            "tools",
            "server tools run on Anthropic's servers and are not supported by this model: "
            + ", ".join(server_tools)
            + "; only client tools (name, description, input_schema) are",
        )
    return tools


def _tool_choice(value: Any, names: set[str]) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice -> (chat tool_choice, parallel_tool_calls or None)."""
    choice = _object(value, "tool_choice")
    kind = _required(choice, "type", "tool_choice")
    parallel: bool | None = None
    if choice.get("disable_parallel_tool_use") is not None:
        if _boolean(choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use"):
            parallel = False
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        name = _string(_required(choice, "name", "tool_choice"), "tool_choice.name")
        if names and name not in names:
            raise invalid("tool_choice.name", f"tool '{name}' is not among the request's tools")
        return {"type": "function", "function": {"name": name}}, parallel
    raise invalid("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """Structured outputs (`output_config.format`, or the older `output_format`) -> response_format."""
    path, fmt = "output_format", body.get("output_format")
    config = body.get("output_config")
    if config is not None and _object(config, "output_config").get("format") is not None:
        path, fmt = "output_config.format", config["format"]
    if fmt is None:
        return None
    fmt = _object(fmt, path)
    if fmt.get("type") != "json_schema":
        raise invalid(f"{path}.type", "Input should be 'json_schema'")
    schema = _object(_required(fmt, "schema", path), f"{path}.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


# --- answer: chat completion -> Messages ---------------------------------------------------


def to_message(chat: dict[str, Any], *, message_id: str, model: str) -> dict[str, Any]:
    """A chat completion (non-streamed, as a dict) -> Anthropic's `message` object:

        {"id", "type": "message", "role": "assistant", "model", "content": [text?, tool_use*],
         "stop_reason", "stop_sequence", "usage": {input_tokens, cache_creation_input_tokens,
         cache_read_input_tokens, output_tokens}}

    A tool call whose arguments are not a JSON object (a model's malformed output, or one cut
    off by max_tokens) gets `input: {}`; the raw text stays in the recorded chat completion
    and is not shown: an agent then runs the tool with no arguments, gets the tool's own
    error and retries, which is the loop agents already have.
    """
    choice = first_choice(chat)
    message = choice.get("message") or {}
    text = content_text(message.get("content"))
    refusal = message.get("refusal") if isinstance(message.get("refusal"), str) else ""
    content: list[dict[str, Any]] = []
    if text or refusal:
        content.append({"type": "text", "text": text or refusal})
    calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or fallback_tool_id(message_id, index),
                "name": function.get("name") or "",
                "input": tool_input(function.get("arguments")),
            }
        )
    stop_reason, stop_sequence = stop_reason_of(
        choice.get("finish_reason"), choice.get("stop_reason"), has_tool_calls=bool(calls), refused=bool(refusal)
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_of(chat.get("usage")),
    }


def first_choice(chat: dict[str, Any]) -> dict[str, Any]:
    """Choice 0 (a Messages request never asks for more), or {} when there is none."""
    for choice in chat.get("choices") or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return {}


def content_text(content: Any) -> str:
    """A chat message's content as text (a string, or the text of its content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def tool_input(arguments: Any) -> dict[str, Any]:
    """Chat `arguments` -> a tool_use `input`: the JSON object they hold, else {} (see to_message)."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments, parse_constant=_reject_constant)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's json accepts them, JSON does not


def fallback_tool_id(message_id: str, index: int) -> str:
    """An id for a tool call the upstream sent without one: unique per message and call."""
    return f"toolu_{message_id.removeprefix('msg_')}_{index}"


def stop_reason_of(
    finish_reason: Any, matched_stop: Any, *, has_tool_calls: bool, refused: bool = False
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from a chat choice's `finish_reason` and vLLM's `stop_reason`.

    vLLM names the stop string that ended generation in `stop_reason` (a token id, an int, for
    stop tokens, None for end of sequence); a string there is one of the request's
    `stop_sequences`. Other servers do not say, and a stop sequence then reads as `end_turn`.
    A call that stopped with tool calls is `tool_use` whatever the finish reason said (vLLM
    says `stop` when tool_choice named the tool), unless it ran out of tokens.
    """
    if finish_reason == "length":
        return "max_tokens", None
    if refused or finish_reason == "content_filter":
        return "refusal", None
    if has_tool_calls:
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched_stop, str):
        return "stop_sequence", matched_stop
    return "end_turn", None


def usage_of(usage: Any) -> dict[str, int]:
    """Chat usage -> Anthropic's: `input_tokens` counts the prompt tokens NOT read from cache
    (Anthropic's total input is input + cache_creation + cache_read), `cache_read_input_tokens`
    the prefix-cache hits the server reports (`prompt_tokens_details.cached_tokens`), and
    `cache_creation_input_tokens` is 0: there is no cache write to bill. Unknown counts are 0."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = min(_count(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": _count(usage.get("completion_tokens")),
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# --- count_tokens --------------------------------------------------------------------------


def count_tokens_text(body: dict[str, Any]) -> str:
    """The text a tokenizer would count for `POST /v1/messages/count_tokens`: the chat form the
    model would see (system, messages, tools), one line per piece:

        <role>\\n<text>                    per chat message (tool messages' text included)
        <name> <arguments>                 per tool call
        <name>\\n<description>\\n<JSON schema>  per tool

    Validates the body as `to_chat_request` does (except `max_tokens`, which count_tokens does
    not take). Images are not in the text: a tokenizer endpoint that takes the chat messages
    counts them better. Where there is no tokenizer, `estimate_tokens` turns the text into a
    count.
    """
    body = _object(body, "")
    lines: list[str] = []
    for message in chat_messages(body):
        lines.append(str(message["role"]))
        text = content_text(message.get("content"))
        if text:
            lines.append(text)
        for call in message.get("tool_calls") or []:
            lines.append(f"{call['function']['name']} {call['function']['arguments']}")
    for tool in chat_tools(body.get("tools")):
        function = tool["function"]
        lines.append(str(function["name"]))
        if function.get("description"):
            lines.append(str(function["description"]))
        lines.append(json.dumps(function["parameters"], ensure_ascii=False))
    return "\n".join(lines)


def estimate_tokens(text: str) -> int:
    """A token count without a tokenizer: one token per 4 UTF-8 bytes, rounded up.

    About what byte-pair tokenizers average on English prose and code; counting bytes rather
    than characters keeps CJK text (3 bytes a character, near one token each) from being
    counted at a quarter of its size. An estimate: chat template tokens are not counted.
    """
    return math.ceil(len(text.encode("utf-8")) / 4)


# --- validation, with Anthropic's field paths ----------------------------------------------


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _required(obj: dict[str, Any], name: str, path: str) -> Any:
    if name not in obj or obj[name] is None:
        raise invalid(_join(path, name), "Field required")
    return obj[name]


def _block_type(block: Any, path: str) -> str:
    block = _object(block, path)
    kind = _required(block, "type", path)
    return _string(kind, f"{path}.type")


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(path or "body", "Input should be a valid dictionary")
    return value


def _array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise invalid(path, "Input should be a valid list")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise invalid(path, "Input should be a valid string")
    return value


def _boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(path, "Input should be a valid boolean")
    return value


def _integer(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(path, "Input should be a valid integer")
    return value


def _number(value: Any, path: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(path, "Input should be a valid number")
    return value
