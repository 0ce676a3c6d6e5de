"""A history of 20 million calls against an empty table: the shipper's insert rate, the learner's
selection and the dashboard's queries, side by side (issue 17, docs/history.md).

Two scratch databases at the current schema (calls partitioned by day, migration 0012):

- **empty**: no history, only the working set below;
- **history**: the same working set plus `--calls` calls (default 20,000,000) over the
  `--days` days before it (default 30), one partition a day.

The working set is what a training run reads: 24,000 trajectories of the last 12 hours, four
policies, rewarded and not yet trained. The history is realistic in shape: trajectories of 1 to
9 calls (5 on average) whose requests carry the conversation so far (a system prompt, then a
user message and an answer a turn, hex words: 260 and 100 characters), five tenants, four
policies and model-only traffic, 60 % rewarded, all trained by an older run.

Generated in SQL only (a table of 4,500 conversation templates, then one INSERT ... SELECT
generate_series per day into an UNLOGGED table that is then attached as that day's partition:
the indexes are built once, in bulk, when it is attached). UNLOGGED is legitimate here: nothing
measured writes to those partitions (the shipper writes today's) and a crash only loses the
scratch database.

Measured on each database, `--repeats` times, medians:

- the shipper: `--ship-calls` journal records written with the real JournalWriter, shipped by
  the real JournalShipper through gateway/store/calls.py (COPY, INSERT ... ON CONFLICT, the
  trajectories upsert), rows a second; then one stitch pass (a tenth of them wait for a parent);
- the learner's selection of one run (`learner.jobs.selection.select`, policy p1, its default
  limit of 4,096 trajectories) and `count_new_groups`;
- the dashboard: a trajectory's page (`get_trajectory`: its calls and rewards) and the overview's
  rates (`gateway.ui.queries.rates`).

    python -m bench.history_scale                  # 20 million calls; writes docs/benchmarks.md
    python -m bench.history_scale --calls 2000000  # smaller; writes the section too
    python -m bench.history_scale --quick          # 20,000 calls, 3 days, 1 repeat (a smoke run); writes nothing
    python -m bench.history_scale --keep --json a.json   # leave the databases (dropped by default)
    python -m bench.history_scale --reuse a.json   # measure them again (then dropped, unless --keep)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from apprentice.settings import PolicySettings  # noqa: E402
from apprentice.store.engine import make_async_engine  # noqa: E402
from apprentice.store.schema import upgrade  # noqa: E402
from bench.harness import database_url, drop_database, log, recreate_database  # noqa: E402
from bench.report import machine_line, markdown_table, write_section  # noqa: E402
from bench.stats import median  # noqa: E402
from gateway.journal.shipper import JournalShipper  # noqa: E402
from gateway.journal.writer import JournalWriter  # noqa: E402
from gateway.store.calls import insert_call_lines, stitch_pending  # noqa: E402
from gateway.store.trajectories import get_trajectory  # noqa: E402
from gateway.ui.queries import rates  # noqa: E402
from learner.jobs.selection import count_new_groups, select  # noqa: E402

TITLE = "History at scale: 20 million calls against an empty table"
ADMIN_URL = os.environ.get("APPRENTICE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
POLICIES = ["p0", "p1", "p2", "p3"]
CONVERSATIONS = 500  # templates: 500 conversations x 9 turns
WORKING_SET = 24_000  # trajectories of the last 12 hours, rewarded, untrained
BYTES_PER_CALL_GUESS = 2_500  # heap, TOAST and indexes (2,410 measured at 200,000), for the disk check

# Conversation templates: call k of conversation c carries the system prompt and k turns.
_TEMPLATES = """
CREATE UNLOGGED TABLE bench_templates AS
WITH words AS (
    SELECT c, k, j, (SELECT string_agg(md5(c || '-' || k || '-' || j || '-' || x), ' ')
                     FROM generate_series(1, CASE WHEN j = 0 THEN 8 ELSE 3 END) x) AS text
    FROM generate_series(0, %(conversations)s - 1) c, generate_series(0, 8) k, generate_series(0, 2 * k + 1) j
)
SELECT c AS conv, k,
       jsonb_build_object('model', 'p' || (c %% 4), 'temperature', 1.0, 'messages',
           jsonb_agg(jsonb_build_object('role', CASE WHEN j = 0 THEN 'system' WHEN j %% 2 = 1 THEN 'user'
                                                     ELSE 'assistant' END, 'content', text) ORDER BY j)) AS request,
       jsonb_build_object('id', 'chatcmpl-' || c || '-' || k, 'object', 'chat.completion', 'model', %(base)s,
           'choices', jsonb_build_array(jsonb_build_object('index', 0, 'finish_reason', 'stop', 'message',
               jsonb_build_object('role', 'assistant', 'content', max(text)))),
           'usage', jsonb_build_object('prompt_tokens', 150 + 120 * k, 'completion_tokens', 60)) AS response
