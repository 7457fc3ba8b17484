"""``kvstatus serve``: the read-only live web board of a namespace (needs ``kvstatus[web]``: Starlette + uvicorn).

One page (``board.html``, no build step, no CDN) over JSON endpoints, all GET:

- ``/api/summary``  counts by status and participant from the last completed
  pass, the history of counts (one point per pass), the Redis URL masked
- ``/api/rooms?status=&participant=&cursor=&limit=``  one page of rooms,
  filtered, continuing a SCAN cursor: each request runs at most
  ``MAX_SCAN_STEPS`` SCAN calls and reads at most about ``MAX_PAGE_READS``
  rooms (the SCAN reply that reaches it is read whole), so a page costs the
  same at 100 or 100k rooms, even when the filter matches nothing. A page ends
  with the SCAN reply that reaches ``limit`` (it may hold a few more rooms) or
  a budget (fewer, maybe none: ``"budget_spent": true`` with a cursor to
  continue from)
- ``/api/rooms/{room}``  every participant's status, what its reads answer (``reads``: shared fate) and reason,
  the TTL, the room's first failure (stage,
  origin, reason, ``at`` in Unix seconds; null when none is recorded), the tombstone of recent clears, and
  the entries' timelines (``timelines``: steps relative to the room's first step, Redis' ``now_ms``)
- ``/api/stuck?older_than=&cursor=&limit=``  one page of stuck rooms (:func:`kvstatus.stuck.stuck` at
  Redis' ``TIME``: holder, status, seconds), within the same budget as ``/api/rooms``
- ``/api/pairs?window=&older_than=&threshold=&cursor=``  one page of the health pass per
  prefill-decode pair (:func:`kvstatus.observe.boardpages.pairs_page`), within the same budget (the board's page sums the pages of a walk and judges the sums)
- ``/api/changes?after=SEQ``  rooms that changed between passes (the change
  detection of ``kvstatus watch``), newest last

Every request passes :class:`Guard` first: its ``Host`` header must be allowed
(against DNS rebinding: a page of another site whose name is made to resolve
to this board would otherwise read it), and with a token set it must carry it
(``Authorization: Bearer <token>``, or Basic with the token as password).

Counts and changes come from a :class:`~kvstatus.observe.scanner.PassLoop` in
the background (bounded, incremental SCAN); the board only ever reads Redis
(SCAN, HGETALL, PTTL, EXISTS, TIME), so the read-only ACL user of :mod:`kvstatus.admin.acl` is enough.
The room and pair pages are read by :mod:`kvstatus.observe.boardpages`.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import ipaddress
import signal
import socket
import threading
from collections import deque
from importlib import resources
from typing import Any, AsyncIterator, Callable, Collection, Optional

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from kvstatus.admin.health import HealthSettings
from kvstatus.admin.reads import DEFAULT_BATCH, Deaths, read_deaths, read_rooms, replies, room_matches, send, server_ms
from kvstatus.admin.views import parse_room, parse_status
from kvstatus.admin.watch import Snapshot, diff
from kvstatus.errors import InvalidArgumentError, KVStatusError, mask_url
from kvstatus.keys import TOMBSTONE_SUFFIX, KeySchema
from kvstatus.model import KVPoll, RoomView, Tombstone
from kvstatus.observe.boardpages import MAX_PAGE as MAX_PAGE
from kvstatus.observe.boardpages import MAX_PAGE_READS as MAX_PAGE_READS
from kvstatus.observe.boardpages import MAX_SCAN_STEPS as MAX_SCAN_STEPS
from kvstatus.observe.boardpages import (
    pairs_page,
    parse_health_settings,
    parse_older_than,
    room_json,
    scan_page,
    stuck_page,
    timelines_json,
)
from kvstatus.observe.scanner import PassLoop, PassResult
from kvstatus.replies import decode_tombstone
from kvstatus.requests import Call
from kvstatus.translate import translate_error

HISTORY_POINTS = 720
RECENT_CHANGES = 500


class Board:
    """What the endpoints read: the pass loop's last result, the count history, the recent changes."""

    def __init__(
        self,
        client: Any,
        schema: KeySchema,
        *,
        shown_url: str,
        interval: float = 2.0,
        batch: int = DEFAULT_BATCH,
        pause: float = 0.0,
    ) -> None:
        self.client = client
        self.schema = schema
        self.shown_url = mask_url(shown_url)
        self.batch = batch
        self.loop = PassLoop(
            client,
            schema,
            interval=interval,
            batch=batch,
            pause=pause,
            keep_rooms=True,
            oldest=5,
            on_result=self._on_result,
            lost_participants=read_deaths,  # the leases, read once a pass: who died, for the stuck rooms and pairs
        )
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self.changes: deque[dict[str, Any]] = deque(maxlen=RECENT_CHANGES)
        self._seq = 0
        self._previous: Optional[Snapshot] = None
        self._lock = threading.Lock()

    def _on_result(self, result: PassResult) -> None:
        snapshot = result.snapshot
        assert snapshot is not None
        point = {
            "t": result.finished_at,
            "rooms": result.stats.rooms,
            "by_status": {s.name: result.stats.by_status.get(s, 0) for s in KVPoll},
        }
        with self._lock:
            self.history.append(point)
            if self._previous is not None:
                for change in diff(self._previous, snapshot):
                    self._seq += 1
                    self.changes.append(
                        {"seq": self._seq, "t": result.finished_at, **change.to_json(), "room_text": str(change.room)}
                    )  # "room" a JSON integer; "room_text" for JavaScript, whose numbers lose 63-bit ids
            self._previous = snapshot

    def summary(self) -> dict[str, Any]:
        state = self.loop.state
        latest = state.latest
        document: dict[str, Any] = {
            "namespace": self.schema.namespace,
            "url": self.shown_url,
            "up": state.up,
            "error": state.last_error,
            "ready": latest is not None,
        }
        with self._lock:
            document["history"] = list(self.history)
            document["last_change"] = self._seq
        if latest is None:
            return document
        stats = latest.stats
        document.update(
            {
                "pass": {"finished_at": latest.finished_at, "duration_s": latest.duration, "keys": latest.keys_scanned},
                "rooms": stats.rooms,
                "entries": stats.entries,
                "by_status": {s.name: stats.by_status.get(s, 0) for s in KVPoll},
                "by_participant": {
                    p: {s.name: c.get(s, 0) for s in KVPoll} for p, c in sorted(stats.by_participant.items())
                },
                "participants": sorted(stats.by_participant),
                "keys_without_ttl": stats.keys_without_ttl,
                "corrupted_rooms": stats.corrupted_rooms,
                "oldest_non_terminal": [room_json(v) for v in stats.oldest],
            }
        )
        return document

    def page(self, cursor: str, limit: int, status: Optional[KVPoll], participant: Optional[str]) -> dict[str, Any]:
        """One page of matching rooms from ``cursor`` ("<node>-<scan cursor>", "0-0" to start)."""
        found, paging = scan_page(
            self.client,
            self.schema,
            cursor,
            limit,
            lambda v: v if room_matches(v, status, participant) else None,
        )
        found.sort(key=lambda v: v.room)
        return {"rooms": [room_json(v) for v in found], **paging}

    def deaths(self) -> Deaths:
        """The leases the last completed pass read (none before the first): who died or restarted."""
        latest = self.loop.state.latest
        return Deaths() if latest is None else latest.deaths

    def stuck(self, cursor: str, limit: int, older_than: float) -> dict[str, Any]:
        """One page of stuck rooms from ``cursor`` (see :func:`~kvstatus.observe.boardpages.stuck_page`)."""
        return stuck_page(self.client, self.schema, cursor, limit, older_than, self.deaths())

    def pairs(self, cursor: str, settings: HealthSettings) -> dict[str, Any]:
        """One page of the health per pair from ``cursor`` (see :func:`~kvstatus.observe.boardpages.pairs_page`)."""
        return pairs_page(self.client, self.schema, cursor, settings, self.deaths())

    def room(self, room: int) -> Optional[dict[str, Any]]:
        """A room's entries, its first failure, its tombstone (who cleared it, when, at which status) and its
        timelines; None if it has none of them. A room holding a value kvstatus does not write raises
        CorruptedValueError (a 503)."""
        key = self.schema.room_key(room)
        views = read_rooms(self.client, self.schema, [key])
        tombstone = self._tombstone(key)
        if not views and tombstone is None:
            return None
        document = room_json(views[0] if views else RoomView(room, {}, None))
        document["tombstone"] = None if tombstone is None else tombstone.describe()
        now_ms = server_ms(self.client)
        document["timelines"] = (
            timelines_json(views[0], now_ms) if views else {"start_ms": None, "now_ms": now_ms, "participants": []}
        )
        return document

    def _tombstone(self, key: str) -> Optional[Tombstone]:
        """The room's tombstone, read with plain HGETALL + PTTL (what the read-only ACL user has; same slot)."""
        tomb = key + TOMBSTONE_SUFFIX
        fields, pttl = send(self.client, replies([Call(("HGETALL", tomb)), Call(("PTTL", tomb))], strict=0))
        if isinstance(pttl, Exception):
            raise translate_error(pttl, Call(("PTTL", tomb))) from pttl
        return None if isinstance(fields, Exception) else decode_tombstone(fields, pttl)  # not a hash: ignored

    def changes_after(self, seq: int) -> dict[str, Any]:
        with self._lock:
            return {"changes": [c for c in self.changes if c["seq"] > seq], "last": self._seq}


LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})


def host_name(header: str) -> str:
    """The name of a ``Host`` header, lower case, without port or trailing dot (``[::1]:80`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1:].partition("]")[0]
    else:
        name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def default_allowed_hosts(bound: str) -> frozenset[str]:
    """The names a browser may use for a board bound to ``bound``: localhost names, the bound name, and, bound to
    every interface, this machine's host names. Any IP address is allowed too (see :meth:`Guard.host_allowed`)."""
    names = set(LOCAL_HOSTS)
    if bound.lower() in WILDCARD_ADDRESSES:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(host_name(bound if ":" not in bound or bound.startswith("[") else f"[{bound}]"))
    return frozenset(names)


def basic_or_bearer(header: str, token: str) -> bool:
    """True if an ``Authorization`` header carries ``token``: as a Bearer token, or as a Basic password."""
    scheme, _, value = header.strip().partition(" ")
    given = value.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


class Guard:
    """ASGI middleware: refuse a ``Host`` that is not allowed (400) and, with a ``token``, a request without it
    (401, asking for Basic credentials so a browser prompts). ``allowed_hosts`` None: any Host."""

    def __init__(self, app: Any, allowed_hosts: Optional[Collection[str]], token: Optional[str]) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None else frozenset(host_name(h) for h in allowed_hosts)
        self.token = token or None

    def host_allowed(self, header: str) -> bool:
        """An allowed name, or an IP address: DNS rebinding always sends the attacker's domain name."""
        name = host_name(header)
        return self.allowed is None or name in self.allowed or (bool(name) and _is_ip(name))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self.host_allowed(headers.get("host", "")):
            # The Host given is not echoed: it is the attacker's text.
            response: Response = PlainTextResponse(
                "this board does not answer to that Host header (allowed: "
                "localhost, IP addresses and `kvstatus serve --allow-host` "
                "names)",
                status_code=400,
            )
        elif self.token is not None and not basic_or_bearer(headers.get("authorization", ""), self.token):
            response = PlainTextResponse(
                "this board needs its token: Authorization: Bearer <token>, or Basic with the token as password",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="kvstatus board", charset="UTF-8"'},
            )
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": mask_url(message)}, status_code=status)


