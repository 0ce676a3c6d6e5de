"""The dashboard's pages with a large history: every page under 300 ms (issue 14).

Creates a scratch database at the current schema, fills it in SQL (generate_series, no rows
sent from Python) with a realistic large history, starts a real gateway on it, logs in to /ui
with the admin key (the login form's CSRF token and cookie, as a browser does) and times every
page and every `/ui/data/...` endpoint over real HTTP:

- 1,000,000 calls in 250,000 trajectories of 4 calls (two months, four policies and model-only
  traffic, five tenants), each call with chat-completions JSONB request and answer of a few
  hundred bytes (growing with the conversation; tool calls and tool results in a third of one
  policy's runs and half of another's);
- rewards for 85 % of the trajectories (some superseded by a later one), a judge's scores with
  their `judgements` rows for one policy's groups, rewards still pending (most of them overdue),
  rejected ones;
- 10,000 adapter versions of one policy (a chain: each trained from the one before), a few
  hundred of two others, each with its training run (and some failed runs) and its transitions;
  a promoted version, a canary that superseded two lineage versions, candidates; policy_state
  rows (one policy paused) and API keys.

Each page is requested `--repeats` times (after `--warmups`), the pages interleaved round by
round so that the noise of a shared machine falls on all of them alike; p50 and p95 per page.

    python -m bench.dashboard_pages            # about 3 minutes; writes docs/benchmarks.md
    python -m bench.dashboard_pages --quick    # 100,000 calls / 1,000 versions; writes nothing
    python -m bench.dashboard_pages --keep     # leave the database (then --reuse measures it again)
    python -m bench.dashboard_pages --json out.json [--baseline before.json]

`--baseline` takes the `--json` of an earlier run (e.g. before the indexes and queries of this
change) and adds its figures beside the new ones.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

import httpx

from apprentice.processes import ManagedProcess
from bench import harness
from bench.harness import (
    bench_env,
    database_url,
    drop_database,
    log,
    pg_connect,
    recreate_database,
)
from bench.report import machine_line, markdown_table, write_section
from bench.stats import percentile

TITLE = "Dashboard pages with a large history"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "apprentice_bench_dashboard"
ADMIN_KEY = "sk-bench-dashboard-admin-key"
HOST = "127.0.0.1"
BUDGET_MS = 300.0
SPAN_DAYS = 60
CALLS_PER_TRAJECTORY = 4
MAIN = "support-agent"
TENANTS = ["acme", "globex", "initech", "umbrella", "hooli"]


@dataclass(frozen=True)
class Sizes:
    trajectories: int
    main_versions: int  # the policy whose versions form one long chain
    sql_versions: int
    triage_versions: int
    keys: int
    pending: int
    rejected: int

    @property
    def calls(self) -> int:
        return self.trajectories * CALLS_PER_TRAJECTORY

    @property
    def versions(self) -> int:
        return self.main_versions + self.sql_versions + self.triage_versions


FULL = Sizes(250_000, 10_000, 400, 100, 200, 3_000, 500)
QUICK = Sizes(25_000, 1_000, 40, 10, 50, 300, 50)

# name, versions attribute of Sizes, how its newest versions stand:
# "canary": promoted v(n-4), candidates v(n-3) and v(n-2) (canaries superseded), canary v(n-1), candidate v(n);
# "promoted": promoted v(n); "candidate": promoted v(n-1), candidate v(n) (its gates failed).
POLICIES = [
    (MAIN, "main_versions", "canary"),
    ("sql-agent", "sql_versions", "promoted"),
    ("triage", "triage_versions", "candidate"),
    ("summarizer", None, "none"),  # no versions yet: the base model serves; learning paused
]
TAIL = {"canary": 5, "promoted": 1, "candidate": 2, "none": 0}


def policy_rows(sizes: Sizes) -> str:
    """The policies as a VALUES list: (policy, versions, kind, regular versions, share of traffic slots)."""
    rows = []
    for name, attribute, kind in POLICIES:
        count = getattr(sizes, attribute) if attribute else 0
        rows.append(f"('{name}', {count}, '{kind}', {max(count - TAIL[kind], 0)})")
    return ", ".join(rows)


# --------------------------------------------------------------------------- generation
#
# Trajectory n (1..T) ends at ANCHOR - 60 days + (n - 1 + jitter) / T * 60 days, so n orders time.
# Slot s = (n - 1) mod 20 decides what it is: 0-10 support-agent, 11-14 sql-agent (one group of 4
# per block of 20, as GRPO groups), 15-16 triage, 17 summarizer, 18-19 a model without a policy.
# Regular versions (all but a policy's newest few) each served one equal slice of the first 58
# days; the promoted version serves the last 2 days, the canaries (a fifth of the traffic) the
# last day. Every id is md5 of a readable key, so related rows find each other without joins.

FUNCTIONS = [
    """
CREATE FUNCTION pg_temp.question(n int, policy text) RETURNS text STABLE LANGUAGE sql AS $$
SELECT (ARRAY[
  'My order has not arrived yet and the tracking page shows nothing since Monday. What can I do?',
  'How do I change the delivery address on an order I placed this morning?',
  'I was charged twice for the same subscription this month. Can you refund one of the charges?',
  'Which plan includes priority support and how much does it cost per seat per month?',
  'The app logs me out every few minutes on my phone. Is this a known problem?',
  'Can you list the customers in Germany who ordered more than three times last quarter?',
  'What is the average basket value per region for the last 30 days, highest first?',
  'Please summarise the attached ticket thread and tell me what the customer wants.'
])[1 + mod(n * 7 + length(policy), 8)] || ' (ref ' || n || ')'
$$""",
    """
CREATE FUNCTION pg_temp.system_prompt(policy text) RETURNS text STABLE LANGUAGE sql AS $$
SELECT CASE policy
  WHEN 'support-agent' THEN 'You are the support assistant of an online shop. Be brief and friendly. '
    || 'Use the tools to look up orders; never invent order details.'
  WHEN 'sql-agent' THEN 'You translate questions about the sales database into SQL, run them with the '
    || 'run_sql tool and answer with the figures.'
  WHEN 'triage' THEN 'Classify the ticket: billing, delivery, account or other; give a priority from 1 to 4.'
  ELSE 'You are a helpful assistant.' END
$$""",
    """
CREATE FUNCTION pg_temp.tool_name(policy text) RETURNS text STABLE LANGUAGE sql AS $$
SELECT CASE policy WHEN 'sql-agent' THEN 'run_sql' ELSE 'lookup_order' END
$$""",
    """
