"""The paths GatewayApp serves itself, before FastAPI: the one list both the dispatch
(gateway/app.py) and the OpenAPI document (gateway/endpoints/openapi.py) read.

Each operation's paths, the `/v1` one first, then its alias without `/v1` (clients configured
with a base URL that lacks it). A new fast-path endpoint adds its paths here, its handler to
GatewayApp's table, and its declaration to openapi.py; the document refuses to build if a path
here has no declaration, so the third cannot be forgotten.
"""

from __future__ import annotations

CHAT_COMPLETIONS = ("/v1/chat/completions", "/chat/completions")
RESPONSES = ("/v1/responses", "/responses")
MESSAGES = ("/v1/messages", "/messages")
COUNT_TOKENS = ("/v1/messages/count_tokens", "/messages/count_tokens")
REWARDS = ("/v1/rewards",)  # POST only: GET (reading rewards) is FastAPI's route

SERVED_FIRST = (*CHAT_COMPLETIONS, *RESPONSES, *MESSAGES, *COUNT_TOKENS, *REWARDS)

# Paths that answer POST only: other methods (TRACE, GET, ...) get 405 naming it, as FastAPI's
# routes answer. Every operation without /v1, and Responses and Messages under /v1 too: neither
# protocol has another method on these paths, and forwarding one would answer the upstream's 404.
# GET /v1/chat/completions alone still goes to the upstream (OpenAI lists stored completions there),
# as any /v1 request FastAPI does not route; /v1/rewards has FastAPI's GET.
POST_ONLY = frozenset((*CHAT_COMPLETIONS, *RESPONSES, *MESSAGES, *COUNT_TOKENS)) - {"/v1/chat/completions"}
