"""A real HTTP endpoint for webhook tests: records every POST (headers and body bytes)
and answers with the statuses it is given in turn (then 200), or not at all ("hang")."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, answers: tuple[int | str, ...] = ()) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers = list(answers)
        self.released = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    answer = receiver.answers.pop(0) if receiver.answers else 200
                if answer == "hang":  # hold the connection, answer nothing
                    receiver.released.wait(60)
                    self.close_connection = True
                    return
                self.send_response(int(answer))
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, (
                f"{len(self.requests)} of {count} webhook requests after {timeout:.0f} s")
            time.sleep(0.1)
        return list(self.requests)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
