"""Run as a separate process by the crash test: records one finished response and one
that is still running, then dies by SIGKILL before finishing it (no cleanup runs).
It prints ``running`` once both are written.

    python -m tests.store.crash_child URL INSTANCE_ID TENANT FINISHED_ID RUNNING_ID
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_response


async def live_and_die(url: str, instance_id: str, tenant: str, finished_id: str, running_id: str) -> None:
    store = SqlResponseStore(url, instance_id)
    await store.open()
    done = new_response(tenant, response_id=finished_id)
    await store.begin(done)
    output = [assistant_message("kept")]
    await store.finish(tenant, finished_id, final(done, output), output, events_of(finished_id))
    await store.begin(new_response(tenant, response_id=running_id, previous=finished_id))
    print("running", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    asyncio.run(live_and_die(*sys.argv[1:6]))