FROM words GROUP BY c, k;
CREATE UNIQUE INDEX ON bench_templates (conv, k);
ANALYZE bench_templates;
"""

# Calls of trajectories h in [lo, hi]: trajectory h has 1 + h % 9 calls, 30 s apart, from
# start(h); `prefix` tells history ('h') and working-set ('w') trajectories apart.
_CALL_ROWS = """
SELECT gen_random_uuid(), 'chatcmpl-' || %(prefix)s || h || '-' || turn, md5(%(prefix)s || h)::uuid,
       'tenant-' || (h %% 5), NULL::uuid,
       CASE WHEN h %% 5 = 4 THEN 'gpt-4o-mini' ELSE 'p' || (h %% 4) END,
       CASE WHEN h %% 5 = 4 THEN NULL ELSE 'p' || (h %% 4) END,
       'local', %(base)s, NULL::uuid, s.start + make_interval(secs => 30 * turn),
       400 + (h * 7 + turn) %% 900, 80 + (h + turn) %% 200, 200, NULL::jsonb, false,
       t.request, t.response, 150 + 120 * turn, 60, 1.0,
       decode(md5(%(prefix)s || 'c' || h || '-' || turn), 'hex'),
       CASE WHEN turn > 0 THEN decode(md5(%(prefix)s || 'c' || h || '-' || (turn - 1)), 'hex') END,
       false, 'chat.completions', NULL::jsonb, NULL::jsonb, s.start + make_interval(secs => 30 * turn + 1)
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) h
CROSS JOIN LATERAL (SELECT %(origin)s::timestamptz
                           + make_interval(secs => (h - %(lo)s) * %(spacing)s + (h * 7919) %% 60) AS start) s
CROSS JOIN LATERAL generate_series(0, h %% 9) AS n(turn)
JOIN bench_templates t ON t.conv = h %% %(conversations)s AND t.k = n.turn
"""

_CALL_COLUMNS = (
    "id, response_id, trajectory_id, tenant, api_key_id, model, policy, upstream, upstream_model, adapter_version_id, "
    "created_at, latency_ms, ttft_ms, status_code, error, stream, request, response, prompt_tokens, completion_tokens, "
    "temperature, continuation_key, parent_key, stitch_pending, protocol, native_request, native_response, shipped_at"
)

_TRAJECTORY_ROWS = """
INSERT INTO trajectories (id, tenant, model, policy, group_id, first_call_at, last_call_at, call_count,
                          trained_in_run_id, created_at)
SELECT md5(%(prefix)s || h)::uuid, 'tenant-' || (h %% 5),
       CASE WHEN h %% 5 = 4 THEN 'gpt-4o-mini' ELSE 'p' || (h %% 4) END,
       CASE WHEN h %% 5 = 4 THEN NULL ELSE 'p' || (h %% 4) END,
       %(prefix)s || 'g' || (h / 8), s.start, s.start + make_interval(secs => 30 * (h %% 9)), 1 + h %% 9,
       %(run)s::uuid, s.start
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) h
CROSS JOIN LATERAL (SELECT %(origin)s::timestamptz
                           + make_interval(secs => (h - %(lo)s) * %(spacing)s + (h * 7919) %% 60) AS start) s
"""

_REWARD_ROWS = """
INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, name, value, content_hash, source,
                     observed_at, received_at, linked_at)
SELECT gen_random_uuid(), t.tenant, 'trajectory', t.id::text, t.id, 'linked', 'reward', ((h * 37) %% 11) / 10.0,
       decode(md5(t.id::text), 'hex'), 'key', t.last_call_at + interval '1 minute',
       t.last_call_at + interval '1 minute', t.last_call_at + interval '1 minute'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) h
