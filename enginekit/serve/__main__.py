"""``python -m enginekit.serve [+group=plugin ...] [key=value ...]``: serve the engine over
HTTP (OpenAI-compatible), with the overrides ``python -m enginekit`` takes and the
``serve.*`` keys (host, port, served_model_name, max_waiting, retry_after_s, time_scale,
shutdown_timeout_s, log_level, and the ``serve.kv_events.*`` group: KV events for
cache-aware routers, ``enginekit.serve.kv_events``).

Prints ``enginekit: serving <model> at <url>`` once the port is bound. SIGINT or SIGTERM
shut it down: live requests get ``serve.shutdown_timeout_s`` to finish, the rest are
aborted, and it exits with 0. A bad config prints ``error: ...`` and exits with 2, and so
does a missing extra: the ``serve`` extra (``--help`` prints the usage first), and those
the config needs (``executor=torch`` the torch extra), all named in one line.
"""

from __future__ import annotations

import signal
import sys

from enginekit.errors import EngineKitError
from enginekit.extras import config_needs, missing_extra_error, require

USAGE = """\
usage: python -m enginekit.serve [+group=plugin ...] [key=value ...]

Serves the engine of the given overrides (those of python -m enginekit) over HTTP:
  POST /v1/completions, POST /v1/chat/completions   (OpenAI-compatible, stream: true too)
  GET  /v1/models, /health, /metrics (Prometheus), /summary (the engine's summary)

Keys of its own: serve.host=127.0.0.1 serve.port=8000 (0: any free port)
  serve.served_model_name=null (model.path, else model.name) serve.max_waiting=1024
  serve.retry_after_s=1 serve.time_scale=1.0 (executor=sim: simulated seconds per wall
  second) serve.shutdown_timeout_s=30 serve.log_level=info
  serve.kv_events.enabled=false (true: publish the cached blocks over ZMQ in vLLM's KV-event
  format, for cache-aware routers) serve.kv_events.endpoint=tcp://*:5557 (PUB; bound if it
  holds *) serve.kv_events.replay_endpoint=null (ROUTER: replays kept batches)
  serve.kv_events.topic= serve.kv_events.buffer_steps=10000 (batches kept for replays)
  serve.kv_events.hwm=100000

Example: python -m enginekit.serve executor=torch model.path=./model +prefix=radix serve.port=8000
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(USAGE, end="")
        try:
            require("python -m enginekit.serve", extras=["serve"])
        except EngineKitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        from enginekit.app import compose_config

        cfg = compose_config(args)
        needs = config_needs(cfg)
        settings = " ".join(["python -m enginekit.serve", *sorted(set(needs.values()))])
        require(settings, extras=["serve", *needs])
        from enginekit.serve.run import bind, url_of, uvicorn_server
        from enginekit.serve.server import Server

        server = Server(cfg)
        sock = bind(str(server.config.host), int(server.config.port))
    except (EngineKitError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        missing = missing_extra_error(exc, "python -m enginekit.serve")
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        return 2
    # uvicorn handles SIGINT and SIGTERM while it runs, then restores these handlers and
    # raises the signal again: as no-ops they let the process end with 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    described = server.engine.describe()
    plugins = " ".join(f"{g}={i.name}" for g, i in server.engine.plugin_infos.items())
    print(
        f"enginekit: serving {server.model_name} at {url_of(sock)} "
        f"(executor={described['executor']}, {plugins})",
        flush=True,
    )
    uvicorn_server(server, log_config=True).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
