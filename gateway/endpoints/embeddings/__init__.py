"""POST /v1/embeddings: forwarded by gateway/endpoints/passthrough.py; its wire types (protocol) document it."""
