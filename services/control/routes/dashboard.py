"""The dashboard: one HTML page with hand-written JS drawing on <canvas> (no CDN, no network beyond
this API), shipped as package data under static/. The page holds no data; it reads the API."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)
_ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}


def _read(name: str) -> str:
    return (files("services.control") / "static" / name).read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse(_read("index.html"))


@router.get("/static/{name}")
def asset(name: str) -> Response:
    if name not in _ASSETS:
        raise HTTPException(404, f"no asset {name!r}")
    return Response(_read(name), media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})
