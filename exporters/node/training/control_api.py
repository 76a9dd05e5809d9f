"""WSGI app of the node exporter: /metrics (Prometheus) and the authenticated /v1 control API.

Routes (see docs/contracts.md): POST/GET /v1/jobs/<job>/commands, GET
/v1/jobs/<job>/commands/<id>, GET /v1/jobs. Every /v1 call needs `Authorization: Bearer
<token>`; with no token configured the API answers 503 to everything (fail closed).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from trainwatch.exporters.contract import finite
from trainwatch.exporters.contract.tokens import bearer, token_matches
from trainwatch.exporters.node.training.store import ApiError, Store

MAX_BODY_BYTES = 16 * 1024
_ROUTES = Map([
    Rule("/v1/jobs", endpoint="jobs", methods=["GET"]),
    Rule("/v1/jobs/<job>/commands", endpoint="commands", methods=["GET", "POST"]),
    Rule("/v1/jobs/<job>/commands/<command_id>", endpoint="command", methods=["GET"]),
], strict_slashes=False)


def _json(status: int, body: Any) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


class ControlApp:
    """Dispatches /metrics to prometheus_client and /v1 to the store."""

    def __init__(self, store: Store, registry: CollectorRegistry, token: str | None) -> None:
        self._store = store
        self._token = token or None
        self._metrics = make_wsgi_app(registry)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/metrics", "/"):
            return self._metrics(environ, start_response)
        request = Request(environ)
        return self._handle(request)(environ, start_response)

    def _authorized(self, request: Request) -> bool:
        return token_matches(bearer(request.headers.get("Authorization")), self._token)

    def _handle(self, request: Request) -> Response:
        try:
            if not request.path.startswith("/v1/"):
                raise NotFound()
            if self._token is None:
                return _json(503, {"error": "control API disabled: no token configured"})
            if not self._authorized(request):
                self._store.count_refused("control_api")
                response = _json(401, {"error": "missing or invalid bearer token"})
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
            endpoint, args = _ROUTES.bind_to_environ(request.environ).match()
            return getattr(self, f"_on_{endpoint}")(request, **args)
        except ApiError as exc:
            return _json(exc.status, {"error": exc.message})
        except MethodNotAllowed as exc:
            allowed = sorted(exc.valid_methods or [])
            return _json(405, {"error": f"method not allowed; use {allowed}"})
        except HTTPException as exc:
            return _json(exc.code or 500, {"error": exc.description or exc.name})

    def _on_jobs(self, request: Request) -> Response:
        return _json(200, {"jobs": self._store.list_jobs()})

    def _on_commands(self, request: Request, job: str) -> Response:
        if request.method == "GET":
            rank_arg = request.args.get("pending_for_rank")
            rank = None
            if rank_arg is not None:
                if not (rank_arg.isascii() and rank_arg.isdigit() and len(rank_arg) <= 7):
                    raise ApiError(400, "pending_for_rank must be a non-negative integer")
                rank = int(rank_arg)
            return _json(200, {"commands": self._store.list_commands(job, rank)})
        length = request.content_length
        if length is None or length > MAX_BODY_BYTES:
            raise ApiError(413 if length else 411,
                           f"body required, at most {MAX_BODY_BYTES} bytes with Content-Length")
        raw = request.get_data(cache=False)
        try:
            payload = finite.loads(raw)
        except finite.NonFiniteError as exc:
            raise ApiError(400, f"body is not valid JSON: {exc}") from None
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "body is not valid JSON") from None
        status, body = self._store.post_command(job, payload)
        return _json(status, body)

    def _on_command(self, request: Request, job: str, command_id: str) -> Response:
        return _json(200, self._store.get_command(job, command_id))
