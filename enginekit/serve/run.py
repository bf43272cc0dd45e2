"""Running a ``Server`` under uvicorn: in the foreground (the command line, which shuts
down gracefully on SIGINT or SIGTERM) or on a background thread (tests, notebooks).

The listening socket is bound before uvicorn starts, so ``serve.port=0`` takes any free
port and the caller learns which (``bind``); it has TCP_NODELAY, so that a streamed
token leaves at once instead of waiting for the client's ACK of the previous one.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from enginekit.serve.api import build_app
from enginekit.serve.server import Server

START_TIMEOUT_S = 60.0


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port); IPv6 for a host
    with a colon. It has TCP_NODELAY (Nagle's algorithm off), which the connections it
    accepts inherit on Linux: with Nagle on, a small write (a server-sent event of one
    token) waits for the ACK of the previous one, which a client's delayed ACK holds
    back up to 40 ms. uvicorn sets nothing itself; the asyncio event loop's transport
    (and uvloop's) turns Nagle off on every TCP connection it accepts, so this holds
    whichever loop or server accepts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def uvicorn_server(server: Server, *, log_config: bool) -> uvicorn.Server:
    """uvicorn on ``server``'s application: live requests get ``serve.shutdown_timeout_s``
    to finish at shutdown; access lines are logged at ``log_level=debug`` and below.
    ``log_config``: let uvicorn configure logging (the command line), else leave the
    process's logging alone (a library or test calling)."""
    level = str(server.config.log_level)
    options: dict[str, Any] = {} if log_config else {"log_config": None}
    config = uvicorn.Config(
        build_app(server),
        log_level=level,
        access_log=level in ("debug", "trace"),
        # uvicorn hands it to asyncio.wait_for, which takes a float (its hint says int)
        timeout_graceful_shutdown=float(server.config.shutdown_timeout_s),  # type: ignore[arg-type]
        lifespan="on",
        **options,
    )
    return uvicorn.Server(config)


class BackgroundServer:
    """``server`` on a thread of its own, on ``serve.host`` and ``serve.port`` (0 for
    any free port): ``start()`` returns the base URL once it answers, ``stop()`` shuts it
    down as a signal would (live requests drain for ``serve.shutdown_timeout_s``). Also a
    context manager."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._uvicorn = uvicorn_server(server, log_config=False)
        self._socket = bind(str(server.config.host), int(server.config.port))
        self.url = url_of(self._socket)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self) -> str:
        """Starts serving; returns the base URL (``http://host:port``). Raises
        RuntimeError if uvicorn does not start within START_TIMEOUT_S."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout_s: float | None = None) -> None:
        """Shuts down (as SIGTERM would) and waits for the thread (at most ``timeout_s``)."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
