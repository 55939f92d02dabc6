"""Running the app: in the foreground (`posttrain serve`) or on a background thread (tests, the load
test, a judge or simulated-user endpoint inside a Python program)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from posttrain.serve.config import ServeConfig
from posttrain.utils.errors import PosttrainRuntimeError


def _uvicorn_config(app: Any, cfg: ServeConfig, **kw: Any) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=kw.pop("log_level", "warning"),
        access_log=False,
        timeout_graceful_shutdown=5,
        **kw,
    )


def run_server(
    cfg: ServeConfig, *, log_level: str = "info", on_loaded: Callable[[], None] | None = None
) -> None:
    """Serve ``cfg.model`` in the foreground until Ctrl-C; ``on_loaded`` runs once the model has
    loaded (the CLI prints "serving ... on ..." there, not before a load that may fail)."""
    import uvicorn

    from posttrain.serve.app import create_app

    app = create_app(cfg)
    if on_loaded is not None:
        on_loaded()
    uvicorn.Server(_uvicorn_config(app, cfg, log_level=log_level)).run()


class BackgroundServer:
    """``with BackgroundServer(cfg) as srv: ... srv.base_url ...`` — the server on a daemon thread,
    bound to ``cfg.host`` on ``cfg.port`` (0 = a free port, read back from the socket). Leaving the
    block stops it (graceful shutdown, bounded by ``stop_timeout_s``)."""

    def __init__(
        self,
        cfg: ServeConfig,
        *,
        app: Any = None,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.cfg = cfg
        self._app = app
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}/v1"

    def __enter__(self) -> BackgroundServer:
        import uvicorn

        from posttrain.serve.app import create_app

        app = self._app if self._app is not None else create_app(self.cfg)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.cfg.host, self.cfg.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_uvicorn_config(app, self.cfg))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="posttrain-serve", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise PosttrainRuntimeError(
                    f"posttrain serve: the server did not start within {self.start_timeout_s:g}s"
                )
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.stop_timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(self.stop_timeout_s)
