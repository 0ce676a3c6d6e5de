"""The store both sides share: engines (and the embedded PostgreSQL), the schema, the tables."""