JOIN trajectories t ON t.id = md5(%(prefix)s || h)::uuid
WHERE t.policy IS NOT NULL AND h %% 10 < %(share)s
"""


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(url, connect_timeout=10, **kwargs)


def generator(url: str) -> psycopg.Connection[Any]:
    """A connection that binds values client-side: the generating statements are DDL and several
    statements at once, which server-side parameters cannot carry."""
    return psycopg.connect(url, connect_timeout=10, autocommit=True, cursor_factory=psycopg.ClientCursor)


def day_partition(db: psycopg.Connection[Any], lower: datetime, *, unlogged: bool) -> str:
    """A day's partition of calls; UNLOGGED and standalone when it is to be filled, then attached."""
    name = f"calls_p{lower:%Y%m%d}"
    exists = db.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    if exists and exists[0]:
        return name
    bounds = sql.SQL("FOR VALUES FROM ({}) TO ({})").format(sql.Literal(lower), sql.Literal(lower + timedelta(days=1)))
    if unlogged:
        db.execute(
            sql.SQL("CREATE UNLOGGED TABLE {} (LIKE calls INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
                sql.Identifier(name)
            )
        )
    else:
        db.execute(sql.SQL("CREATE TABLE {} PARTITION OF calls {}").format(sql.Identifier(name), bounds))
    return name


def fill_day(url: str, lower: datetime, first: int, last: int, spacing: float, run: str) -> float:
    """One day of history: calls into an UNLOGGED table, attached as the day's partition."""
    started = time.monotonic()
    with generator(url) as db:
        db.execute("SET maintenance_work_mem = '256MB'; SET synchronous_commit = off")
        name = day_partition(db, lower, unlogged=True)
        db.execute(
            sql.SQL("INSERT INTO {} ({}) ").format(sql.Identifier(name), sql.SQL(_CALL_COLUMNS)) + sql.SQL(_CALL_ROWS),
            {
                "prefix": "h",
                "base": BASE_MODEL,
                "lo": first,
                "hi": last,
                "origin": lower,
                "spacing": spacing,
                "conversations": CONVERSATIONS,
            },
        )
        bounds = sql.SQL("FOR VALUES FROM ({}) TO ({})").format(
            sql.Literal(lower), sql.Literal(lower + timedelta(days=1))
        )
        db.execute(sql.SQL("ALTER TABLE calls ATTACH PARTITION {} {}").format(sql.Identifier(name), bounds))
        params = {"prefix": "h", "lo": first, "hi": last, "origin": lower, "spacing": spacing, "run": run}
        db.execute(_TRAJECTORY_ROWS, params)
        db.execute(_REWARD_ROWS, {"prefix": "h", "lo": first, "hi": last, "share": 6})
        db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))
    return time.monotonic() - started