CREATE FUNCTION pg_temp.tools(policy text) RETURNS jsonb STABLE LANGUAGE sql AS $$
SELECT jsonb_build_array(jsonb_build_object('type', 'function', 'function', jsonb_build_object(
  'name', pg_temp.tool_name(policy),
  'description', CASE policy WHEN 'sql-agent' THEN 'Run a read-only SQL query.' ELSE 'An order by its id.' END,
  'parameters', jsonb_build_object('type', 'object', 'properties', jsonb_build_object(
     CASE policy WHEN 'sql-agent' THEN 'query' ELSE 'order_id' END, jsonb_build_object('type', 'string'))))))
$$""",
    # The assistant's answer in call k of trajectory n: a tool call in the first call of a tool run.
    """
CREATE FUNCTION pg_temp.answer(n int, k int, tools boolean, policy text) RETURNS jsonb STABLE LANGUAGE sql AS $$
SELECT CASE WHEN tools AND k = 1 THEN jsonb_build_object('role', 'assistant', 'content', NULL,
  'tool_calls', jsonb_build_array(jsonb_build_object('id', 'call_' || n, 'type', 'function',
    'function', jsonb_build_object('name', pg_temp.tool_name(policy), 'arguments',
      CASE policy WHEN 'sql-agent' THEN '{"query": "SELECT region, avg(total) FROM orders GROUP BY region"}'
      ELSE '{"order_id": "A' || (100000 + n) || '"}' END))))
ELSE jsonb_build_object('role', 'assistant', 'content',
  (ARRAY['I checked this for you: ', 'Thanks for waiting. ', 'Here is what I found: ', 'Sure. '])[1 + mod(n + k, 4)]
  || (ARRAY['the parcel left our warehouse on Tuesday and should arrive within two working days.',
            'you can change it under Orders > Details until the order ships.',
            'the second charge was a pre-authorisation and disappears within five days.',
            'the figures are in the table below, highest first.'])[1 + mod(n * 3 + k, 4)]) END
$$""",
    # What follows the answer of call k in the next call's request: the tool's result, or the user.
    """
CREATE FUNCTION pg_temp.turn(n int, k int, tools boolean, policy text) RETURNS jsonb STABLE LANGUAGE sql AS $$
SELECT jsonb_build_array(pg_temp.answer(n, k, tools, policy),
  CASE WHEN tools AND k = 1 THEN jsonb_build_object('role', 'tool', 'tool_call_id', 'call_' || n, 'content',
    CASE policy WHEN 'sql-agent' THEN '[{"region": "EU", "avg": 81.2}, {"region": "US", "avg": 77.9}]'
    ELSE '{"status": "shipped", "carrier": "DHL", "eta_days": 2}' END)
  ELSE jsonb_build_object('role', 'user', 'content',
    (ARRAY['Thanks. And what if it does not arrive by Friday?', 'Can you do that for me now?',
           'OK, and is there anything else I need to do?', 'Great, please also send me a summary by email.'])
    [1 + mod(n + k * 5, 4)]) END)
$$""",
]

STAGING = [
    (
        "versions (staging)",
        """
CREATE UNLOGGED TABLE bench_versions AS
SELECT p.policy, p.nv, p.kind, p.nreg, v,
       md5('v-' || p.policy || '-' || v)::uuid AS id,
       md5('r-' || p.policy || '-' || v)::uuid AS run_id,
       CASE WHEN v > 1 THEN md5('v-' || p.policy || '-' || (v - 1))::uuid END AS parent_id,
       CASE WHEN v <= p.nreg THEN (CASE WHEN mod(v, 4) = 0 THEN 'rejected' ELSE 'retired' END)
            WHEN p.kind = 'canary' THEN (ARRAY['promoted', 'candidate', 'candidate', 'canary', 'candidate'])[v - p.nreg]
            WHEN p.kind = 'promoted' THEN 'promoted'
            ELSE (ARRAY['promoted', 'candidate'])[v - p.nreg] END AS status,
       -- created, became the canary, left the canary (promoted, rejected or superseded), retired
       CASE WHEN v <= p.nreg THEN %(anchor)s::timestamptz - interval '60 days'
                 + (v - 1)::float8 / p.nreg * interval '58 days'
            ELSE %(anchor)s::timestamptz - (CASE p.kind
              WHEN 'canary' THEN (ARRAY[interval '49 hours', interval '25 hours', interval '750 minutes',
                                        interval '210 minutes', interval '30 minutes'])[v - p.nreg]
              WHEN 'promoted' THEN interval '49 hours'
              ELSE (ARRAY[interval '49 hours', interval '6 hours'])[v - p.nreg] END) END AS created_at,
       CASE WHEN v <= p.nreg THEN interval '58 days' / p.nreg ELSE interval '1 hour' END AS slot
FROM (VALUES {policies}) p(policy, nv, kind, nreg)
CROSS JOIN generate_series(1, p.nv) v
""",
    ),
    (
        "trajectories (staging)",
        """
CREATE UNLOGGED TABLE bench_traj AS
WITH base AS (
  SELECT n, (n - 1) / 20 AS b, mod(n - 1, 20) AS s,
         %(anchor)s::timestamptz - interval '60 days'
           + (n - 1 + 0.9 * random()) / %(t)s * interval '60 days' AS last_call_at,
         random() AS r1, random() AS r2
  FROM generate_series(1, %(t)s) n
), typed AS (
  SELECT base.*,
         CASE WHEN s <= 10 THEN 'support-agent' WHEN s <= 14 THEN 'sql-agent' WHEN s <= 16 THEN 'triage'
              WHEN s = 17 THEN 'summarizer' END AS policy,
         make_interval(secs => 5 + mod(n * 37, 40)) AS gap
  FROM base
)
SELECT t.n, t.b, t.s, md5('t-' || t.n)::uuid AS id, t.policy,
       coalesce(t.policy, (ARRAY['gpt-4o-mini', 'claude-haiku'])[1 + mod(t.n, 2)]) AS model,
       (ARRAY{tenants})[1 + mod(t.b + CASE WHEN t.s BETWEEN 11 AND 14 THEN 0 ELSE t.s END, 5)] AS tenant,
       t.last_call_at, t.last_call_at - 3 * t.gap AS first_call_at, t.gap,
       (t.policy = 'support-agent' AND mod(t.n, 3) = 0) OR (t.policy = 'sql-agent' AND mod(t.n, 2) = 0) AS tools,
       CASE WHEN mod(t.n, 10) < 3 THEN 'run-' || t.n END AS client_trajectory_id,
       CASE WHEN t.policy = 'sql-agent' THEN 'sql-' || t.b END AS group_id,
       v.vnum,
       CASE WHEN v.vnum IS NOT NULL THEN md5('v-' || t.policy || '-' || v.vnum)::uuid END AS version_id,
       CASE WHEN v.vnum < p.nv AND t.last_call_at < %(anchor)s::timestamptz - interval '1 day'
            AND t.r1 < 0.85 THEN md5('r-' || t.policy || '-' || (v.vnum + 1))::uuid END AS trained_run,
       t.r1 < 0.85 AS rewarded,
       greatest(0.0, least(1.0, round((0.35 + 0.3 * t.n / %(t)s + 0.6 * (t.r2 - 0.5)
         + CASE WHEN v.canary THEN 0.04 ELSE 0 END)::numeric, 3)))::float8 AS reward,
       t.r1, t.r2
