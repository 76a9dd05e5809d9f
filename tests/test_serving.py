"""exporters/contract/serving.py: the background server a process with its own main loop uses."""

from __future__ import annotations

import requests

from trainwatch.exporters.contract import serving


def _hello(environ: dict, start_response) -> list[bytes]:  # type: ignore[no-untyped-def]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_background_stop_survives_the_loop_ending_before_the_trigger_is_pulled() -> None:
    """stop() raised EBADF, and the log scanner exited 1 on SIGTERM (CI, 1 run in ~8 here),
    when the I/O loop saw the stop flag between two polls and closed the trigger before stop()
    pulled it. The pull below first waits for the loop to end, which forces that ordering."""
    server = serving.make_server(_hello, "127.0.0.1", 0)
    http = serving.Background(server)
    assert requests.get(f"http://127.0.0.1:{server.port}/", timeout=5).text == "ok"
    pull = server.pull_trigger

    def pull_after_the_loop_ended() -> None:
        http._thread.join(10)
        assert not http._thread.is_alive()
        pull()

    server.pull_trigger = pull_after_the_loop_ended
    http.stop()
    assert server.socket is None or server.socket.fileno() == -1  # the listener is closed
