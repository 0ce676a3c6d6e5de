"""Reward domain logic, apart from HTTP: what a policy accepts (rules), signed webhook deliveries
(signatures) and the background task that links rewards which arrived before their trajectory (linker).
The routes of /v1/rewards live in gateway/endpoints/rewards/ and only call into this package."""