FROM typed t
LEFT JOIN (VALUES {policies}) p(policy, nv, kind, nreg) ON p.policy = t.policy
LEFT JOIN LATERAL (
  SELECT CASE
    WHEN p.nv IS NULL OR p.nv = 0 THEN NULL
    WHEN t.last_call_at < %(anchor)s::timestamptz - interval '2 days' THEN least(p.nreg, 1 + floor(
      extract(epoch FROM t.last_call_at - (%(anchor)s::timestamptz - interval '60 days'))
      / extract(epoch FROM interval '58 days') * p.nreg)::int)
    WHEN p.kind = 'canary' AND t.last_call_at >= %(anchor)s::timestamptz - interval '1 day' AND mod(t.n, 5) = 0
      THEN p.nreg + CASE WHEN t.last_call_at < %(anchor)s::timestamptz - interval '12 hours' THEN 2
                         WHEN t.last_call_at < %(anchor)s::timestamptz - interval '3 hours' THEN 3 ELSE 4 END
    ELSE p.nreg + 1 END AS vnum,
    p.kind = 'canary' AND t.last_call_at >= %(anchor)s::timestamptz - interval '1 day' AND mod(t.n, 5) = 0 AS canary
) v ON true
""",
    ),
]

INSERTS = [
    (
        "training_runs",
        """
INSERT INTO training_runs (id, policy, status, trigger, host, pid, started_at, finished_at, from_version_id,
  produced_version_id, trajectories, groups, groups_equal_rewards, groups_greedy, samples, tokens, loss,
  mean_reward, mean_advantage, kl, clip_fraction, duration_s, code_version, config, metrics)
SELECT run_id, policy, 'succeeded', CASE WHEN mod(v, 9) = 0 THEN 'manual' ELSE 'schedule' END, 'trainer-1',
  10000 + mod(v, 5000), created_at - make_interval(secs => 600 + mod(v * 13, 900)), created_at, parent_id, id,
  256 + mod(v, 64), 64 + mod(v, 16), mod(v, 5), mod(v, 3), 1024 + mod(v * 7, 512), 900000 + v * 31,
  0.3 + mod(v, 17) / 100.0, 0.4 + 0.3 * v / nv, 0.01 * mod(v, 7), 0.01 + mod(v, 11) / 1000.0,
  0.05 + mod(v, 13) / 200.0, 600 + mod(v * 13, 900), 'apprentice 0.9.' || mod(v, 4),
  jsonb_build_object('lr', 1e-5, 'lora_rank', 16, 'lora_alpha', 32, 'group_size', 4, 'batch_groups', 16,
    'kl_coef', 0.02, 'clip_eps', 0.2, 'max_staleness', 2, 'epochs', 1, 'reward_name', 'reward'),
  jsonb_build_object('tokens_per_s', 1800 + mod(v, 400), 'peak_memory_gb', 21.5, 'steps', 16)
FROM bench_versions
UNION ALL  -- runs that failed and produced no version
SELECT md5('rf-' || policy || '-' || v)::uuid, policy, 'failed', 'schedule', 'trainer-1', 20000 + mod(v, 5000),
  created_at - interval '40 minutes', created_at - interval '35 minutes', parent_id, NULL, 256, 64, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, 300, 'apprentice 0.9.1', '{}'::jsonb, '{}'::jsonb
FROM bench_versions WHERE mod(v, 10) = 5 AND v <= nreg
""",
    ),
    (
        "adapter_versions",
        """
INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, parent_version_id,
  training_run_id, rank, alpha, target_modules, canary_share, gates, evaluation, files_deleted_at, created_at,
  updated_at)
SELECT id, policy, v, policy || '-v' || v, status, 'Qwen/Qwen2.5-7B-Instruct',
  '/var/lib/apprentice/adapters/' || policy || '/v' || v, parent_id, run_id, 16, 32,
  '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'::jsonb,
  CASE WHEN status = 'canary' THEN 0.2 END,
  jsonb_build_object('outcome', CASE WHEN kind = 'candidate' AND v = nv THEN 'fail' ELSE 'pass' END,
    'kl_bound', 0.05, 'checks', jsonb_build_array(
      jsonb_build_object('name', 'run_finished', 'outcome', 'pass', 'detail', 'the run succeeded', 'value', NULL),
      jsonb_build_object('name', 'loss_finite', 'outcome', 'pass', 'detail', 'loss is finite',
        'value', 0.3 + mod(v, 17) / 100.0),
      jsonb_build_object('name', 'kl_bound', 'outcome', CASE WHEN kind = 'candidate' AND v = nv THEN 'fail'
        ELSE 'pass' END, 'detail', 'mean KL within the bound', 'value', 0.01 + mod(v, 11) / 1000.0))),
  CASE WHEN status IN ('candidate') AND NOT (kind = 'canary' AND v BETWEEN nreg + 2 AND nreg + 3) THEN '{}'::jsonb
  ELSE jsonb_build_object('canary', jsonb_build_object('n', 180 + mod(v, 90), 'mean', 0.61, 'std', 0.21),
    'incumbent', jsonb_build_object('n', 900 + mod(v, 300), 'mean', 0.58, 'std', 0.22),
    'method', 'sequential', 'confidence', 0.95, 'min_samples', 30,
    'verdict', CASE WHEN status = 'rejected' THEN 'worse' WHEN status IN ('retired', 'promoted') THEN 'better'
                    ELSE 'inconclusive' END,
    'interval', jsonb_build_object('difference', 0.03, 'low', CASE WHEN status = 'rejected' THEN -0.09 ELSE 0.004 END,
                                   'high', CASE WHEN status = 'rejected' THEN -0.01 ELSE 0.061 END),
    'decision', CASE WHEN status = 'rejected' THEN 'reject' WHEN status IN ('retired', 'promoted') THEN 'promote'
                     ELSE 'wait' END,
    'mode', 'automatic', 'canary_since', created_at + slot / 10, 'newest_since', created_at + slot / 10,
    'newest', jsonb_build_object('n', 120 + mod(v, 60), 'mean', 0.6, 'verdict', 'inconclusive',
                                 'version', policy || '-v' || v),
    'lineage', jsonb_build_array(policy || '-v' || v), 'elapsed_s', 3600, 'timeout_s', 86400, 'timed_out', false,
    'incumbent_name', policy || '-v' || greatest(v - 1, 1), 'reward_name', 'reward',
    'evaluated_at', created_at + slot / 2) END,
  CASE WHEN v < nreg - 20 THEN created_at + interval '7 days' END, created_at,
  created_at + slot * 0.6
