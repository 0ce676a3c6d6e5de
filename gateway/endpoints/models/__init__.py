"""GET /v1/models: served by gateway/endpoints/operations.py; its wire types (protocol) document it."""
