"""OpenAI's Responses API in terms of chat completions, for models served by our own endpoints.

A policy's endpoints (vLLM, the local server) speak only chat completions. A Responses request
for a policy is translated to a chat request, runs through the chat pipeline (which records
the chat form with exact token ids, the form training reads), and the answer is translated
back. This module is that translation and nothing else: no I/O. Streams are in stream.py.

Request, Responses -> chat:

    model, temperature, top_p, user, metadata, stream    -> the same (stream adds
                                                            stream_options.include_usage: the
                                                            closing event carries usage)
    seed (not a Responses field; vLLM's)                 -> seed
    instructions                                         -> a leading system message
    input: "text"                                        -> {role: user, content: "text"}
    input: [items]                                       -> messages, in order:
      message {role, content: str | parts}                  {role, content}; developer -> system
        parts input_text, output_text, refusal                text parts (one part: a string)
        input_image {image_url, detail}                       {type: image_url, image_url: {url, detail}}
      function_call {call_id, name, arguments}              an assistant message's tool_calls:
                                                            consecutive calls, and calls right after
                                                            an assistant message, join one message
      function_call_output {call_id, output}                {role: tool, tool_call_id, content}
      reasoning                                             dropped (see below)
    tools: [{type: function, name, description,          -> [{type: function, function: {name,
             parameters, strict}]                             description, parameters, strict}}]
    tool_choice: auto | none | required                  -> the same
                 {type: function, name}                  -> {type: function, function: {name}}
                 {type: allowed_tools, mode, tools}      -> tools narrowed to those, choice = mode
    max_output_tokens                                    -> max_tokens
    parallel_tool_calls                                  -> the same (with tools only)
    text.format: json_schema {name, schema, ...}         -> response_format {type: json_schema,
                                                            json_schema: {name, schema, ...}}
                 json_object                             -> response_format {type: json_object}
    include: ["message.output_text.logprobs"],           -> logprobs: true, top_logprobs
    top_logprobs

Reasoning items have no place in a chat request: they are dropped from it (a policy's chat
template re-renders any reasoning it needs from the conversation), but stay in the native
request, which the endpoint records beside the chat form.

Dropped, being settings of OpenAI's own service with no chat counterpart: store,
previous_response_id (the caller resolves it into `previous`), include (other than logprobs),
reasoning, truncation, background (false), service_tier, prompt_cache_*, safety_identifier,
stream_options, max_tool_calls, context_management, moderation, image, access_programs.
Refused with 400: background=true, conversation and prompt (they need OpenAI's stores),
item_reference input items (they need a store of items), built-in tools and their tool
choices (the policy's endpoint runs function tools only), file and audio inputs. Fields that
are not Responses fields at all go to the upstream untouched, as the chat pipeline passes
fields it does not know (vLLM's top_k, min_p, chat_template_kwargs, ...).

Response, chat -> Responses (`to_response`): the answer message becomes output items, in
this order: a `reasoning` item (vLLM's reasoning_content), a `message` item (when there is
text, a refusal, or no tool call at all), one `function_call` item per tool call. Item ids
are derived from the response id (`output_item_id`), so a streamed answer and the same answer
not streamed name their items alike.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gateway.http.errors import GatewayError

LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20

# Responses request fields with no counterpart in a chat request: settings of OpenAI's service.
DROPPED_FIELDS = frozenset(
    {
        "access_programs",
        "background",  # true is refused before this applies
        "background_options",
        "context_management",
        "image",
        "include",  # its logprobs entry is translated
        "max_tool_calls",  # applies to built-in tools only
        "moderation",
        "previous_response_id",  # resolved by the caller into `previous`
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream_options",  # the Responses form (obfuscation); the chat form is set here
        "truncation",
    }
)
# Responses request fields that need OpenAI's stores: refused rather than silently ignored.
REFUSED_FIELDS = {
    "conversation": "conversations are not supported by this gateway; use previous_response_id or send the input",
    "prompt": "prompt templates are stored by OpenAI and are not supported by this gateway; send the input",
}
# Responses request fields translated (or passed under the same name) by to_chat_request.
TRANSLATED_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_logprobs",
        "parallel_tool_calls",
        "user",
        "metadata",
        "stream",
        "text",
        "seed",
    }
)
RESPONSES_FIELDS = DROPPED_FIELDS | REFUSED_FIELDS.keys() | TRANSLATED_FIELDS

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text")
_MISSING, _UNSUPPORTED = "missing_required_parameter", "unsupported_value"
_FUNCTION_TOOLS_ONLY = "this model is served by the policy's own endpoint, which runs function tools only"


# ---------------------------------------------------------------- errors and checks


def _invalid(message: str, param: str | None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def _string(value: Any, param: str, *, required: bool = True, non_empty: bool = True) -> str | None:
    if value is None:
        if required:
            raise _invalid(f"Missing required parameter: '{param}'.", param, _MISSING)
        return None
    if not isinstance(value, str):
        raise _invalid(f"Invalid type for '{param}': expected a string.", param, "invalid_type")
    if non_empty and not value:
        raise _invalid(f"Invalid '{param}': empty string.", param, "empty_string")
    return value


def _number(value: Any, param: str) -> float | int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _invalid(f"Invalid type for '{param}': expected a number.", param, "invalid_type")
    return value


def _integer(value: Any, param: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _invalid(f"Invalid type for '{param}': expected an integer.", param, "invalid_type")
    return value


def _boolean(value: Any, param: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise _invalid(f"Invalid type for '{param}': expected a boolean.", param, "invalid_type")
    return value


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    return value


def _array(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid(f"Invalid type for '{param}': expected an array.", param, "invalid_type")
    return value


# ---------------------------------------------------------------- request: Responses -> chat


def to_chat_request(body: dict[str, Any], previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Responses request -> the chat completions request body our endpoints answer.

    `previous`: the chat messages of the conversation so far when the request names a
    previous_response_id, given by the caller: build it with `continued_messages` from the
    previous call, which leaves that call's instructions out. Instructions apply to one call
    only (OpenAI does not carry them over from the previous response), so this call's become
    the leading system message, followed by `previous`, followed by this call's input.

    Raises GatewayError(400, message, param=..., code=...) for input that is invalid, or valid
    for OpenAI but not servable by a chat endpoint (see the module docstring).
    """
    body = _object(body, "body")
    model = _string(body.get("model"), "model")
    for field, reason in REFUSED_FIELDS.items():
        if body.get(field) is not None:
            raise _invalid(reason, field, "unsupported_parameter")
    if _boolean(body.get("background"), "background"):
        raise _invalid(
            "background responses are not supported by this gateway; omit background or set it to false",
            "background",
            _UNSUPPORTED,
        )

    _check_echoed(body)

    chat: dict[str, Any] = {"model": model}
    messages: list[dict[str, Any]] = []
    instructions = _string(body.get("instructions"), "instructions", required=False, non_empty=False)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    known_calls: set[str] = set()
    if previous:
        for message in previous:
            messages.append(dict(message))
            known_calls.update(
                call["id"] for call in message.get("tool_calls") or [] if isinstance(call, dict) and call.get("id")
            )
    messages.extend(_input_messages(body.get("input"), known_calls))
    if not messages:
        raise _invalid("Missing required parameter: 'input'.", "input", _MISSING)
    chat["messages"] = messages

    tools = _chat_tools(body.get("tools"))
    tool_choice, tools = _chat_tool_choice(body.get("tool_choice"), tools)
    if tools:
        chat["tools"] = tools
        if tool_choice is not None:
            chat["tool_choice"] = tool_choice
        parallel = _boolean(body.get("parallel_tool_calls"), "parallel_tool_calls")
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    else:
        _boolean(body.get("parallel_tool_calls"), "parallel_tool_calls")

    for field in ("temperature", "top_p"):
        if (value := _number(body.get(field), field)) is not None:
            chat[field] = value
    if (max_output := _integer(body.get("max_output_tokens"), "max_output_tokens")) is not None:
        if max_output < 1:
            raise _invalid("Invalid 'max_output_tokens': it must be at least 1.", "max_output_tokens")
        chat["max_tokens"] = max_output
    if (seed := _integer(body.get("seed"), "seed")) is not None:
        chat["seed"] = seed
    if (user := _string(body.get("user"), "user", required=False, non_empty=False)) is not None:
        chat["user"] = user
    if (metadata := body.get("metadata")) is not None:
        chat["metadata"] = _metadata(metadata)

    if logprobs_requested(body):
        chat["logprobs"] = True
    top_logprobs = _integer(body.get("top_logprobs"), "top_logprobs")
    if top_logprobs is not None:
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise _invalid(f"Invalid 'top_logprobs': it must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs")
        if top_logprobs:
            chat["logprobs"] = True
            chat["top_logprobs"] = top_logprobs
    if (response_format := _response_format(body.get("text"))) is not None:
        chat["response_format"] = response_format
    if _boolean(body.get("stream"), "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}

    # Fields that are not Responses fields go through, as the chat pipeline passes unknown fields.
    for field, value in body.items():
        if field not in RESPONSES_FIELDS and field not in chat:
            chat[field] = value
    return chat


def _check_echoed(body: dict[str, Any]) -> None:
    """Dropped fields the response echoes back must still have their types, or the response
    object (which the SDK validates) would not."""
    _string(body.get("previous_response_id"), "previous_response_id", required=False)
    _boolean(body.get("store"), "store")
    if body.get("reasoning") is not None:
        _object(body["reasoning"], "reasoning")
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise _invalid(
            f"Invalid 'truncation': {truncation!r}. Supported values are: 'auto' and 'disabled'.", "truncation"
        )


def logprobs_requested(body: dict[str, Any]) -> bool:
    """Whether the output text carries logprobs: `include` names them (OpenAI's rule)."""
    include = body.get("include")
    if include is None:
        return False
    include = _array(include, "include")
    for position, entry in enumerate(include):
        _string(entry, f"include[{position}]")
    return LOGPROBS_INCLUDE in include


def _metadata(value: Any) -> dict[str, str]:
    metadata = _object(value, "metadata")
    for key, entry in metadata.items():
        _string(entry, f"metadata.{key}", non_empty=False)
    return dict(metadata)


def _item_type(item: dict[str, Any], param: str) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # EasyInputMessage: {role, content} without a type
    return _string(kind, f"{param}.type") or ""


def _input_messages(value: Any, known_calls: set[str]) -> list[dict[str, Any]]:
    """The chat messages of a request's `input` (a string or a list of items)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    items = _array(value, "input")
    messages: list[dict[str, Any]] = []
    # The assistant message that function_call items join: the one an assistant message item or a
    # function_call item just made (reasoning items in between do not count: they are dropped).
    joinable: dict[str, Any] | None = None
    for position, item in enumerate(items):
        param = f"input[{position}]"
        item = _object(item, param)
        kind = _item_type(item, param)
        if kind == "reasoning":
            continue
        if kind == "message":
            message = _chat_message(item, param)
            messages.append(message)
            joinable = message if message["role"] == "assistant" else None
        elif kind == "function_call":
            call = _tool_call(item, param)
            if joinable is None:
                joinable = {"role": "assistant", "content": None}
                messages.append(joinable)
            joinable.setdefault("tool_calls", []).append(call)
            known_calls.add(call["id"])
        elif kind == "function_call_output":
            messages.append(_tool_message(item, param, known_calls))
            joinable = None
        elif kind == "item_reference":
            raise _invalid(
                f"{param}: item references are not supported by this gateway (they need a store of items); "
                "send the item itself",
                f"{param}.type",
                _UNSUPPORTED,
            )
        else:
            raise _invalid(
                f"{param}: items of type '{kind}' are not supported: {_FUNCTION_TOOLS_ONLY}",
                f"{param}.type",
                _UNSUPPORTED,
            )
    return messages


def _chat_message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = _string(item.get("role"), f"{param}.role")
    if role not in _ROLES:
        raise _invalid(
            f"Invalid '{param}.role': '{role}'. Supported values are: 'user', 'system', 'developer' and 'assistant'.",
            f"{param}.role",
        )
    chat_role = _ROLES[role]
    content = item.get("content")
    if isinstance(content, str):
        return {"role": chat_role, "content": content}
    parts = _array(content, f"{param}.content") if content is not None else None
    if parts is None:
        raise _invalid(f"Missing required parameter: '{param}.content'.", f"{param}.content", _MISSING)
    chat_parts = [_chat_part(part, chat_role, f"{param}.content[{index}]") for index, part in enumerate(parts)]
    return {"role": chat_role, "content": _collapse(chat_parts)}


def _chat_part(part: Any, role: str, param: str) -> dict[str, Any]:
    part = _object(part, param)
    kind = _string(part.get("type"), f"{param}.type")
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": _string(part.get("text"), f"{param}.text", non_empty=False)}
    if kind == "refusal":  # a refusal replayed from an answer: what the model said
        return {"type": "text", "text": _string(part.get("refusal"), f"{param}.refusal", non_empty=False)}
    if kind == "input_image":
        if role != "user":
            raise _invalid(f"{param}: images are allowed in user messages only", f"{param}.type")
        if part.get("file_id") is not None:
            raise _invalid(
                f"{param}: images by file_id are not supported by this gateway; send image_url (a URL or data URL)",
                f"{param}.file_id",
                "unsupported_parameter",
            )
        image: dict[str, Any] = {"url": _string(part.get("image_url"), f"{param}.image_url")}
        detail = _string(part.get("detail"), f"{param}.detail", required=False)
        if detail is not None:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    raise _invalid(
        f"{param}: content of type '{kind}' is not supported by the policy's endpoint "
        "(text and images only; files and audio are not)",
        f"{param}.type",
        _UNSUPPORTED,
    )


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part as a plain string, as chat clients send it and chat templates expect."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    if not parts:
        return ""
    return parts


def _tool_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    return {
        "id": _string(item.get("call_id"), f"{param}.call_id"),
        "type": "function",
        "function": {
            "name": _string(item.get("name"), f"{param}.name"),
            "arguments": _string(item.get("arguments"), f"{param}.arguments", non_empty=False),
        },
    }


def _tool_message(item: dict[str, Any], param: str, known_calls: set[str]) -> dict[str, Any]:
    call_id = _string(item.get("call_id"), f"{param}.call_id") or ""
    if call_id not in known_calls:
        raise _invalid(f"No tool call found for function call output with call_id {call_id}.", f"{param}.call_id")
    output = item.get("output")
    if isinstance(output, str):
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    parts = _array(output, f"{param}.output") if output is not None else None
    if parts is None:
        raise _invalid(f"Missing required parameter: '{param}.output'.", f"{param}.output", _MISSING)
    texts = []
    for index, part in enumerate(parts):
        part_param = f"{param}.output[{index}]"
        part = _object(part, part_param)
        if part.get("type") not in _TEXT_PARTS:
            raise _invalid(
                f"{part_param}: a chat tool message carries text only; '{part.get('type')}' is not supported",
                f"{part_param}.type",
                _UNSUPPORTED,
            )
        texts.append({"type": "text", "text": _string(part.get("text"), f"{part_param}.text", non_empty=False)})
    return {"role": "tool", "tool_call_id": call_id, "content": _collapse(texts)}


def _chat_tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    tools = []
    for position, tool in enumerate(_array(value, "tools")):
        param = f"tools[{position}]"
        tool = _object(tool, param)
        kind = _string(tool.get("type"), f"{param}.type")
        if kind != "function":
            raise _invalid(
                f"{param}: '{kind}' is a built-in tool of OpenAI's Responses API; {_FUNCTION_TOOLS_ONLY} "
                "(type 'function')",
                f"{param}.type",
                _UNSUPPORTED,
            )
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{param}.name")}
        if (description := _string(tool.get("description"), f"{param}.description", required=False)) is not None:
            function["description"] = description
        if tool.get("parameters") is not None:
            function["parameters"] = _object(tool["parameters"], f"{param}.parameters")
        if (strict := _boolean(tool.get("strict"), f"{param}.strict")) is not None:
            function["strict"] = strict
        tools.append({"type": "function", "function": function})
    return tools


def _chat_tool_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """The chat tool_choice, and the tools the chat request offers (allowed_tools narrows them)."""
    names = [tool["function"]["name"] for tool in tools]
    if value is None:
        return None, tools
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _invalid(
                f"Invalid 'tool_choice': '{value}'. Supported values are: 'none', 'auto' and 'required'.", "tool_choice"
            )
        if value == "required" and not tools:
            raise _invalid("tool_choice 'required' needs at least one tool in 'tools'.", "tool_choice")
        return value, tools
    choice = _object(value, "tool_choice")
    kind = _string(choice.get("type"), "tool_choice.type")
    if kind == "function":
        name = _string(choice.get("name"), "tool_choice.name")
        if name not in names:
            raise _invalid(f"Tool choice '{name}' not found in 'tools' parameter.", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, tools
    if kind == "allowed_tools":
        mode = choice.get("mode")
        if mode not in ("auto", "required"):
            raise _invalid("Invalid 'tool_choice.mode': it must be 'auto' or 'required'.", "tool_choice.mode")
        allowed: set[str] = set()
        for position, entry in enumerate(_array(choice.get("tools"), "tool_choice.tools")):
            param = f"tool_choice.tools[{position}]"
            entry = _object(entry, param)
            if entry.get("type") != "function":
                raise _invalid(f"{param}: {_FUNCTION_TOOLS_ONLY}", f"{param}.type", _UNSUPPORTED)
            name = _string(entry.get("name"), f"{param}.name") or ""
            if name not in names:
                raise _invalid(f"Tool '{name}' not found in 'tools' parameter.", f"{param}.name")
            allowed.add(name)
        return mode, [tool for tool in tools if tool["function"]["name"] in allowed]
    message = f"tool_choice of type '{kind}' is not supported: {_FUNCTION_TOOLS_ONLY}"
    raise _invalid(message, "tool_choice.type", _UNSUPPORTED)


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    text = _object(value, "text")
    if text.get("format") is None:
        return None
    fmt = _object(text["format"], "text.format")
    kind = _string(fmt.get("type"), "text.format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: dict[str, Any] = {
            "name": _string(fmt.get("name"), "text.format.name"),
            "schema": _object(fmt.get("schema"), "text.format.schema"),
        }
        if (description := _string(fmt.get("description"), "text.format.description", required=False)) is not None:
            schema["description"] = description
        if (strict := _boolean(fmt.get("strict"), "text.format.strict")) is not None:
            schema["strict"] = strict
        return {"type": "json_schema", "json_schema": schema}
    raise _invalid(
        f"Invalid 'text.format.type': '{kind}'. Supported values are: 'text', 'json_schema' and 'json_object'.",
        "text.format.type",
    )


# ---------------------------------------------------------------- the conversation a later call continues


def answer_message(chat: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a chat answer as a later request carries it: role, content and
    tool calls (what a client replaying the output items would send, and what stitching hashes)."""
    choices = chat.get("choices") or [{}]
    message = choices[0].get("message") or {}
    answer: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        answer["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in message["tool_calls"]
        ]
    return answer


def continued_messages(
    request: dict[str, Any], chat_request: dict[str, Any], chat: dict[str, Any]
) -> list[dict[str, Any]]:
    """What a later call naming this response as previous_response_id continues: this call's
    chat messages without its instructions (they apply to this call only) and its answer.

    `request` is this call's Responses request, `chat_request` what to_chat_request made of it,
    `chat` the chat answer. Store this with the response; pass it as `previous`.
    """
    messages = list(chat_request.get("messages") or [])
    if request.get("instructions"):
        messages = messages[1:]
    return [*messages, answer_message(chat)]


# ---------------------------------------------------------------- response: chat -> Responses


def output_item_id(prefix: str, response_id: str, *parts: object) -> str:
    """A deterministic item id: `msg_`, `rs_`, `fc_` + 32 hex digits of the response id and parts."""
    seed = "\x00".join([response_id, prefix, *(str(part) for part in parts)])
    return f"{prefix}_{hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()}"


def message_id(response_id: str) -> str:
    return output_item_id("msg", response_id)


def reasoning_id(response_id: str) -> str:
    return output_item_id("rs", response_id)


def function_call_id(response_id: str, index: int) -> str:
    """The item id of the chat answer's tool call number `index` (the chunks' `index`)."""
    return output_item_id("fc", response_id, index)


def fallback_call_id(response_id: str, index: int) -> str:
    """The call id of a tool call the upstream named none for (OpenAI's always have one)."""
    return output_item_id("call", response_id, index)


def output_text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """{type: output_text, text, annotations: [], logprobs: [...]} (an empty list unless asked)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """{id, type: message, role: assistant, status, content: [output_text | refusal parts]}."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    """{id, type: reasoning, summary: [], content: [reasoning_text]}: the model's raw reasoning.

    Chat answers have no summaries; `content` holds the reasoning as vLLM parsed it out."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """{id, type: function_call, status, call_id (the chat tool call id), name, arguments}."""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def final_status(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) of a response whose answer finished for `finish_reason`."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


def item_status(position: int, count: int, status: str) -> str:
    """An item is cut short when the response is and it is the last one; the others completed."""
    return "incomplete" if status == "incomplete" and position == count - 1 else "completed"


def set_item_statuses(output: list[dict[str, Any]], status: str) -> None:
    """Reasoning items carry no status (as OpenAI's); messages and function calls do."""
    for position, item in enumerate(output):
        if item["type"] != "reasoning":
            item["status"] = item_status(position, len(output), status)


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage -> {input_tokens, input_tokens_details, output_tokens, output_tokens_details,
    total_tokens}; details the upstream does not give are 0 (`cache_write_tokens` is required by
    the SDK's model)."""
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": int(prompt_details.get("cached_tokens") or 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(completion_details.get("reasoning_tokens") or 0)},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def response_object(
    *,
    response_id: str,
    request: dict[str, Any],
    created_at: float,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
    completed_at: float | None = None,
) -> dict[str, Any]:
    """The `response` object: the request's settings echoed as OpenAI echoes them, and the output.

    Sampling settings the request left out are null: the policy's endpoint applies its own
    defaults (vLLM: the model's generation config), which the gateway does not know."""
    text = dict(request.get("text") or {})
    if text.get("format") is None:
        text["format"] = {"type": "text"}
    parallel = request.get("parallel_tool_calls")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": request.get("model"),
        "output": output,
        "parallel_tool_calls": True if parallel is None else parallel,
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": request.get("reasoning"),
        "temperature": request.get("temperature"),
        "text": text,
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_logprobs": request.get("top_logprobs"),
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation") or "disabled",
        "usage": usage,
        "user": request.get("user"),
    }


def output_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat choice's logprobs in the Responses shape ({token, bytes, logprob, top_logprobs})."""
    return [responses_logprob(entry) for entry in ((choice.get("logprobs") or {}).get("content") or [])]


def responses_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    def one(value: dict[str, Any]) -> dict[str, Any]:
        token = str(value.get("token", ""))
        raw = value.get("bytes")
        return {
            "token": token,
            "bytes": list(raw) if raw is not None else list(token.encode()),
            "logprob": float(value.get("logprob", 0.0)),
        }

    return {**one(entry), "top_logprobs": [one(top) for top in entry.get("top_logprobs") or []]}


def reasoning_text(message: dict[str, Any]) -> str | None:
    """vLLM's parsed reasoning: `reasoning_content`, or `reasoning` in newer versions."""
    text = message.get("reasoning_content") or message.get("reasoning")
    return text if isinstance(text, str) and text else None


def to_response(
    chat: dict[str, Any],
    *,
    response_id: str,
    request: dict[str, Any],
    created_at: float,
    completed_at: float | None = None,
) -> dict[str, Any]:
    """A chat completion (non-streamed answer, as a dict) -> the Responses `response` object.

    Only the first choice is read (a Responses request asks for one). `completed_at` is left
    null unless given: the caller knows when the answer ended, this function does not.
    """
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    status, reason = final_status(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    if (reasoning := reasoning_text(message)) is not None:
        output.append(reasoning_item(reasoning_id(response_id), reasoning))
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(_texts(content))
    refusal = message.get("refusal") or ""
    calls = message.get("tool_calls") or []
    if text or refusal or not calls:
        parts = []
        if text or not refusal:
            logprobs = output_logprobs(choice) if logprobs_requested(request) else None
            parts.append(output_text_part(text, logprobs))
        if refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(message_item(message_id(response_id), parts, "completed"))
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        output.append(
            function_call_item(
                function_call_id(response_id, index),
                call.get("id") or fallback_call_id(response_id, index),
                function.get("name") or "",
                function.get("arguments") or "",
                "completed",
            )
        )
    set_item_statuses(output, status)
    return response_object(
        response_id=response_id,
        request=request,
        created_at=created_at,
        status=status,
        output=output,
        usage=response_usage(chat.get("usage")),
        incomplete_reason=reason,
        completed_at=completed_at if status == "completed" else None,
    )


def _texts(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    return [str(part.get("text") or "") for part in content if isinstance(part, dict) and part.get("type") == "text"]


# ---------------------------------------------------------------- input items


def input_items(body: dict[str, Any], *, response_id: str | None = None) -> list[dict[str, Any]]:
    """The request's input as Responses input items with ids (GET /v1/responses/{id}/input_items).

    In input order (the list endpoint's default `order=desc` is the caller's to apply). Items
    keep the ids they came with; the others get ids derived from `response_id` (or, without
    one, from the input itself) and their position, so the same stored request lists the same
    ids every time. Instructions and the previous response's items are not input items (as at
    OpenAI). Expects a request to_chat_request accepted.
    """
    raw = body.get("input")
    if raw is None:
        return []
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    seed = response_id or "input:" + hashlib.blake2b(orjson.dumps(raw), digest_size=16).hexdigest()
    listed = []
    for position, item in enumerate(items):
        kind = "message" if item.get("type") is None and "role" in item else item.get("type")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
        item_id = item.get("id") or output_item_id(prefix.get(kind, "item"), seed, "input", position)
        if kind == "message":
            listed.append(_input_message_item(item, item_id))
        elif kind == "function_call":
            listed.append(
                {
                    "id": item_id,
                    "type": "function_call",
                    "status": item.get("status") or "completed",
                    "call_id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": item.get("arguments"),
                }
            )
        elif kind == "function_call_output":
            listed.append(
                {
                    "id": item_id,
                    "type": "function_call_output",
                    "status": item.get("status") or "completed",
                    "call_id": item.get("call_id"),
                    "output": item.get("output"),
                }
            )
        elif kind == "reasoning":
            listed.append({**item, "id": item_id, "summary": item.get("summary") or []})
        else:
            listed.append({**item, "id": item_id})
    return listed


def _input_message_item(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    role = item.get("role")
    content = item.get("content")
    parts: list[Any] = [{"type": "input_text", "text": content}] if isinstance(content, str) else list(content or [])
    if role == "assistant":
        normalized = [
            output_text_part(str(part.get("text") or ""), None) if part.get("type") in _TEXT_PARTS else {**part}
            for part in parts
        ]
        return message_item(item_id, normalized, item.get("status") or "completed")
    inputs = []
    for part in parts:
        if part.get("type") in _TEXT_PARTS:
            inputs.append({"type": "input_text", "text": part.get("text")})
        elif part.get("type") == "input_image":
            inputs.append({"detail": "auto", **part})
        else:
            inputs.append(dict(part))
    status = item.get("status") or "completed"
    return {"id": item_id, "type": "message", "role": role, "status": status, "content": inputs}