FROM bench_versions
""",
    ),
    (
        "adapter_transitions",
        """
INSERT INTO adapter_transitions (adapter_version_id, policy, from_status, to_status, actor, reason, created_at)
SELECT id, policy, from_status, to_status,
  CASE WHEN to_status IN ('promoted', 'rejected') AND mod(v, 7) = 0 THEN (ARRAY['alice', 'bob'])[1 + mod(v, 2)]
       ELSE 'auto' END,
  reason, at
FROM (
  SELECT bv.*, s.from_status, s.to_status, s.reason, s.at FROM bench_versions bv CROSS JOIN LATERAL (VALUES
    (1, NULL, 'candidate', 'trained by run ' || bv.run_id, bv.created_at),
    (2, 'candidate', 'canary', 'gates passed; the newest lineage version serves ' || 20 || ' percent',
       bv.created_at + bv.slot / 10),
    (3, 'canary', CASE WHEN bv.status = 'rejected' THEN 'rejected' WHEN bv.status = 'candidate' THEN 'candidate'
                       ELSE 'promoted' END,
       CASE WHEN bv.status = 'rejected' THEN 'lineage worse: mean difference -0.0412, 95% interval [-0.09, -0.01]'
            WHEN bv.status = 'candidate' THEN 'superseded by a newer lineage version'
            ELSE 'lineage better: mean difference +0.0301, 95% interval [+0.004, +0.061]' END,
       bv.created_at + bv.slot * 0.6),
    (4, 'promoted', 'retired', 'superseded by a newer promoted version', bv.created_at + bv.slot * 1.6)
  ) s(step, from_status, to_status, reason, at)
  WHERE (s.step = 1)
     OR (s.step = 2 AND (bv.v <= bv.nreg OR bv.status IN ('promoted', 'canary')
                         OR (bv.kind = 'canary' AND bv.v BETWEEN bv.nreg + 2 AND bv.nreg + 3)))
     OR (s.step = 3 AND (bv.v <= bv.nreg OR bv.status = 'promoted'
                         OR (bv.kind = 'canary' AND bv.v BETWEEN bv.nreg + 2 AND bv.nreg + 3)))
     OR (s.step = 4 AND bv.status = 'retired')
) t
ORDER BY at, v
""",
    ),
    (
        "trajectories",
        """
INSERT INTO trajectories (id, tenant, model, policy, client_trajectory_id, group_id, adapter_version_id,
  first_call_at, last_call_at, call_count, trained_in_run_id, created_at)
SELECT id, tenant, model, policy, client_trajectory_id, group_id, version_id, first_call_at, last_call_at, 4,
  trained_run, first_call_at + interval '1 second'
FROM bench_traj
""",
    ),
    (
        "calls",
        """
INSERT INTO calls (id, response_id, trajectory_id, tenant, api_key_id, model, policy, upstream, upstream_model,
  adapter_version_id, created_at, latency_ms, ttft_ms, status_code, error, stream, request, response, protocol,
  prompt_tokens, completion_tokens, temperature, continuation_key, parent_key, stitch_pending, shipped_at)
SELECT md5('c-' || t.n || '-' || j)::uuid,
  CASE WHEN failed THEN NULL ELSE 'chatcmpl-' || substr(md5('c-' || t.n || '-' || j), 1, 24) END,
  t.id, t.tenant, md5('k-' || (1 + mod(t.b, {keys})))::uuid, t.model, t.policy,
  CASE WHEN t.policy IS NULL THEN 'openai' ELSE 'vllm' END,
  CASE WHEN t.policy IS NULL THEN t.model ELSE 'Qwen/Qwen2.5-7B-Instruct' END,
  t.version_id, at, 300 + mod(t.n * 31 + j * 17, 2500), CASE WHEN stream THEN 80 + mod(t.n, 200) END,
  CASE WHEN failed THEN 502 ELSE 200 END,
  CASE WHEN failed THEN jsonb_build_object('type', 'upstream_error', 'message', 'the endpoint did not answer in time',
    'status', 502) END,
  stream,
  jsonb_build_object('model', t.model, 'messages', msgs, 'temperature', 0.7, 'max_tokens', 512)
    || CASE WHEN t.tools THEN jsonb_build_object('tools', pg_temp.tools(t.policy)) ELSE '{}'::jsonb END,
  CASE WHEN failed THEN NULL ELSE jsonb_build_object('id', 'chatcmpl-' || substr(md5('c-' || t.n || '-' || j), 1, 24),
    'object', 'chat.completion', 'created', extract(epoch FROM at)::bigint, 'model', t.model,
    'choices', jsonb_build_array(jsonb_build_object('index', 0,
      'finish_reason', CASE WHEN t.tools AND j = 1 THEN 'tool_calls' ELSE 'stop' END,
      'message', pg_temp.answer(t.n, j, t.tools, coalesce(t.policy, '')))),
    'usage', jsonb_build_object('prompt_tokens', 60 + 45 * j, 'completion_tokens', 20 + mod(t.n, 60),
      'total_tokens', 80 + 45 * j + mod(t.n, 60))) END,
  CASE WHEN mod(t.n, 25) = 0 THEN 'responses' ELSE 'chat.completions' END,
  60 + 45 * j, 20 + mod(t.n, 60), 0.7,
  decode(md5('ck-' || t.n || '-' || j), 'hex'),
  CASE WHEN j > 1 THEN decode(md5('ck-' || t.n || '-' || (j - 1)), 'hex') END,
  false, at + interval '200 milliseconds'
FROM bench_traj t
CROSS JOIN generate_series(1, 4) j
CROSS JOIN LATERAL (SELECT t.first_call_at + (j - 1) * t.gap AS at, mod(t.n * 7 + j, 200) = 0 AS failed,
  mod(t.n, 4) = 0 AS stream) c
CROSS JOIN LATERAL (SELECT jsonb_build_array(
    jsonb_build_object('role', 'system', 'content', pg_temp.system_prompt(coalesce(t.policy, ''))),
    jsonb_build_object('role', 'user', 'content', pg_temp.question(t.n, coalesce(t.policy, ''))))
  || CASE WHEN j > 1 THEN pg_temp.turn(t.n, 1, t.tools, coalesce(t.policy, '')) ELSE '[]'::jsonb END
  || CASE WHEN j > 2 THEN pg_temp.turn(t.n, 2, t.tools, coalesce(t.policy, '')) ELSE '[]'::jsonb END
  || CASE WHEN j > 3 THEN pg_temp.turn(t.n, 3, t.tools, coalesce(t.policy, '')) ELSE '[]'::jsonb END AS msgs) m
""",
    ),
    (
        "rewards",
        """
