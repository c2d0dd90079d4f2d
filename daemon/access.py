"""Who may call what: the bearer-token check on /v1/* and /debug/*, and the caller identity that is
recorded on each request so that only the caller who created it may cancel it.

The Authorization scheme is case-insensitive (RFC 7235, section 2.1: `bearer K` is `Bearer K`); the
token is compared in constant time. A caller's identity is a digest of the token it presented,
never the token itself, so that it can sit in memory beside the request without being a secret. With
no --api-key every caller is anonymous (identity None) and anyone may cancel anything, as before:
the ids themselves are unguessable (daemon.protocol.completion_id).
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from pegainfer.daemon.protocol import APIError

ANONYMOUS: str | None = None


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (any case of the scheme), or None."""
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def check_key(headers: Mapping[str, str], api_key: str | None) -> APIError | None:
    """None when the request may pass (no key is configured, or it presents the key); else the 401."""
    if not api_key:
        return None
    token = bearer_token(headers)
    if token is not None and hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    return APIError(401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error",
                    None, "invalid_api_key")


def identity(headers: Mapping[str, str], api_key: str | None) -> str | None:
    """Who is calling, for ownership: a digest of the presented token when keys are in force, else
    ANONYMOUS. Call it only for a request that passed check_key."""
    if not api_key:
        return ANONYMOUS
    token = bearer_token(headers) or ""
    return "key:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def owns(owner: str | None, caller: str | None) -> bool:
    """Whether `caller` may act on a request `owner` created."""
    if owner is None or caller is None:
        return owner is caller
    return hmac.compare_digest(owner, caller)
