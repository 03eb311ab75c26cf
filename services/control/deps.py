"""Dependency aliases of the routes: the run state and the actor named in the audit log."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from stare.runstate.base import RunState


def get_state(request: Request) -> RunState:
    return request.app.state.run_state


def get_actor(request: Request, x_stare_actor: Annotated[str | None, Header(max_length=128)] = None) -> str:
    """Who made a change, for the audit log: the X-Stare-Actor header, else the client address."""
    client = request.client.host if request.client else "unknown"
    return f"{x_stare_actor} ({client})" if x_stare_actor else client


StateDep = Annotated[RunState, Depends(get_state)]
ActorDep = Annotated[str, Depends(get_actor)]