INSERT INTO rewards (id, tenant, target_kind, target, target_trajectory_id, target_call, trajectory_id, status,
  reject_reason, name, value, metrics, comment, group_id, idempotency_key, content_hash, source, api_key_id,
  judgement_id, observed_at, received_at, linked_at, superseded_at)
-- the current reward of most trajectories, from a key or a webhook
SELECT md5('rw-' || n)::uuid, tenant, 'trajectory', coalesce(client_trajectory_id, id::text), id, NULL::text, id,
  'linked', NULL::text, 'reward', reward, jsonb_build_object('resolved', reward > 0.5, 'turns', 4), NULL::text,
  group_id, CASE WHEN mod(n, 2) = 0 THEN 'idem-' || n END, decode(md5('rw-' || n), 'hex'),
  CASE WHEN mod(n, 3) = 0 THEN 'webhook:crm' ELSE 'key' END,
  CASE WHEN mod(n, 3) = 0 THEN NULL ELSE md5('k-' || (1 + mod(b, {keys})))::uuid END, NULL::uuid,
  last_call_at + interval '30 seconds', last_call_at + interval '31 seconds', last_call_at + interval '31 seconds',
  NULL::timestamptz
FROM bench_traj WHERE rewarded
UNION ALL  -- an earlier reward of some of them, superseded by the current one
SELECT md5('rs-' || n)::uuid, tenant, 'trajectory', id::text, id, NULL, id, 'linked', NULL, 'reward',
  round((1 - reward)::numeric, 3)::float8, '{}'::jsonb, 'first estimate', group_id, NULL,
  decode(md5('rs-' || n), 'hex'), 'key', md5('k-' || (1 + mod(b, {keys})))::uuid, NULL,
  last_call_at + interval '10 seconds', last_call_at + interval '11 seconds', last_call_at + interval '11 seconds',
  last_call_at + interval '31 seconds'
FROM bench_traj WHERE rewarded AND mod(n, 20) IN (7, 12)
UNION ALL  -- the judge's scores of sql-agent's groups (one judgement per group)
SELECT md5('rj-' || n)::uuid, tenant, 'trajectory', id::text, id, NULL, id, 'linked', NULL, 'judge',
  round((0.2 + 0.6 * r2)::numeric, 3)::float8,
  jsonb_build_object('correct_sql', r2 > 0.3, 'rank', 1 + s - 11), 'ranked ' || (1 + s - 11) || ' of 4', group_id,
  NULL, decode(md5('rj-' || n), 'hex'), 'judge', NULL, md5('j-' || b)::uuid,
  last_call_at + interval '5 minutes', last_call_at + interval '5 minutes', last_call_at + interval '5 minutes', NULL
FROM bench_traj WHERE policy = 'sql-agent' AND mod(b, 2) = 0
UNION ALL  -- rewards whose trajectory never arrived (most of them are overdue)
SELECT md5('rp-' || i)::uuid, (ARRAY{tenants})[1 + mod(i, 5)], 'trajectory', 'client-run-' || i, NULL, NULL, NULL,
  'pending', NULL, 'reward', round((mod(i * 37, 100) / 100.0)::numeric, 2)::float8, '{}'::jsonb, NULL, NULL, NULL,
  decode(md5('rp-' || i), 'hex'), 'webhook:crm', NULL, NULL,
  %(anchor)s::timestamptz - (i::float8 / {pending}) * interval '2 days',
  %(anchor)s::timestamptz - (i::float8 / {pending}) * interval '2 days', NULL, NULL
FROM generate_series(1, {pending}) i
UNION ALL  -- rejected ones
SELECT md5('rr-' || n)::uuid, tenant, 'call', 'chatcmpl-unknown-' || n, NULL, 'chatcmpl-unknown-' || n, id,
  'rejected', 'the value is outside the policy''s reward range', 'reward', 7.5, '{}'::jsonb, NULL, NULL, NULL,
  decode(md5('rr-' || n), 'hex'), 'key', NULL, NULL, last_call_at + interval '1 minute',
  last_call_at + interval '1 minute', NULL, NULL
FROM bench_traj WHERE mod(n, {rejected_every}) = 3
""",
    ),
    (
        "judgements",
        """
INSERT INTO judgements (id, policy, tenant, group_key, chunk, judge_model, rubric_hash, mode, status, reason,
  trajectory_ids, attempts, prompt_tokens, completion_tokens, judge_trajectory, answer, lease_until, started_at,
  finished_at, members_key)
SELECT md5('j-' || b)::uuid, 'sql-agent', min(tenant), 'group:sql-' || b, 0, 'gpt-4o', 'rubric-3f9a2c', 'missing',
  'judged', NULL, array_agg(id ORDER BY n), 1, 2400, 380, 'judge-sql-' || b,
  jsonb_build_object('ranking', jsonb_build_array(1, 2, 3, 4), 'explanation',
    'The first query answers the question with the right grouping; the others miss the date filter.'),
  NULL, max(last_call_at) + interval '4 minutes', max(last_call_at) + interval '5 minutes',
  md5(array_to_string(array_agg(id::text ORDER BY id::text), ','))
FROM bench_traj WHERE policy = 'sql-agent' AND mod(b, 2) = 0
GROUP BY b
""",
    ),
    (
        "api_keys",
        """
INSERT INTO api_keys (id, name, tenant, role, key_hash, key_prefix, created_at, revoked_at)
SELECT md5('k-' || i)::uuid, CASE WHEN i <= 3 THEN 'ops-admin-' || i ELSE 'service-' || i END,
  (ARRAY{tenants})[1 + mod(i, 5)], CASE WHEN i <= 3 THEN 'admin' ELSE 'client' END,
  sha256(('sk-bench-' || i)::bytea), 'sk-' || substr(md5('key' || i), 1, 6),
  %(anchor)s::timestamptz - interval '90 days' + i * interval '6 hours',
  CASE WHEN mod(i, 9) = 0 THEN %(anchor)s::timestamptz - interval '3 days' END
FROM generate_series(1, {keys}) i
""",
    ),
    (
        "policy_state",
        """
INSERT INTO policy_state (policy, learning_paused, updated_by, updated_at) VALUES
  ('support-agent', false, 'alice', %(anchor)s::timestamptz - interval '10 days'),
  ('summarizer', true, 'bob', %(anchor)s::timestamptz - interval '2 days')