def prepare(
    name: str, history_calls: int, days: int, today: datetime, workers: int, working_set: int = WORKING_SET
) -> dict[str, Any]:
    """A scratch database: the schema, the templates, `history_calls` calls over `days` days before
    yesterday, and the working set; returns what generating it cost."""
    url = recreate_database(ADMIN_URL, name)
    upgrade(url)
    started = time.monotonic()
    run = str(uuid.uuid4())
    with generator(url) as db:
        db.execute(_TEMPLATES, {"conversations": CONVERSATIONS, "base": BASE_MODEL})
        db.execute("INSERT INTO training_runs (id, policy, status) VALUES (%s, 'p1', 'succeeded')", (run,))
        day_partition(db, today - timedelta(days=1), unlogged=False)
    per_day = max(1, history_calls // 5 // days) if history_calls else 0
    spacing = 82_800 / per_day if per_day else 0.0
    jobs = []
    if per_day:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for d in range(days):
                lower = today - timedelta(days=days + 1 - d)
                first = d * per_day + 1
                jobs.append(pool.submit(fill_day, url, lower, first, first + per_day - 1, spacing, run))
            for n, job in enumerate(jobs, 1):
                job.result()
                log(f"{name}: day {n}/{days} ({time.monotonic() - started:.0f} s)")
    # The working set: the last 12 hours, rewarded, untrained (identical in both databases).
    origin = datetime.now(timezone.utc) - timedelta(hours=12)
    params = {
        "prefix": "w",
        "base": BASE_MODEL,
        "lo": 1,
        "hi": working_set,
        "origin": origin,
        "spacing": 12 * 3600 / working_set * 0.98,
        "conversations": CONVERSATIONS,
        "run": None,
    }
    with generator(url) as db:
        db.execute(sql.SQL(f"INSERT INTO calls ({_CALL_COLUMNS}) ") + sql.SQL(_CALL_ROWS), params)
        db.execute(_TRAJECTORY_ROWS, params)
        db.execute(_REWARD_ROWS, {"prefix": "w", "lo": 1, "hi": working_set, "share": 10})
        db.execute("DROP TABLE bench_templates")
        db.execute("ANALYZE")
        sizes = db.execute(
            "SELECT count(*), coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'calls'::regclass"
        ).fetchone()
        total = db.execute("SELECT count(*) FROM calls").fetchone()
    assert sizes is not None and total is not None
    return {
        "generation_s": round(time.monotonic() - started, 1),
        "partitions": int(sizes[0]),
        "calls": int(total[0]),
        "calls_bytes": int(sizes[1]),
        "url": url,
    }


def journal_records(count: int) -> list[dict[str, Any]]:
    """What the gateway journals for `count` calls: runs of 1 to 9 calls, a tenth of the
    continuations marked as waiting for a parent another process served (stitch_pending)."""
    records: list[dict[str, Any]] = []
    now = time.time()
    while len(records) < count:
        trajectory, length = str(uuid.uuid4()), random.randint(1, 9)
        parent: str | None = None
        system = " ".join(uuid.uuid4().hex for _ in range(12))
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        for k in range(length):
            messages.append({"role": "user", "content": " ".join(uuid.uuid4().hex for _ in range(6))})
            answer = " ".join(uuid.uuid4().hex for _ in range(6))
            key = uuid.uuid4().hex
            records.append(
                {
                    "id": str(uuid.uuid4()),
                    "response_id": f"chatcmpl-{uuid.uuid4().hex}",
                    "trajectory_id": trajectory,
                    "tenant": f"tenant-{len(records) % 5}",
                    "api_key_id": None,
                    "model": "p1",
                    "policy": "p1",
                    "upstream": "local",
                    "upstream_model": BASE_MODEL,
                    "adapter_version_id": None,
                    "created_at": now + len(records) * 1e-4,
                    "latency_ms": 512.0,
                    "ttft_ms": 95.0,
                    "status_code": 200,
                    "error": None,
                    "stream": False,
                    "request": {"model": "p1", "messages": list(messages)},
                    "response": {
                        "id": "chatcmpl-x",
                        "object": "chat.completion",
                        "model": BASE_MODEL,
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}
                        ],
                        "usage": {"prompt_tokens": 150 + 120 * k, "completion_tokens": 60},
                    },
                    "prompt_tokens": 150 + 120 * k,
                    "completion_tokens": 60,
                    "temperature": 1.0,
                    "continuation_key": key,
                    "parent_key": parent,
                    "stitch_pending": parent is not None and k % 10 == 9,
                    "protocol": "chat.completions",
                    "native_request": None,
                    "native_response": None,
                    "client_trajectory_id": None,
                    "group_id": None,
                    "trainable": True,
                }
            )
            messages.append({"role": "assistant", "content": answer})
            parent = key
    return records[:count]


async def measure_ship(url: str, records: list[dict[str, Any]], directory: Path) -> dict[str, float]:
    """Journal the records with the real writer, ship them with the real shipper: rows a second."""
    engine = make_async_engine(url, pool_size=2)
    try:
        writer = JournalWriter(directory, max_bytes=64 << 20, max_age_s=3600)
        writer.open()
        for record in records:
            writer.append(record)
        writer.rotate()

        async def ship(lines: list[bytes]) -> int:
            return (await insert_call_lines(engine, lines)).stored

        shipper = JournalShipper(writer, ship, batch_rows=2000, interval_s=1.0)
        started = time.perf_counter()
        shipped = 0
        while True:
            n = await shipper.ship_once()
            if n == 0:
                break
            shipped += n
        elapsed = time.perf_counter() - started
        writer.close()
        stitch_started = time.perf_counter()
        await stitch_pending(engine, 6 * 3600.0)
        stitch_s = time.perf_counter() - stitch_started
    finally:
        await engine.dispose()
    assert shipped == len(records), (shipped, len(records))
    return {"rows_per_s": shipped / elapsed, "stitch_ms": stitch_s * 1000}


