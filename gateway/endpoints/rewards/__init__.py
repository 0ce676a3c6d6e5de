"""POST /v1/rewards and the pending-reward report: wire types (protocol), HMAC checks
(signatures), policy rules (rules), the background linker (linker) and the routes."""
