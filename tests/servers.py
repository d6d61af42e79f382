"""Real servers on loopback for the tests that need one: `prefect server start`, and a webhook listener."""

from __future__ import annotations

import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def drain_prefect_workers(timeout: float = 30.0) -> None:
    """Deliver the events and logs Prefect has queued in this process, and stop its workers. Prefect keeps one
    events worker per process whose client holds the API URL of the server it first talked to; left running
    past that server's life it would send every later event to a dead URL (and hang the process at exit, still
    draining). Stopped, the next event starts a worker for the server configured then."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        service.drain_all(timeout=timeout, at_exit=False)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """`prefect server start` on 127.0.0.1 (its own PREFECT_HOME, analytics off); the test process's Prefect
    settings point at it for the module."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", NO_PROXY="127.0.0.1,localhost")
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--no-ui", "--analytics-off"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prefect server did not start: {(home / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        drain_prefect_workers()  # whatever is queued belongs to an earlier server
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_HOME: str(home)}):
            yield url
            drain_prefect_workers()  # this server's events and logs, while it is still up to take them
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def webhook():
    """A local HTTP listener: every POST's path and JSON body lands in the returned queue."""
    received: queue.Queue = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.put((self.path, self.headers.get("Content-Type", ""), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/kevin", received
    finally:
        server.shutdown()
        server.server_close()