def measure_selection(url: str) -> dict[str, float]:
    policy = PolicySettings(name="p1", base_model=BASE_MODEL)
    with connect(url) as db:
        started = time.perf_counter()
        selection = select(db, policy)
        select_s = time.perf_counter() - started
        started = time.perf_counter()
        count_new_groups(db, policy)
        count_s = time.perf_counter() - started
        db.rollback()
    return {"select_ms": select_s * 1000, "count_ms": count_s * 1000, "selected": float(len(selection.candidates))}


async def measure_dashboard(url: str, trajectories: list[uuid.UUID]) -> dict[str, float]:
    engine = make_async_engine(url, pool_size=2)
    try:
        pages = []
        for trajectory in trajectories:
            started = time.perf_counter()
            found = await get_trajectory(engine, [trajectory], None, history=False)
            pages.append(time.perf_counter() - started)
            assert found is not None and found.calls
        started = time.perf_counter()
        await rates(engine, POLICIES)
        rates_s = time.perf_counter() - started
    finally:
        await engine.dispose()
    return {"trajectory_ms": median(pages) * 1000, "rates_ms": rates_s * 1000}


def sample_trajectories(url: str, count: int, working_set: int) -> list[uuid.UUID]:
    with connect(url) as db:
        rows = db.execute(
            "SELECT md5('w' || h)::uuid FROM generate_series(1, %s::int) h ORDER BY random() LIMIT %s",
            (working_set, count),
        ).fetchall()
    return [row[0] for row in rows]


def measure(url: str, repeats: int, ship_calls: int, working_set: int) -> dict[str, Any]:
    figures: dict[str, list[float]] = {}
    sample = sample_trajectories(url, 30, working_set)
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory(prefix="history-bench-") as directory:
            shipped = asyncio.run(measure_ship(url, journal_records(ship_calls), Path(directory)))
        selected = measure_selection(url)
        dashboard = asyncio.run(measure_dashboard(url, sample))
        measured = {**shipped, **selected, **dashboard}
        for key, value in measured.items():
            figures.setdefault(key, []).append(value)
        log(f"  repeat {repeat + 1}/{repeats}: " + ", ".join(f"{k} {v:.1f}" for k, v in measured.items()))
    return {key: round(median(values), 2) for key, values in figures.items()} | {
        "samples": {key: [round(v, 2) for v in values] for key, values in figures.items()}
    }


def render(result: dict[str, Any]) -> str:
    empty, full = result["empty"], result["history"]
    gen = result["generation"]

    def ratio(key: str) -> str:
        return f"{full[key] / empty[key]:.2f}x" if empty[key] else "-"

    rows: list[list[object]] = [
        [
            "shipper insert (rows/s, journal to PostgreSQL)",
            f"{empty['rows_per_s']:,.0f}",
            f"{full['rows_per_s']:,.0f}",
            ratio("rows_per_s"),
        ],
        [
            "stitch pass after a shipment (ms)",
            f"{empty['stitch_ms']:.1f}",
            f"{full['stitch_ms']:.1f}",
            ratio("stitch_ms"),
        ],
        [
            "learner selection of one run (ms, `select`, p1)",
            f"{empty['select_ms']:.0f}",
            f"{full['select_ms']:.0f}",
            ratio("select_ms"),
        ],
        ["learner `count_new_groups` (ms)", f"{empty['count_ms']:.1f}", f"{full['count_ms']:.1f}", ratio("count_ms")],
        [
            "dashboard: a trajectory's page (ms, median of 30)",
            f"{empty['trajectory_ms']:.2f}",
            f"{full['trajectory_ms']:.2f}",
            ratio("trajectory_ms"),
        ],
        ["dashboard: overview rates (ms)", f"{empty['rates_ms']:.2f}", f"{full['rates_ms']:.2f}", ratio("rates_ms")],
    ]
    per_call = gen["calls_bytes"] / max(1, gen["calls"])
    return f"""`python -m bench.history_scale --calls {result["calls"]:,}` ({result["repeats"]} repeats, medians;
{result["ship_calls"]:,} journal records shipped a repeat). {machine_line()}

The **history** database holds {gen["calls"]:,} calls in {gen["partitions"]} partitions ({result["days"]} days
of history, one partition a day, the working set and the days ahead); the **empty** one holds only the
working set both share: {result.get("working_set", WORKING_SET):,} trajectories of the last 12 hours, rewarded and
untrained. The selection reads the same run in both (it selected {full["selected"]:.0f} and {empty["selected"]:.0f}
trajectories).

{markdown_table(["measure", "empty table", f"{gen['calls'] / 1e6:.1f} M calls", "history / empty"], rows)}

Storage: {gen["calls_bytes"] / 2**30:.1f} GiB for the calls partitions (heap, TOAST and indexes),
**{per_call:,.0f} bytes a call** with these payloads (a request carrying the conversation so far,
1-9 calls a run; the heap of the largest rows compressed by TOAST). Generating the history took
{gen["generation_s"] / 60:.1f} minutes ({result["workers"]} connections in parallel; one INSERT ... SELECT
a day into an UNLOGGED table attached as that day's partition, its indexes built once at the attach).

Why the two columns stay close: the shipper inserts into today's partition only (its primary key
and indexes are today's size, not the history's); the selection reads the run's trajectories by
the trajectories' index and their calls only in the partitions from the day before the run's
oldest first call (pruned at execution), with JIT off (a plan costed over every partition made
PostgreSQL compile for seconds a query that runs in 0.1 s); a trajectory's page reads its calls
between its first and last call; the overview's rates read the last five minutes (here including
the calls the shipper measure just stored), pruned at executor start to today's partition. What
still grows is `trajectories` and `rewards` (not partitioned: one row a run), which the
selection and the shipper's upsert read and write by index.
"""


