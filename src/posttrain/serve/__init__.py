"""`posttrain serve`: an OpenAI-compatible HTTP server for local Hugging Face models and presets.

``create_app(ServeConfig(model=...))`` builds the ASGI app; ``run_server`` serves it in the
foreground; ``BackgroundServer`` runs it on a thread (tests, load test, judge / user endpoints).
FastAPI and uvicorn come with the ``serve`` extra (``pip install -e ".[serve]"``). Reference:
``docs/serve.md``.
"""

from __future__ import annotations

from posttrain.serve.config import ChatCompletionRequest, ServeConfig

__all__ = [
    "BackgroundServer",
    "ChatCompletionRequest",
    "ServeConfig",
    "create_app",
    "require_serve_extra",
    "run_server",
]


def require_serve_extra() -> None:
    """Raise an ImportError naming the extra when FastAPI or uvicorn is missing."""
    missing = []
    for mod in ("fastapi", "uvicorn"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ImportError(
            f'posttrain serve needs {", ".join(missing)}: install the serve extra (pip install -e ".[serve]")'
        )


def __getattr__(name: str):
    if name == "create_app":
        from posttrain.serve.app import create_app

        return create_app
    if name in ("BackgroundServer", "run_server"):
        from posttrain.serve import server

        return getattr(server, name)
    raise AttributeError(name)
