"""Client addresses in the API's answers: only to callers who showed a token.

The audit logs record who made a change as the X-Stare-Actor label and the client address,
"alice@laptop (stare ctl) (10.0.0.5)", or the address alone. Reads may be open (no read token,
no control_plane.auth_reads: a local `stare train`); a caller who showed no valid token gets every
address in `who` withheld ("alice@laptop (stare ctl)", "a client"), so an open dashboard does not
map who drives the run from where. Entries written by older versions are withheld the same way.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from services.control.auth import authenticated

E = TypeVar("E", bound=BaseModel)
_GROUP = re.compile(r" ?\(([^()]*)\)")
UNNAMED = "a client"


def is_address(text: str, *, unknown: bool = True) -> bool:
    """An IP address, or (with `unknown`) "unknown": what get_actor records without a peer address."""
    try:
        ipaddress.ip_address(text.strip().strip("[]"))
        return True
    except ValueError:
        return unknown and text.strip() == "unknown"


def withheld(who: str) -> str:
    """`who` without client addresses: parenthesised ones dropped, a leading one named UNNAMED."""
    label = _GROUP.sub(lambda m: "" if is_address(m.group(1)) else m.group(0), who).strip()
    first, _, rest = label.partition(" ")
    if not label or label == "unknown" or is_address(first, unknown=False):
        label = f"{UNNAMED} {rest}".strip() if label != "unknown" else UNNAMED
    return label


def for_caller(entries: Sequence[E], request: Request) -> list[E]:
    """`entries` (with a `who`) as this caller may see them."""
    if authenticated(request):
        return list(entries)
    return [e.model_copy(update={"who": withheld(e.who)}) for e in entries]  # type: ignore[attr-defined]
