"""Scheduling jobs from async code: a FastAPI-style web app.

``Job.scheduled()`` refuses to run inside an event loop (it would block it
while it writes to the store and the broker); async code awaits
``job.scheduled_async()`` instead, which does the same on a worker thread and
raises the same errors.

With FastAPI installed (``pip install fastapi uvicorn``; this project does not
depend on it)::

    uvicorn fastapi_app:app --app-dir examples
    curl -X POST 'localhost:8000/greetings?name=ada'

Without it, ``python examples/fastapi_app.py`` calls the endpoint functions
directly and runs the job with the in-process ``Worker``. The endpoint
functions are plain ``async def`` functions either way; FastAPI only routes to
them. In production, call ``setup(broker_url=..., store_uri=...)`` before
serving, and run ``dramatiq fastapi_app`` workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from pypepper_dramatiq import (
    ChannelEnqueueError,
    Context,
    Job,
    Task,
    Worker,
    Workflow,
    manager,
    workflow_task,
)

#: The channel greeting jobs go to.
CHANNEL = "greetings"


@workflow_task(name="examples.fastapi_app.greet", retry_count=2)
async def greet(task: Task, context: Context, who: str) -> str:
    """The job's one task (async tasks work too)."""
    await asyncio.sleep(0)
    return f"hello {who}"


def configure(maxsize: int = 100) -> None:
    """Create the bounded channel (once per process, before serving)."""
    manager.new(CHANNEL, maxsize=maxsize)


async def create_greeting(name: str) -> dict[str, Any]:
    """``POST /greetings``: schedule a job without blocking the event loop.

    Raises:
        ChannelFullError, ChannelStoppedError: the channel refused the job
            (FastAPI answers 503 below); nothing was queued or stored.
    """
    job = Job(category="greeting", channel_id=CHANNEL)
    job.workflows.append(Workflow([greet.task(who=name)]))
    await job.scheduled_async()
    return {"job_id": job.id, "status": job.status.value}


async def greeting_status(job_id: str) -> dict[str, Any] | None:
    """``GET /greetings/{job_id}``: the stored status (the store read runs off the loop too)."""
    record = await asyncio.to_thread(Job.get_saved, job_id)
    if record is None:
        return None
    return {"job_id": record.id, "status": record.status.value, "error": record.error}


def build_app() -> Any:
    """The FastAPI app routing to the functions above (needs FastAPI)."""
    from fastapi import FastAPI, HTTPException, Request  # type: ignore[import-not-found]
    from fastapi.responses import JSONResponse  # type: ignore[import-not-found]

    @contextlib.asynccontextmanager
    async def lifespan(web: Any) -> AsyncIterator[None]:
        configure()  # when the server starts, not when this module is imported
        yield

    web = FastAPI(lifespan=lifespan)

    @web.exception_handler(ChannelEnqueueError)
    async def refused(request: Request, exc: ChannelEnqueueError) -> Any:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @web.post("/greetings")
    async def post_greeting(name: str) -> dict[str, Any]:
        return await create_greeting(name)

    @web.get("/greetings/{job_id}")
    async def get_greeting(job_id: str) -> dict[str, Any]:
        found = await greeting_status(job_id)
        if found is None:
            raise HTTPException(status_code=404, detail=f"no job {job_id}")
        return found

    return web


try:
    app = build_app()
except ImportError:  # FastAPI is optional: the functions above work without it
    app = None


async def main() -> None:
    """Without a web server: schedule from async code, then run the job in process."""
    configure()
    created = await create_greeting("ada")
    print("scheduled:", created["status"])
    await Worker(manager.available(CHANNEL)).run_once()
    print("stored:", (await greeting_status(created["job_id"]) or {}).get("status"))


if __name__ == "__main__":
    asyncio.run(main())
