"""Prometheus metrics. With several workers, PROMETHEUS_MULTIPROC_DIR is set before import
(see gateway/commands/serve.py) and /metrics aggregates every worker's files."""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter(
    "apprentice_requests_total", "Requests answered, by endpoint and status class", ["endpoint", "status"]
)
LATENCY = Histogram(
    "apprentice_request_latency_seconds",
    "Time from request to last byte",
    ["endpoint", "stream"],
    buckets=LATENCY_BUCKETS,
)
TTFT = Histogram(
    "apprentice_time_to_first_token_seconds", "Time from request to the first streamed byte", buckets=LATENCY_BUCKETS
)
UPSTREAM_ERRORS = Counter(
    "apprentice_upstream_errors_total", "Upstream failures and error answers", ["upstream", "kind"]
)
# Each process ships its own journal: the backlog is the sum over the live processes ("max" let
# a dead or idle worker's last value stand for all of them).
JOURNAL_BACKLOG = Gauge(
    "apprentice_journal_backlog_bytes",
    "Journal bytes not yet shipped to PostgreSQL, all live gateway processes together",
    multiprocess_mode="livesum",
)
SHIPPED = Counter("apprentice_shipped_calls_total", "Calls shipped from the journal into PostgreSQL")
SHIP_FAILURES = Counter("apprentice_ship_failures_total", "Failed attempts to ship a journal batch")
SHIP_REJECTED = Counter(
    "apprentice_ship_rejected_calls_total", "Journal records PostgreSQL refused as data, set aside under rejected/"
)
JOURNALED = Counter("apprentice_journaled_calls_total", "Calls written to the local journal")

# gateway/heap.py: objects frozen out of the garbage collector's full passes at start-up ("livemin":
# a live process that has not frozen yet shows 0; a dead one's last value is left out).
GC_FROZEN_OBJECTS = Gauge(
    "apprentice_gc_frozen_objects",
    "Objects of the start-up heap that the garbage collector's passes skip (gc.freeze), least of the live processes",
    multiprocess_mode="livemin",
)

# OpenTelemetry traces (gateway/tracing): spans of calls and rewards, counted as they leave the queue.
TRACING_EXPORTED = Counter("apprentice_tracing_exported_total", "Spans accepted by the OTLP collector")
TRACING_FAILED = Counter(
    "apprentice_tracing_failed_total", "Spans in export requests the OTLP collector did not accept (not retried)"
)
TRACING_DROPPED = Counter(
    "apprentice_tracing_dropped_total",
    "Spans dropped before export: the tracing queue was full, or still held at shutdown",
)

# Background workers (gateway/workers.py). The last success is a timestamp, not "seconds since":
# in multiprocess mode a value is only what a process last wrote, so an age would freeze when
# the worker stops succeeding; `time() - apprentice_worker_last_success_timestamp_seconds` stays
# right. "min" across processes shows the most stale one (0: a process has not succeeded yet).
WORKER_FAILURES = Counter("apprentice_worker_failures_total", "Failed steps of a background worker", ["worker"])
WORKER_CONSECUTIVE_FAILURES = Gauge(
    "apprentice_worker_consecutive_failures",
    "Failed steps in a row of a background worker (worst process)",
    ["worker"],
    multiprocess_mode="max",
)
WORKER_LAST_SUCCESS = Gauge(
    "apprentice_worker_last_success_timestamp_seconds",
    "Unix time of a background worker's last successful step (most stale process)",
    ["worker"],
    multiprocess_mode="min",
)

# Endpoints given as a DNS name (apprentice/discovery, gateway/upstreams/discovery.py).
ENDPOINT_LOOKUP_FAILURES = Counter(
    "apprentice_endpoint_lookup_failures_total",
    "DNS lookups of policy endpoints that failed or found no address (the last known set was kept)",
    ["name"],
)
POLICY_ENDPOINTS = Gauge(
    "apprentice_policy_endpoints",
    "Inference endpoints a policy's calls are sent to now (fixed and resolved)",
    ["policy"],
    multiprocess_mode="livemostrecent",
)


# The partitioned history (gateway/history_maintenance.py, apprentice/store/history.py): counted by the
# process that did the work; the partitions gauge is the latest count any process saw.
HISTORY_PARTITIONS_CREATED = Counter("apprentice_history_partitions_created_total", "Partitions of calls created ahead")
HISTORY_PARTITIONS_DROPPED = Counter(
    "apprentice_history_partitions_dropped_total", "Partitions of calls dropped by retention"
)
HISTORY_CALLS_DROPPED = Counter(
    "apprentice_history_calls_dropped_total", "Calls dropped by retention (whole partitions and old DEFAULT rows)"
)
HISTORY_CALLS_KEPT = Counter(
    "apprentice_history_calls_kept_total",
    "Calls of dropped partitions kept because untrained or serving-lineage trajectories need them",
)
HISTORY_PARTITIONS = Gauge(
    "apprentice_history_partitions", "Range partitions of calls (the DEFAULT one not counted)", multiprocess_mode="max"
)

# The LLM judge (gateway/judging). The budget gauge is each live process's latest view
# ("livemostrecent": a dead process's stale value never wins); the budget itself is counted
# in PostgreSQL across processes.
JUDGE_CALLS = Counter(
    "apprentice_judge_calls_total", "Judge calls by outcome (valid, invalid answer, error)", ["policy", "outcome"]
)
JUDGE_TOKENS = Counter("apprentice_judge_tokens_total", "Tokens of judge calls", ["policy", "kind"])
JUDGE_GROUPS = Counter("apprentice_judge_groups_total", "Group chunks judged or failed", ["policy", "outcome"])
JUDGE_BUDGET_EXHAUSTED = Gauge(
    "apprentice_judge_budget_exhausted",
    "1 while a policy's judge waits for its hourly budget, else 0",
    ["policy"],
    multiprocess_mode="livemostrecent",
)
JUDGE_GROUPS_READY = Gauge(
    "apprentice_judge_groups_ready",
    "Group chunks ready to judge at the last look (not yet judged)",
    ["policy"],
    multiprocess_mode="livemostrecent",
)

# Exploration samples (gateway/exploration): extra unserved answers from the lineage head. The
# tokens counter is the spend; the gauge is each live process's last hour (budgets are per process).
EXPLORATION_CALLS = Counter(
    "apprentice_exploration_calls_total",
    "Policy calls offered to exploration: queued, queue_full, or skipped_<reason>",
    ["policy", "outcome"],
)
EXPLORATION_REQUESTS = Counter(
    "apprentice_exploration_requests_total",
    "Exploration requests by outcome (recorded, over_budget, abandoned, adapter_missing, ...)",
    ["policy", "outcome"],
)
EXPLORATION_ANSWERS = Counter("apprentice_exploration_answers_total", "Unserved answers recorded", ["policy"])
EXPLORATION_TOKENS = Counter(
    "apprentice_exploration_tokens_total", "Tokens generated for exploration (its spend)", ["policy"]
)
EXPLORATION_BUDGET_USED = Gauge(
    "apprentice_exploration_budget_used_tokens",
    "Exploration tokens reserved or generated in the last hour, all live gateway processes together",
    ["policy"],
    multiprocess_mode="livesum",
)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
