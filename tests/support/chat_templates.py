"""Chat templates for token tests: SmolLM2's own template ignores tools, these render them."""

from __future__ import annotations

# A ChatML template that renders tool calls and tool results (SmolLM2's own ignores tools).
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>{{ c['function']['name'] }}"
    "({{ c['function']['arguments'] | tojson }})</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