def run(args: argparse.Namespace) -> dict[str, Any]:
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    need = 0 if args.reuse else args.calls * BYTES_PER_CALL_GUESS
    free = shutil.disk_usage("/").free
    log(f"disk: {free / 2**30:.0f} GiB free, about {need / 2**30:.0f} GiB needed for {args.calls:,} calls")
    if need * 1.3 > free:
        raise SystemExit(f"not enough disk for {args.calls:,} calls: {free / 2**30:.0f} GiB free")
    names = {"empty": "apprentice_bench_history_empty", "history": "apprentice_bench_history"}
    result: dict[str, Any] = {
        "calls": args.calls,
        "days": args.days,
        "repeats": args.repeats,
        "ship_calls": args.ship_calls,
        "workers": args.workers,
        "working_set": args.working_set,
    }
    try:
        if args.reuse:  # the databases an earlier --keep run left, and what generating them cost
            earlier = json.loads(args.reuse.read_text())
            empty = {**earlier["generation_empty"], "url": database_url(ADMIN_URL, names["empty"])}
            history = {**earlier["generation"], "url": database_url(ADMIN_URL, names["history"])}
        else:
            log("preparing the empty database (working set only)")
            empty = prepare(names["empty"], 0, args.days, today, args.workers, args.working_set)
            log(f"preparing the history: {args.calls:,} calls over {args.days} days")
            history = prepare(names["history"], args.calls, args.days, today, args.workers, args.working_set)
        result["generation"] = {k: v for k, v in history.items() if k != "url"}
        result["generation_empty"] = {k: v for k, v in empty.items() if k != "url"}
        log(f"generated: {history}")
        for label, prepared in (("empty", empty), ("history", history)):
            log(f"measuring {label}")
            result[label] = measure(prepared["url"], args.repeats, args.ship_calls, args.working_set)
    finally:
        if not args.keep:
            for name in names.values():
                drop_database(ADMIN_URL, name)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ship-calls", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2, help="connections generating days in parallel")
    parser.add_argument(
        "--working-set", type=int, default=WORKING_SET, help="trajectories of the last 12 hours a training run reads"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20,000 calls over 3 days, a working set of 2,400, 1 repeat (a smoke run); writes nothing",
    )
    parser.add_argument("--keep", action="store_true", help="leave the scratch databases")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--reuse", type=Path, help="measure again the databases of a --keep run (its --json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.days, args.repeats, args.ship_calls, args.working_set = 20_000, 3, 1, 1_000, 2_400
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report = render(result)
    print(report)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if not args.quick:
        write_section(TITLE, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
