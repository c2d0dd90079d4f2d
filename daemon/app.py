"""The HTTP application: routes for completions, chat completions, cancel, models, vLLM's /tokenize,
/detokenize and /version, health, readiness and metrics (and /debug/traces), the bearer-token check on
/v1/*, /tokenize, /detokenize and /debug/* (daemon.access), and OpenAI-shaped JSON
for every error the framework itself answers (unknown route, wrong method, a trailing slash, an
unhandled exception). Handlers stay thin; the work lives in completions.py. What /ready and /metrics
say of the engine comes from the snapshot the GPU thread publishes (daemon.bridge), never from its
objects."""
from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, request_response

from pegainfer.daemon import access, tokenize_api
from pegainfer.daemon.access_log import AccessLog
from pegainfer.daemon.completions import create_chat_completion, create_completion
from pegainfer.daemon.output import error_response
from pegainfer.daemon.debug_traces import traces_route
from pegainfer.daemon.protocol import APIError, bad_request
from pegainfer.daemon.request_end import LOAD_FAILED_MESSAGE, engine_failure
from pegainfer.daemon.runtime import Runtime
from pegainfer.engine.contract import MAX_STALL_S, InjectFailure, Stall

log = logging.getLogger("pegainfer.daemon")

Endpoint = Callable[[HTTPRequest], Awaitable[Response]]