def _limit(text: Optional[str]) -> int:
    """A page's ``limit`` query parameter: 1..MAX_PAGE, default 50."""
    text = "50" if text is None else text
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise InvalidArgumentError(f"invalid limit {text!r}: expected 1..{MAX_PAGE}")
    return int(text)


def create_app(
    board: Board,
    *,
    run_loop: bool = True,
    allowed_hosts: Optional[Collection[str]] = LOCAL_HOSTS,
    token: Optional[str] = None,
) -> Starlette:
    """The board's ASGI app. With ``run_loop`` the pass loop runs while the app does (its lifespan).

    ``allowed_hosts``: the ``Host`` names it answers (IP addresses always; None: any, which DNS rebinding
    exploits); ``token``: required on every request (see :class:`Guard`)."""
    page = resources.files("kvstatus.observe").joinpath("board.html").read_text(encoding="utf-8")

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        def endpoint(request: Request) -> Any:
            try:
                return handler(request)
            except InvalidArgumentError as exc:
                return _error(400, str(exc))
            except KVStatusError as exc:
                return _error(503, f"{type(exc).__name__}: {exc}")

        return endpoint

    def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    def summary(request: Request) -> JSONResponse:
        return JSONResponse(board.summary())

    def rooms(request: Request) -> JSONResponse:
        query = request.query_params
        status = parse_status(query["status"]) if query.get("status") else None
        participant = query.get("participant") or None
        return JSONResponse(board.page(query.get("cursor") or "0-0", _limit(query.get("limit")), status, participant))

    def stuck(request: Request) -> JSONResponse:
        query = request.query_params
        older_than = parse_older_than(query.get("older_than"))
        return JSONResponse(board.stuck(query.get("cursor") or "0-0", _limit(query.get("limit")), older_than))

    def pairs(request: Request) -> JSONResponse:
        settings = parse_health_settings(request.query_params)
        return JSONResponse(board.pairs(request.query_params.get("cursor") or "0-0", settings))

    def room(request: Request) -> JSONResponse:
        found = board.room(parse_room(request.path_params["room"]))
        if found is None:
            return _error(404, f"room {request.path_params['room']} has no entry in {board.schema.namespace}")
        return JSONResponse(found)

    def changes(request: Request) -> JSONResponse:
        after = request.query_params.get("after", "0")
        if not after.isdigit():
            raise InvalidArgumentError(f"invalid after {after!r}: expected a change number")
        return JSONResponse(board.changes_after(int(after)))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if run_loop:
            board.loop.start()
        try:
            yield
        finally:
            if run_loop:
                board.loop.stop()

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/api/summary", guarded(summary), methods=["GET"]),
        Route("/api/rooms", guarded(rooms), methods=["GET"]),
        Route("/api/rooms/{room}", guarded(room), methods=["GET"]),
        Route("/api/stuck", guarded(stuck), methods=["GET"]),
        Route("/api/pairs", guarded(pairs), methods=["GET"]),
        Route("/api/changes", guarded(changes), methods=["GET"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, middleware=[Middleware(Guard, allowed_hosts=allowed_hosts, token=token)]
    )


def run_board(
    client: Any,
    schema: KeySchema,
    *,
    shown_url: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    interval: float = 2.0,
    batch: int = DEFAULT_BATCH,
    pause: float = 0.0,
    allow_hosts: Collection[str] = (),
    any_host: bool = False,
    token: Optional[str] = None,
    ready: Optional[Callable[[str, int], None]] = None,
) -> int:
    """Serve the board until SIGTERM or SIGINT; returns 0. ``ready(host, port)`` once the port is bound.

    It answers the Host names of :func:`default_allowed_hosts` and ``allow_hosts`` (every Host with
    ``any_host``); with ``token``, only requests that carry it."""
    import uvicorn

    board = Board(client, schema, shown_url=shown_url, interval=interval, batch=batch, pause=pause)
    hosts = None if any_host else default_allowed_hosts(host) | {host_name(h) for h in allow_hosts}
    app = create_app(board, allowed_hosts=hosts, token=token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    if ready is not None:
        ready(host, sock.getsockname()[1])
    # uvicorn re-raises the signal that stopped it once its own handlers are gone; these make that a clean exit.
    stopped: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda number, _frame: stopped.append(number))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return 0
