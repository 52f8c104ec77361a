"""What every request to the streams' pages (``streamops.ui``) must pass.

* **Who is asking**: Airflow does not guard plugin apps, so :func:`current_user` asks
  Airflow's own authentication (the UI's session cookie ``_token``, or a bearer token); an
  anonymous request gets 401.
* **Actions come from our own pages** (no cross-site request forgery). A browser sends the
  session cookie with any form post, also one another site makes it send. So a post that
  the cookie authenticates must carry :func:`csrf_token` (a form field or the
  ``X-CSRF-Token`` header): an HMAC of the session cookie, which only a page read with that
  cookie can know. And its ``Origin`` (or, without one, its ``Referer``) must be the API
  server's own; ``Sec-Fetch-Site: cross-site`` is refused. A bearer token is not sent by
  browsers on their own, so a post it authenticates needs no CSRF token.
* **What a page may load**: :data:`PAGE_POLICY` for our pages (scripts and styles from this
  server only, no framing by other sites); :data:`DOCS_POLICY` for Great Expectations' Data
  Docs, which are sandboxed (no script runs, nothing is fetched from elsewhere), and
  :func:`offline_docs` strips the links to public CDNs from them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SESSION_COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN

PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
               "connect-src 'self'; frame-ancestors 'self'; form-action 'self'; base-uri 'none'; object-src 'none'")
#: no ``allow-scripts`` and no ``allow-same-origin``: the docs run no script and, as an opaque
#: origin, could not read the session anyway
DOCS_POLICY = ("sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
               "frame-ancestors 'self'; base-uri 'none'; form-action 'none'")
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


async def current_user(request: Request):  # Airflow's BaseUser
    """The caller, authenticated by Airflow; 401 (or 403 for a bad token) otherwise."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    bearer = _bearer(request)
    credentials = None if bearer is None else HTTPAuthorizationCredentials(scheme="Bearer", credentials=bearer)
    return await get_user(request, None, credentials)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def csrf_token(request: Request) -> str:
    """The token our forms carry: bound to the caller's session cookie, so it changes with every
    login and another site cannot know it. Empty for a caller without the cookie (a bearer token)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        return ""
    return hmac.new(cookie.encode(), b"streams-ui-actions", hashlib.sha256).hexdigest()


def _origin(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


def _own_origins(request: Request) -> set[str]:
    from airflow.configuration import conf

    own = {_origin(str(request.base_url))}
    configured = conf.get("api", "base_url", fallback="") or ""
    if configured:
        own.add(_origin(configured))
    return {o for o in own if o}


def cross_site_problem(request: Request) -> str | None:
    """Why this request may come from another site (None: it comes from our own pages or from a
    client that is not a browser)."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        return "the browser says this request comes from another site (Sec-Fetch-Site: cross-site)"
    origin = request.headers.get("origin")
    if origin is not None:
        if _origin(origin) not in _own_origins(request):
            return f"Origin {origin!r} is not this server's"
        return None
    referer = request.headers.get("referer")
    if referer is not None and _origin(referer) not in _own_origins(request):
        return "the Referer is not on this server"
    return None


async def action_caller(request: Request, user: Annotated[object, Depends(current_user)]):
    """The caller of an action (a POST): authenticated, and the post comes from our own page."""
    problem = cross_site_problem(request)
    if problem is None and _bearer(request) is None:
        expected = csrf_token(request)
        sent = request.headers.get(CSRF_HEADER)
        if sent is None and request.headers.get("content-type", "").startswith(
                ("application/x-www-form-urlencoded", "multipart/form-data")):
            sent = (await request.form()).get(CSRF_FIELD)
        if not expected or not isinstance(sent, str) or not hmac.compare_digest(sent, expected):
            problem = f"the {CSRF_FIELD} of the stream's page is missing or wrong; reload the page and try again"
    if problem is not None:
        raise HTTPException(403, f"refused: {problem}")
    return user


_EXTERNAL = re.compile(
    r"<script\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^>]*>\s*</script\s*>"
    r"|<link\b[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>",
    re.IGNORECASE)
DOCS_STYLE = ("<style>body{font-family:system-ui,sans-serif;margin:1rem;color:#222}"
              "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
              "text-align:left;vertical-align:top;font-size:.9rem}.alert-danger,.text-danger{color:#b00020}"
              ".text-success{color:#126b12}nav,.navbar,.d-none,#ge-cta-footer,.modal{display:none}</style>")


def offline_docs(html: str) -> str:
    """Great Expectations' Data Docs page without its scripts and styles from public CDNs (the
    sandbox would not load them, and there may be no internet), with a small stylesheet instead."""
    html = _EXTERNAL.sub("", html)
    head = re.search(r"<head[^>]*>", html, re.IGNORECASE)
    return html[:head.end()] + DOCS_STYLE + html[head.end():] if head else DOCS_STYLE + html