def build_app(rt: Runtime) -> Starlette:
    def guarded(endpoint: Endpoint) -> Endpoint:
        """The endpoint behind the API key (when one is set)."""
        async def checked(http: HTTPRequest) -> Response:
            if (e := access.check_key(http.headers, rt.settings.api_key)) is not None:
                return error_response(e)
            return await endpoint(http)
        return checked

    def generation(create: Callable[..., Awaitable[Response]]) -> Endpoint:
        async def endpoint(http: HTTPRequest) -> Response:
            e = access.check_key(http.headers, rt.settings.api_key) or content_type_error(http.headers)
            if e is not None:
                rt.telemetry.on_front_rejection(e.status, e.message, http.headers, e.code)
                return error_response(e)
            return await create(http, rt, owner=access.identity(http.headers, rt.settings.api_key))
        return endpoint

    def api(handler: Callable[[HTTPRequest, Runtime], Awaitable[Response]]) -> Endpoint:
        """A JSON route's handler: a declared non-JSON body is a 415, an APIError its error JSON."""
        async def endpoint(http: HTTPRequest) -> Response:
            try:
                if (e := content_type_error(http.headers)) is not None:
                    raise e
                return await handler(http, rt)
            except APIError as e:
                return error_response(e)
        return endpoint

    async def version(http: HTTPRequest) -> Response:
        return JSONResponse({"version": tokenize_api.version()})

    async def cancel(http: HTTPRequest) -> Response:
        rid = http.path_params["request_id"]
        caller = access.identity(http.headers, rt.settings.api_key)
        # a public id of several prompts names several engine requests (daemon.request_ids)
        group = rt.request_ids.requests(rid)
        if group is None and rt.scheduler is not None:
            group = tuple(r for r in (rt.scheduler.get(rid),) if r is not None)
        live = [r for r in group or () if not r.is_terminal]
        # someone else's request answers exactly as a missing one does, so that ids cannot be probed
        if not live or not all(access.owns(r.owner, caller) for r in live) or \
                not [r for r in live if rt.scheduler.cancel(r.request_id, "cancelled by API request")]:
            return error_response(APIError(404, f"no running request with id {rid!r}", "not_found_error",
                                           "request_id", "request_not_found"))
        return JSONResponse({"id": rid, "object": "text_completion.cancel", "cancelled": True})

    def model_card() -> dict:
        engine = rt.engine
        return {
            "id": rt.model_name, "object": "model", "created": int(rt.started_wall), "owned_by": "pegainfer",
            "max_model_len": engine.max_model_len if engine else None,
            "max_body_bytes": rt.settings.max_body_bytes,
            "backend": rt.settings.backend if engine is None else engine.backend_name,
            "maturity": _maturity(rt),
            "batch_invariant": _batch_invariant(rt),
        }

    async def models(http: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(http: HTTPRequest) -> Response:
        wanted = http.path_params["model_id"]
        if wanted != rt.model_name:
            return error_response(APIError(404, f"the model {wanted[:200]!r} does not exist; this server serves "
                                                f"{rt.model_name!r}", "not_found_error", "model", "model_not_found"))
        return JSONResponse(model_card())

    async def health(http: HTTPRequest) -> Response:
        ok = rt.healthy()
        return JSONResponse({"status": "ok" if ok else "unhealthy", "phase": rt.phase.value,
                             "gpu_thread_alive": bool(rt.gpu and rt.gpu.is_alive()), "error": _public_error(rt)},
                            status_code=200 if ok else 503)

    async def ready(http: HTTPRequest) -> Response:
        ok = rt.ready()
        body = {"status": "ready" if ok else "not_ready", "phase": rt.phase.value,
                "backend": rt.engine.backend_name if rt.engine else rt.settings.backend,
                "maturity": _maturity(rt), "ep_size": rt.settings.ep_size,
                "batch_invariant": _batch_invariant(rt)}
        if rt.startup is not None:
            body["startup"] = rt.startup  # seconds: load, capture, warmup_requests, total (to ready)
        if rt.scheduler is not None:
            body["scheduler"] = rt.scheduler.snapshot()
        # the same counts as pegainfer:requests_rejected_total{stage}: "front" before the scheduler
        # (auth, media type, body, validation), "scheduler" by it (its snapshot's "rejected")
        body["rejected"] = rt.telemetry.rejections()
        engine = rt.bridge.snapshot if rt.bridge is not None else None  # as the GPU thread last published it
        if engine is not None:
            body["kv_slots_free"] = engine.kv_slots_free
            body["kv_slots_total"] = engine.kv_slots_total
            body["kv_pages"] = {"free": engine.kv_pages_free, "in_use": engine.kv_pages_used,
                                "total": engine.kv_pages_total, "page_size": engine.kv_page_size,
                                "preemptions": engine.preemptions}
            body["engine"] = {"steps": engine.steps, "decode_batch_max": engine.decode_batch_max,
                              "running": engine.running, "waiting": engine.waiting,
                              "async_scheduling": engine.async_scheduling, "overlapped_steps": engine.overlapped_steps}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(http: HTTPRequest) -> Response:
        payload, content_type = rt.telemetry.render_metrics(
            rt.scheduler.snapshot() if rt.scheduler is not None else None,
            rt.bridge.snapshot if rt.bridge is not None else None)
        return Response(payload, media_type=content_type)

    routes = [
        # counted while they are written, so that a stopping server can let them finish (daemon.open_responses)
        Route("/v1/completions", rt.open_responses.wrap(request_response(generation(create_completion))),
              methods=["POST"]),
        Route("/v1/chat/completions", rt.open_responses.wrap(request_response(generation(create_chat_completion))),
              methods=["POST"]),
        Route("/v1/completions/{request_id}/cancel", guarded(cancel), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guarded(model), methods=["GET"]),
        Route("/tokenize", guarded(api(tokenize_api.tokenize)), methods=["POST"]),
        Route("/detokenize", guarded(api(tokenize_api.detokenize)), methods=["POST"]),
        Route("/version", version, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    recent = rt.telemetry.tracing.recent
    debug = [traces_route(recent)] if recent is not None else []
    if rt.settings.debug_hooks:
        log.warning("debug hooks are on: /debug/stall and /debug/fail stall the engine and fail requests on "
                    "demand%s; never in production", "" if rt.settings.api_key else ", and no API key guards them")
        debug += debug_routes(rt)
    routes += [Route(r.path, guarded(r.endpoint), methods=r.methods) for r in debug]
    middleware = [Middleware(AccessLog)] if rt.settings.access_log else []  # one JSON line per request
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _server_error},
                    middleware=middleware)
    app.router.redirect_slashes = False  # "/v1/completions/" is a JSON 404, not a plain-text 307
    return app


def debug_routes(rt: Runtime) -> list[Route]:
    """Fault injection for tests and drills: stall the GPU thread, fail one running request. build_app
    puts them behind the API key; their arguments are checked here, because a bad one reaching the
    GPU thread (time.sleep(-1) raises there) would end the engine and every request with it."""
    async def stall(http: HTTPRequest) -> Response:
        raw = http.query_params.get("seconds", "5")
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_STALL_S):
            return error_response(bad_request(f"seconds must be a number in (0, {MAX_STALL_S:g}], got {raw!r}",
                                              "seconds"))
        if rt.gpu is None or not rt.gpu.is_alive():
            return error_response(APIError(503, "the engine is not running", "service_unavailable", None,
                                           "not_ready"))
        rt.gpu.submit(Stall(seconds))
        return JSONResponse({"stalled_s": seconds})

    async def fail(http: HTTPRequest) -> Response:
        rid = http.path_params["request_id"]
        if rt.scheduler is None or rt.gpu is None or rt.scheduler.get(rid) is None:
            return error_response(APIError(404, f"no running request with id {rid!r}", "not_found_error",
                                           "request_id", "request_not_found"))
        rt.gpu.submit(InjectFailure(rid, "injected failure (debug hook)"))
        return JSONResponse({"id": rid, "injected": True})

    return [Route("/debug/stall", stall, methods=["POST"]),
            Route("/debug/fail/{request_id}", fail, methods=["POST"])]


