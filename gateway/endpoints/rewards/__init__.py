"""POST /v1/rewards and the pending-reward report: wire types (protocol), reading a request (intake) and
the routes. The reward rules, webhook signatures and the background linker are domain logic and live in
gateway/rewards/."""
