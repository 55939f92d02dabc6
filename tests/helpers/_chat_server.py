"""A loopback OpenAI-compatible ``/v1/chat/completions`` server for tests of endpoint clients (PaTaRM's
endpoint judge, the judge gate of ``reward.source: judged``, the SILO-BENCH client, the sales LLM buyer,
the CIT endpoint rewriter): :class:`LoopbackServer` (the server's life cycle), :class:`QuietHandler` (no
request log, the JSON body), :func:`send_json` and :class:`ChatServer` (answers from
``behaviour(prompt)``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    """An HTTP server on 127.0.0.1:<free port> serving ``handler`` in a daemon thread while used as a
    context manager; ``url`` is its ``/v1`` base."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and reads a JSON request body."""

    def log_message(self, *a):
        pass

    def json_body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


def send_json(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """Answer with ``status`` and the body ``data`` as JSON; a client that has gone away is ignored."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


class ChatServer(LoopbackServer):
    """OpenAI-compatible /v1/chat/completions; ``behaviour(prompt)`` -> (status, text, sleep); a text
    starting with ``RAW:`` is sent as the body itself (not JSON)."""

    def __init__(self, behaviour) -> None:
        outer = self
        self.requests: list[dict] = []
        self.lock = threading.Lock()

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.json_body()
                with outer.lock:
                    outer.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                status, text, sleep = behaviour(body["messages"][0]["content"])
                time.sleep(sleep)
                payload = (
                    {"choices": [{"message": {"role": "assistant", "content": text}}]}
                    if status == 200
                    else {"error": "boom"}
                )
                raw = status == 200 and text.startswith("RAW:")
                send_json(self, status, text.encode() if raw else json.dumps(payload).encode())

        super().__init__(Handler)