def content_type_error(headers: Mapping[str, str]) -> APIError | None:
    """A body that declares a type other than JSON is refused with 415; no Content-Type at all is
    read as JSON (what scripts that post raw bytes send). application/json takes parameters
    (charset) and structured-syntax types (application/*+json) are JSON too."""
    raw = headers.get("content-type", "").strip()
    if not raw:
        return None
    media = raw.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return APIError(415, f"unsupported Content-Type {media[:100]!r}: send the body as application/json",
                    "invalid_request_error", None, "unsupported_media_type")


async def _http_error(http: HTTPRequest, exc: HTTPException) -> Response:
    """Starlette's own 404 (no such route) and 405 (wrong method), as OpenAI error JSON."""
    path = http.url.path[:200]
    if exc.status_code == 404:
        e = APIError(404, f"no route {path!r}", "not_found_error", None, "not_found")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        e = APIError(405, f"method {http.method} is not allowed on {path!r} (allowed: {allowed})",
                     "invalid_request_error", None, "method_not_allowed", dict(exc.headers or {}))
    else:
        e = APIError(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500
                     else "server_error", None, None, dict(exc.headers or {}) or None)
    return error_response(e)


async def _server_error(http: HTTPRequest, exc: Exception) -> Response:
    """An exception no handler caught: a stable 500 body; the traceback goes to the log (a bug)."""
    return error_response(APIError(500, "internal server error", "server_error", None, "internal_error"))


def _public_error(rt: Runtime) -> str | None:
    """What /health (open to anyone) says went wrong: never the exception's text, which the log has."""
    if rt.load_error:
        return LOAD_FAILED_MESSAGE
    died = rt.bridge.died if rt.bridge else None
    return engine_failure(died) if died else None


def _batch_invariant(rt: Runtime) -> bool:
    """The engine's, once built; until then what the settings ask for."""
    return rt.engine.batch_invariant if rt.engine is not None else rt.settings.batch_invariant


def _maturity(rt: Runtime) -> str:
    from pegainfer.ep import registry
    if rt.engine is not None:
        return rt.engine.maturity
    try:
        return registry.maturity(rt.settings.backend)
    except registry.UnknownBackend:
        return "unknown"

