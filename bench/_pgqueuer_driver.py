"""PgQueuer's side of the comparison; runs in PgQueuer's own virtualenv (never imports taskq).

    python bench/_pgqueuer_driver.py {install|enqueue-one|enqueue-batch|work} --dsn DSN
        --schema SCHEMA [--n N] [--chunk N] [--concurrency N]

``install`` creates the schema and PgQueuer's tables in it; ``enqueue-one`` and
``enqueue-batch`` time ``Queries.enqueue`` (scalar, or lists of ``--chunk``) and
print {"seconds": ...}; ``work`` runs one QueueManager in drain mode (exits once
the queue is empty) with ``--concurrency`` jobs in flight, executing a no-op
entrypoint ``nap`` that decodes its JSON payload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from datetime import timedelta

PAYLOAD = json.dumps({"seconds": 0, "tag": ""}).encode()


async def _main(args: argparse.Namespace) -> None:
    os.environ["PGQUEUER_SCHEMA"] = args.schema  # read by PgQueuer's DBSettings
    import asyncpg

    # PgQueuer is installed only in the driver's own virtualenv, not the one mypy runs in.
    from pgqueuer import AsyncpgDriver, Queries, QueueManager  # type: ignore[import-not-found]
    from pgqueuer.models import Job  # type: ignore[import-not-found]
    from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found]

    conn = await asyncpg.connect(args.dsn)
    queries = Queries(AsyncpgDriver(conn))
    if args.command == "install":
        await queries.install()
    elif args.command == "enqueue-one":
        started = time.perf_counter()
        for _ in range(args.n):
            await queries.enqueue("nap", PAYLOAD, 0)
        print(json.dumps({"seconds": time.perf_counter() - started}))
    elif args.command == "enqueue-batch":
        started = time.perf_counter()
        for start in range(0, args.n, args.chunk):
            size = min(args.chunk, args.n - start)
            await queries.enqueue(["nap"] * size, [PAYLOAD] * size, [0] * size)
        print(json.dumps({"seconds": time.perf_counter() - started}))
    else:
        manager = QueueManager(queries)

        @manager.entrypoint("nap")  # type: ignore[untyped-decorator]  # unresolved, as above
        async def nap(job: Job) -> None:
            json.loads(job.payload or b"{}")

        await manager.run(
            batch_size=max(1, args.concurrency // 2),
            max_concurrent_tasks=args.concurrency,
            mode=QueueExecutionMode.drain,
            log_aggregation_interval=timedelta(0),  # keep pgqueuer_log rows for timing
        )
    if not conn.is_closed():
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["install", "enqueue-one", "enqueue-batch", "work"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=16)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
