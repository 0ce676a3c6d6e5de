"""Chat messages -> prompt token ids, rendered the one way the server and the trainer share.

Why one function for both: when a call's exact token ids were not recorded, the trainer
(grpo/tokens.py) recovers the answer's tokens by rendering the recorded chat with and without
the answer. Those are the tokens the model sampled only if the trainer renders exactly as the
server did: the same message shapes, the same template options, the text tokenized without
added special tokens (the template already wrote them; a second BOS would shift every
position). Any difference would train the adapter on tokens the model never saw.

The server (serving/serving_chat.py) mirrors vLLM's `OpenAIServingChat`, so this is also how a
vLLM endpoint renders a call.
"""

from __future__ import annotations

import json
from typing import Any


def messages_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI message shapes -> what HF chat templates expect (text parts joined, tool args as dicts)."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") in ("text", None)
            )
        elif content is None:
            message["content"] = ""
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [_tool_call_for_template(call) for call in calls]
        out.append(message)
    return out


def _tool_call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call whose JSON-string arguments are parsed: templates iterate over them as a dict."""
    call = dict(call)
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            pass
    call["function"] = function
    return call


def render_chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool, **template_options: Any
) -> list[int]:
    """The prompt's token ids: the chat template renders text, which is tokenized without added specials.

    `template_options` go to `apply_chat_template` as they are (`tools`, `chat_template`,
    `continue_final_message`, a request's `chat_template_kwargs`).
    """
    text = tokenizer.apply_chat_template(
        messages_for_template(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **template_options
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
