"""The HTTP front end: an OpenAI-compatible server (FastAPI on uvicorn) over any plugin
combination, with Prometheus metrics.

``python -m enginekit.serve [overrides]`` serves from the command line; from Python::

    from enginekit.app import compose_config
    from enginekit.serve import BackgroundServer, Server

    with BackgroundServer(Server(compose_config(["model=tiny", "serve.port=0"]))) as running:
        print(running.url)  # point an OpenAI client at running.url + "/v1"

Modules: ``server`` (the engine, tokenizer, loop and metrics the routes use), ``api``
(the routes), ``loop`` (the thread that owns the engine), ``generation`` (one HTTP
request's engine requests and choices), ``codec`` (the tokenizer and chat template),
``text`` (streaming detokenization, stop strings), ``protocol`` (request bodies and
OpenAI's error shape), ``fields`` (vLLM's request fields enginekit refuses),
``logprobs`` (logprobs in OpenAI's shapes),
``prometheus`` (the metrics), ``kv_events`` (the cache's KV events over ZMQ, in vLLM's
format, for cache-aware routers), ``run`` (uvicorn in the foreground or on a thread).
Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client; pyzmq and msgspec for KV
events): importing this package does not, so that ``python -m enginekit.serve`` can name
the extra when it is missing; ``BackgroundServer`` and ``Server`` are imported on first
use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from enginekit.serve.run import BackgroundServer
    from enginekit.serve.server import Server

__all__ = ["BackgroundServer", "Server"]


def __getattr__(name: str) -> Any:
    if name == "BackgroundServer":
        from enginekit.serve.run import BackgroundServer

        return BackgroundServer
    if name == "Server":
        from enginekit.serve.server import Server

        return Server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
