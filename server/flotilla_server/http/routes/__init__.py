"""The HTTP API: one router per resource, collected here."""

from __future__ import annotations

from fastapi import FastAPI

from flotilla_server.http.routes import adapters, chat, completions, docs_page, health, load, models


def include_routers(app: FastAPI) -> None:
    for module in (completions, chat, models, adapters, health, load, docs_page):
        app.include_router(module.router)
