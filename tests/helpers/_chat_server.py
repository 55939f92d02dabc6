"""A loopback OpenAI-compatible ``/v1/chat/completions`` server for tests of endpoint clients (PaTaRM's
endpoint judge, the judge gate of ``reward.source: judged``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """OpenAI-compatible /v1/chat/completions on 127.0.0.1; ``behaviour(prompt)`` -> (status, text, sleep)."""

    def __init__(self, behaviour) -> None:
        outer = self
        self.requests: list[dict] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                status, text, sleep = behaviour(body["messages"][0]["content"])
                time.sleep(sleep)
                payload = (
                    {"choices": [{"message": {"role": "assistant", "content": text}}]}
                    if status == 200
                    else {"error": "boom"}
                )
                data = (
                    text.encode()
                    if status == 200 and text.startswith("RAW:")
                    else json.dumps(payload).encode()
                )
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
