"""OpenTelemetry traces of the gateway's calls and rewards (docs/tracing.md).

`exporter.CallTracer` takes every journaled call (and every reward stored through the rewards
API) into a bounded queue on the hot path and exports spans from a background worker; `spans`
turns them into OpenTelemetry spans and is the only module that imports the SDK, loaded when
tracing is configured. Without a `tracing` section nothing here touches OpenTelemetry.
"""