""",
    ),
]

LOADED_TABLES = ("training_runs", "adapter_versions", "adapter_transitions", "trajectories", "calls", "rewards")


def secondary_indexes(conn: Any) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of the loaded tables' indexes that back no constraint."""
    rows = conn.execute(
        """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
        WHERE c.relname = ANY(%s) AND c.relnamespace = 'public'::regnamespace
          AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
        ORDER BY 1
        """,
        (list(LOADED_TABLES),),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def fill(statement: str, values: dict[str, Any]) -> str:
    """The statement with its `{name}` tokens replaced (numbers and fixed literals only; other braces stay)."""
    for name, value in values.items():
        statement = statement.replace("{" + name + "}", str(value))
    return statement


def generate(db_url: str, sizes: Sizes, anchor: datetime) -> dict[str, Any]:
    """Fill the (migrated, empty) database; returns seconds per step and the row counts."""
    params = {"anchor": anchor, "t": sizes.trajectories}
    fmt = {
        "policies": policy_rows(sizes),
        "tenants": "[" + ", ".join(f"'{t}'" for t in TENANTS) + "]",
        "keys": sizes.keys,
        "pending": sizes.pending,
        "rejected_every": max(sizes.trajectories // max(sizes.rejected, 1), 1),
    }
    steps: dict[str, float] = {}
    started = time.perf_counter()
    with pg_connect(db_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("SET work_mem = '64MB'")
        conn.execute("SET jit = off")
        conn.execute("SELECT setseed(0.14)")
        for statement in FUNCTIONS:
            conn.execute(statement)
        # Load without the secondary indexes, then build them: several times faster than
        # maintaining them row by row; the definitions are read back from the migrated schema.
        indexes = secondary_indexes(conn)
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        for name, statement in STAGING + INSERTS:
            at = time.perf_counter()
            with conn.transaction():
                sql = fill(statement, fmt)
                conn.execute(sql, params if "%(" in sql else None)
            steps[name] = time.perf_counter() - at
            log(f"  {name}: {steps[name]:.1f} s")
        conn.execute("DROP TABLE bench_traj, bench_versions")
        at = time.perf_counter()
        for _, statement in indexes:
            conn.execute(statement)
        steps["indexes"] = time.perf_counter() - at
        log(f"  {len(indexes)} secondary indexes: {steps['indexes']:.1f} s")
        at = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        steps["vacuum analyze"] = time.perf_counter() - at
        log(f"  VACUUM ANALYZE: {steps['vacuum analyze']:.1f} s")
        counts = {table: table_count(conn, table) for table in (*LOADED_TABLES, "judgements", "api_keys")}
        size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
    return {"steps": steps, "total_s": time.perf_counter() - started, "counts": counts, "size": size}


def table_count(conn: Any, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


# --------------------------------------------------------------------------- the gateway


def write_config(workdir: Path, db_url: str) -> Path:
    endpoint = ["http://127.0.0.1:9/v1"]  # never called: the dashboard does not reach the endpoints
    config = {
        "database_url": db_url,
        "data_dir": str(workdir / "data"),
        "auth": {"mode": "keys", "admin_key": ADMIN_KEY},
        "policies": [
            {"name": name, "base_model": "Qwen/Qwen2.5-7B-Instruct", "endpoints": endpoint} for name, _, _ in POLICIES
        ],
    }
    path = workdir / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def gateway_env() -> dict[str, str]:
    """Without OTEL_* either: tracing would change what the pages cost."""
    return bench_env(("APPRENTICE_", "OTEL_"))


def db_upgrade(config: Path) -> None:
    harness.db_upgrade(config, gateway_env())


def start_gateway(config: Path, workdir: Path) -> tuple[ManagedProcess, str]:
    return harness.start_gateway(config, workdir, env=gateway_env())


def login(client: httpx.Client) -> None:
    """As a browser: the form (its CSRF token, tied to the login cookie), then POST the admin key."""
    form = client.get("/ui/login")
    token = re.search(r'name="csrf_token" value="([^"]*)"', form.text)
    if form.status_code != 200 or token is None:
        raise RuntimeError(f"GET /ui/login: {form.status_code}, no CSRF token in the form")
    done = client.post("/ui/login", data={"csrf_token": token.group(1), "key": ADMIN_KEY, "next": "/ui/"})
    if done.status_code != 303 or "apprentice_ui" not in client.cookies:
        raise RuntimeError(f"POST /ui/login: {done.status_code} {done.text[:300]}")


# --------------------------------------------------------------------------- the pages


def link(page_html: str, element_id: str) -> str:
    found = re.search(rf'<a href="([^"]+)" id="{element_id}"', page_html)
    if found is None:
        raise RuntimeError(f"no #{element_id} link in the page")
    return html.unescape(found.group(1))


def pages(client: httpx.Client, db_url: str, sizes: Sizes, anchor: datetime) -> list[tuple[str, str]]:
    """(label, path) of every page and data endpoint to time, with real ids and cursors from the data."""
    nv = sizes.main_versions
    newest, middle, canary = f"{MAIN}-v{nv}", f"{MAIN}-v{nv // 2}", f"{MAIN}-v{nv - 1}"
    with pg_connect(db_url) as conn:
        trajectory = conn.execute(  # a recent run with a tool call and a reward
            "SELECT t.id FROM trajectories t JOIN rewards r ON r.trajectory_id = t.id "
            "WHERE t.policy = %s AND t.adapter_version_id IS NOT NULL "
            "AND t.id IN (SELECT trajectory_id FROM calls WHERE trajectory_id = t.id AND request ? 'tools') "
            "ORDER BY t.last_call_at DESC LIMIT 1",
            (MAIN,),
        ).fetchone()[0]
        judged = conn.execute(  # a judged sql-agent run whose reward was superseded
            "SELECT r.trajectory_id, r.id FROM rewards r WHERE r.source = 'judge' AND EXISTS (SELECT 1 FROM "
            "rewards s WHERE s.trajectory_id = r.trajectory_id AND s.superseded_at IS NOT NULL) "
            "ORDER BY r.received_at DESC LIMIT 1"
        ).fetchone()
        pending = conn.execute(
            "SELECT id FROM rewards WHERE status = 'pending' ORDER BY received_at LIMIT 1"
        ).fetchone()
        middle_at = anchor - timedelta(days=SPAN_DAYS / 2)
        deep = conn.execute(  # a keyset cursor in the middle of the history
            "SELECT last_call_at, id FROM trajectories WHERE last_call_at <= %s ORDER BY last_call_at DESC, id DESC "
            "LIMIT 1",
            (middle_at,),
        ).fetchone()
        runs_before = conn.execute(
            "SELECT started_at FROM training_runs WHERE policy = %s ORDER BY started_at LIMIT 1 OFFSET %s",
            (MAIN, nv // 2),
        ).fetchone()[0]
        transitions_before = conn.execute(
            "SELECT id FROM adapter_transitions WHERE policy = %s ORDER BY id LIMIT 1 OFFSET %s", (MAIN, nv)
        ).fetchone()[0]
    day = (anchor - timedelta(days=20)).replace(tzinfo=None)
    time_range = {
        "since": day.strftime("%Y-%m-%dT%H:%M"),
        "until": (day + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M"),
    }
    found: list[tuple[str, str]] = [
        ("overview", "/ui/"),
        ("data: overview", "/ui/data/overview"),
    ]
    for name, _, _ in POLICIES:
        found += [(f"policy {name}", f"/ui/policies/{name}"), (f"data: policy {name}", f"/ui/data/policies/{name}")]
    found += [
        (f"policy {MAIN}, older versions", f"/ui/policies/{MAIN}?versions_before={nv // 2}"),
        (f"policy {MAIN}, older runs", f"/ui/policies/{MAIN}?" + urlencode({"runs_before": runs_before.isoformat()})),
        (f"policy {MAIN}, older transitions", f"/ui/policies/{MAIN}?transitions_before={transitions_before}"),
        ("version: newest", f"/ui/versions/{newest}"),
        ("version: middle", f"/ui/versions/{middle}"),
        ("version: canary", f"/ui/versions/{canary}"),
        ("data: version newest", f"/ui/data/versions/{newest}"),
        ("data: version middle", f"/ui/data/versions/{middle}"),
        ("data: version canary", f"/ui/data/versions/{canary}"),
        ("trajectories", "/ui/trajectories"),
        ("trajectories: policy", f"/ui/trajectories?policy={MAIN}"),
        ("trajectories: small policy", "/ui/trajectories?policy=summarizer"),
        ("trajectories: middle version", f"/ui/trajectories?version={middle}"),
        ("trajectories: canary", f"/ui/trajectories?version={canary}"),
        ("trajectories: reward 0.2-0.3", "/ui/trajectories?reward_min=0.2&reward_max=0.3"),
        ("trajectories: policy, reward >= 0.95", f"/ui/trajectories?policy={MAIN}&reward_min=0.95"),
        ("trajectories: reward <= 0.01", "/ui/trajectories?reward_max=0.01"),
        ("trajectories: reward 0.6-0.61", "/ui/trajectories?reward_min=0.6&reward_max=0.61"),
        ("trajectories: reward <= 0.35", "/ui/trajectories?reward_max=0.35"),
        ("trajectories: 6 h, 20 days ago", "/ui/trajectories?" + urlencode(time_range)),
        (
            "trajectories: policy, 6 h, 20 days ago",
            "/ui/trajectories?" + urlencode({"policy": "triage", **time_range}),
        ),
    ]
    first = client.get("/ui/trajectories")
    found.append(("trajectories: page 2", link(first.text, "trajectories-next")))
    second = client.get(found[-1][1])
    found.append(("trajectories: page 3", link(second.text, "trajectories-next")))
    by_policy = client.get(f"/ui/trajectories?policy={MAIN}")
    found.append(("trajectories: policy, page 2", link(by_policy.text, "trajectories-next")))
    cursor = f"{deep[0].isoformat()}_{deep[1]}"
    found += [
        ("trajectories: page at 30 days", "/ui/trajectories?" + urlencode({"after": cursor})),
        ("trajectories: policy, page at 30 days", "/ui/trajectories?" + urlencode({"policy": MAIN, "after": cursor})),
        ("trajectory", f"/ui/trajectories/{trajectory}"),
        ("data: trajectory", f"/ui/data/trajectories/{trajectory}"),
        ("trajectory: judged", f"/ui/trajectories/{judged[0]}"),
        ("rewards (pending)", "/ui/rewards"),
        ("rewards: overdue", "/ui/rewards?overdue=1"),
    ]
    rewards = client.get("/ui/rewards")
    found += [
        (
            "rewards: page 2",
            link(rewards.text, "pending-next") if 'id="pending-next"' in rewards.text else "/ui/rewards",
        ),
        ("data: rewards", "/ui/data/rewards"),
        ("data: rewards overdue", "/ui/data/rewards?overdue=1"),
        ("reward (judge)", f"/ui/rewards/{judged[1]}"),
        ("reward (pending)", f"/ui/rewards/{pending[0]}"),
        ("keys", "/ui/keys"),
    ]
    return found


def measure(client: httpx.Client, targets: list[tuple[str, str]], warmups: int, repeats: int) -> dict[str, list[float]]:
    """Milliseconds per request of each target; the targets interleaved in every round."""
    times: dict[str, list[float]] = {label: [] for label, _ in targets}
    for round_number in range(warmups + repeats):
        for label, path in targets:
            started = time.perf_counter()
            response = client.get(path)
            elapsed = (time.perf_counter() - started) * 1000.0
            if response.status_code != 200:
                raise RuntimeError(f"{label}: GET {path} answered {response.status_code}: {response.text[:300]}")
            if round_number >= warmups:
                times[label].append(elapsed)
        if round_number + 1 == warmups or (round_number + 1 - warmups) % 5 == 0:
            log(f"round {round_number + 1}/{warmups + repeats} done")
    return times


def summarize(times: dict[str, list[float]], targets: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    paths = dict(targets)
    return {
        label: {"path": paths[label], "p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "n": len(values)}
        for label, values in times.items()
    }


# --------------------------------------------------------------------------- the report


# What made pages slow at this size and what changed (issue 14), for the report.
FIXES = [
    "- Version pages (and their `/ui/data/versions/...`): the admin API's `listing.version_detail` reads every "
    "version row of the policy (10,000 rows, each with its gates and evaluation documents decoded) to find the "
    "parent, the lineage and its head: about a second. The dashboard now uses `gateway.ui.queries.version_detail`, "
    "the same answer (checked field by field against the admin API's for the newest, a middle, the promoted, the "
    "canary and superseded versions) from the version, its parent and the policy's candidate/canary/promoted rows; "
    "the admin API is unchanged. Its provenance query (trajectories a run trained on) and a canary's live "
    "evaluation (the policy's trajectories since the lineage's first canary) read the whole `trajectories` table: "
    "indexes `ix_trajectories_trained_in_run` and `ix_trajectories_policy_first_call` (migration 0007), which the "
    "admin API and the promotion job use too.",
    "- Trajectories by version: a parallel scan of the table for a version's few dozen trajectories; index "
    "`ix_trajectories_version_last_call` (adapter_version_id, last_call_at, id) reads them in keyset order.",
    "- Trajectories by reward range: the list probed the current reward of each trajectory, newest first, until a "
    "page matched, i.e. the whole history for a range the newest trajectories rarely reach (rewards drift as a "
    "policy learns, so the planner cannot tell). Now: the newest 2,000 probed; if that is not a page, the range's "
    "current rewards are counted in `ix_rewards_current_value` (name, value, current rows only): up to 2,000 are "
    "read with their trajectories by id, up to 50,000 filter the index-ordered scan through a hash of their "
    "trajectory ids (a fraction of a probe's cost per trajectory passed over); beyond that, the probing scan "
    "without its bound: the worst case left, a range with more than 50,000 current rewards of which the newest "
    "2,000 trajectories hold fewer than a page, costs what it cost before. The answers are the rows of the former "
    "query (compared on 146 filter and page combinations of this data).",
]


def short_path(path: str) -> str:
    """The path with long query values (cursors, times) cut, for the table."""
    base, _, query = unquote(path).partition("?")
    if not query:
        return base
    parts = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        parts.append(f"{key}={value if len(value) <= 24 else value[:10] + '…'}")
    return base + "?" + "&".join(parts)


def render(result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    sizes, gen, pages_ = result["sizes"], result["generation"], result["pages"]
    counts = gen.get("counts", {})
    headers = ["page", "p50 (ms)", "p95 (ms)", "< 300 ms"]
    if baseline:
        headers = ["page", "before p50 / p95 (ms)", "p50 (ms)", "p95 (ms)", "< 300 ms"]
    rows = []
    for label, figures in pages_.items():
        ok = (
            "yes"
            if figures["p50"] < BUDGET_MS and figures["p95"] < BUDGET_MS
            else ("p50 yes, p95 no" if figures["p50"] < BUDGET_MS else "**no**")
        )
        row: list[object] = [
            f"{label} (`{short_path(figures['path'])}`)",
            f"{figures['p50']:.1f}",
            f"{figures['p95']:.1f}",
            ok,
        ]
        if baseline:
            before = baseline["pages"].get(label)
            row.insert(1, f"{before['p50']:.0f} / {before['p95']:.0f}" if before else "")
        rows.append(row)
    worst = max(pages_.items(), key=lambda item: item[1]["p50"])
    worst95 = max(pages_.items(), key=lambda item: item[1]["p95"])
    over = [label for label, f in pages_.items() if f["p50"] >= BUDGET_MS]
    steps = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in gen.get("steps", {}).items())
    count_text = ", ".join(f"{table} {count:,}" for table, count in counts.items())
    lines = [
        result.get("machine") or machine_line(),
        "",
        f"`python -m bench.dashboard_pages`: a scratch database filled in SQL with {sizes['calls']:,} calls in "
        f"{sizes['trajectories']:,} trajectories over {SPAN_DAYS} days (four policies and model-only traffic, five "
        f"tenants; JSONB requests and answers with tool calls), rewards (current, superseded, the judge's with their "
        f"judgements, pending, rejected), and {sizes['versions']:,} adapter versions ({sizes['main_versions']:,} of "
        f"`{MAIN}` in one chain, each with its training run and transitions). Rows: {count_text}; database "
        f"{gen.get('size', '?')}. Generated in {gen.get('total_s', 0):.0f} s ({steps}). One gateway worker; each "
        f"page requested {result['repeats']} times after {result['warmups']} warm-ups, all pages interleaved round "
        f"by round, over HTTP with the session cookie of a real login (times include rendering). Load average at "
        f"start / end: {result['load'][0]:.2f} / {result['load'][1]:.2f} (2 cores shared with other work).",
        "",
        markdown_table(headers, rows),
        "",
        f"- Slowest p50: {worst[0]} ({worst[1]['p50']:.0f} ms); "
        f"slowest p95: {worst95[0]} ({worst95[1]['p95']:.0f} ms). "
        + (
            f"Every page answers under {BUDGET_MS:.0f} ms at p50"
            + (" and at p95." if all(f["p95"] < BUDGET_MS for f in pages_.values()) else ".")
            if not over
            else f"Over {BUDGET_MS:.0f} ms at p50: {', '.join(over)}."
        ),
    ]
    if baseline:
        lines.append(
            f"- Before: {baseline.get('label') or 'an earlier run'}, measured {baseline.get('measured', '?')}."
        )
    lines.append(
        f"- The p95 of {result['repeats']} requests lies between the two slowest: one request slowed by other "
        "work on the shared machine moves it; compare p50s across runs."
    )
    lines += FIXES
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    load_start = os.getloadavg()[0]
    db_url = database_url(ADMIN_URL, args.database)
    workdir = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    config = write_config(workdir, db_url)
    generation: dict[str, Any] = {}
    gateway: ManagedProcess | None = None
    anchor: datetime
    failed = False
    try:
        if args.reuse:
            db_upgrade(config)  # new migrations only
            with pg_connect(db_url) as conn:
                anchor = conn.execute("SELECT max(last_call_at) FROM trajectories").fetchone()[0]
                conn.execute("ANALYZE")
                conn.commit()
                generation = {"counts": {t: table_count(conn, t) for t in (*LOADED_TABLES, "judgements", "api_keys")}}
        else:
            recreate_database(ADMIN_URL, args.database)
            db_upgrade(config)
            anchor = datetime.now(timezone.utc)
            log(f"generating {sizes.calls:,} calls, {sizes.versions:,} versions into {args.database}")
            generation = generate(db_url, sizes, anchor)
            log(f"generated in {generation['total_s']:.0f} s ({generation['size']})")
        gateway, base = start_gateway(config, workdir)
        with httpx.Client(base_url=base, timeout=120) as client:
            login(client)
            targets = pages(client, db_url, sizes, anchor)
            if args.only:
                targets = [t for t in targets if re.search(args.only, t[0])]
            log(f"timing {len(targets)} pages, {args.warmups} + {args.repeats} rounds")
            times = measure(client, targets, args.warmups, args.repeats)
        return {
            "sizes": {**sizes.__dict__, "calls": sizes.calls, "versions": sizes.versions},
            "generation": generation,
            "pages": summarize(times, targets),
            "repeats": args.repeats,
            "warmups": args.warmups,
            "load": (load_start, os.getloadavg()[0]),
            "label": args.label,
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_line(),
        }
    except Exception:
        failed = True
        log(f"failed; the gateway's log and data stay in {workdir}")
        raise
    finally:
        if gateway is not None:
            gateway.stop()
        if not args.keep:
            drop_database(ADMIN_URL, args.database)
        if not failed:
            shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 calls and 1,000 versions; writes nothing")
    parser.add_argument("--keep", action="store_true", help="leave the database for --reuse")
    parser.add_argument("--reuse", action="store_true", help="measure the kept database again; writes nothing")
    parser.add_argument("--database", help=f"default {DATABASE} ({DATABASE}_quick with --quick)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--only", help="a regular expression: time only the pages whose label matches")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--baseline", type=Path, help="an earlier run's --json, shown as 'before'")
    parser.add_argument("--label", default="", help="what this run measured, kept in --json (e.g. a commit)")
    args = parser.parse_args(argv)
    args.database = args.database or (f"{DATABASE}_quick" if args.quick else DATABASE)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    report = render(result, baseline)
    print(report)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if not (args.quick or args.reuse or args.only):
        write_section(TITLE, report)
    over = [label for label, figures in result["pages"].items() if figures["p50"] >= BUDGET_MS]
    return 1 if over and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
