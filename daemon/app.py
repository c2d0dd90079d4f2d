"""The HTTP application: routes for completions, cancel, models, health, readiness and metrics,
plus bearer-token checking on /v1/*. Handlers stay thin; the work lives in completions.py."""
from __future__ import annotations

import hmac

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.completions import create_completion, error_response
from daemon.protocol import APIError
from daemon.runtime import Runtime
from engine.messages import InjectFailure, Stall


def build_app(rt: Runtime) -> Starlette:
    def authorised(http: HTTPRequest) -> APIError | None:
        key = rt.settings.api_key
        if not key:
            return None
        given = http.headers.get("authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), key.encode()):
            return None
        return APIError(401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error",
                        None, "invalid_api_key")

    async def completions(http: HTTPRequest) -> Response:
        if (e := authorised(http)) is not None:
            rt.telemetry.on_front_rejection(e.status, e.message, http.headers)
            return error_response(e)
        return await create_completion(http, rt)

    async def cancel(http: HTTPRequest) -> Response:
        if (e := authorised(http)) is not None:
            return error_response(e)
        rid = http.path_params["request_id"]
        if rt.scheduler is None or not rt.scheduler.cancel(rid, "cancelled by API request"):
            return error_response(APIError(404, f"no running request with id {rid!r}", "not_found_error",
                                           "request_id", "request_not_found"))
        return JSONResponse({"id": rid, "object": "text_completion.cancel", "cancelled": True})

    async def models(http: HTTPRequest) -> Response:
        if (e := authorised(http)) is not None:
            return error_response(e)
        engine = rt.engine
        return JSONResponse({"object": "list", "data": [{
            "id": rt.model_name, "object": "model", "created": int(rt.started_wall), "owned_by": "pegainfer",
            "max_model_len": engine.max_model_len if engine else None,
            "max_body_bytes": rt.settings.max_body_bytes,
            "backend": rt.settings.backend if engine is None else engine.backend_name,
            "maturity": _maturity(rt),
        }]})

    async def health(http: HTTPRequest) -> Response:
        ok = rt.healthy()
        return JSONResponse({"status": "ok" if ok else "unhealthy", "phase": rt.phase.value,
                             "gpu_thread_alive": bool(rt.gpu and rt.gpu.is_alive()),
                             "error": rt.load_error or (rt.bridge.died if rt.bridge else None)},
                            status_code=200 if ok else 503)

    async def ready(http: HTTPRequest) -> Response:
        ok = rt.ready()
        body = {"status": "ready" if ok else "not_ready", "phase": rt.phase.value,
                "backend": rt.engine.backend_name if rt.engine else rt.settings.backend,
                "maturity": _maturity(rt), "ep_size": rt.settings.ep_size}
        if rt.scheduler is not None:
            body["scheduler"] = rt.scheduler.snapshot()
        if rt.engine is not None:
            body["kv_slots_free"] = rt.engine.cache.free_slots
            body["kv_slots_total"] = rt.engine.cache.num_slots
        if rt.gpu is not None:
            body["engine"] = {"steps": rt.gpu.steps, "decode_batch_max": rt.gpu.decode_batch_max,
                              "running": len(rt.gpu.running), "waiting": len(rt.gpu.waiting),
                              "async_scheduling": rt.gpu.overlap, "overlapped_steps": rt.gpu.overlapped_steps}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(http: HTTPRequest) -> Response:
        payload, content_type = rt.telemetry.render_metrics(rt)
        return Response(payload, media_type=content_type)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/completions/{request_id}/cancel", cancel, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    routes += rt.telemetry.extra_routes(rt)
    if rt.settings.debug_hooks:
        routes += debug_routes(rt)
    return Starlette(routes=routes)


def debug_routes(rt: Runtime) -> list[Route]:
    """Fault injection for tests and drills: stall the GPU thread, fail one running request."""
    async def stall(http: HTTPRequest) -> Response:
        seconds = float(http.query_params.get("seconds", "5"))
        rt.gpu.submit(Stall(seconds))
        return JSONResponse({"stalled_s": seconds})

    async def fail(http: HTTPRequest) -> Response:
        rid = http.path_params["request_id"]
        rt.gpu.submit(InjectFailure(rid, "injected failure (debug hook)"))
        return JSONResponse({"id": rid, "injected": True})

    return [Route("/debug/stall", stall, methods=["POST"]),
            Route("/debug/fail/{request_id}", fail, methods=["POST"])]


def _maturity(rt: Runtime) -> str:
    from ep import registry
    if rt.engine is not None:
        return rt.engine.maturity
    try:
        return registry.maturity(rt.settings.backend)
    except registry.UnknownBackend:
        return "unknown"

