"""GET /v1/trajectories/{id} and the admin listing: wire types (protocol) and routes."""
