"""Connection mixins that let an error from a misconfigured URL name the server and what it has.

redis-py's errors for a URL that points at the wrong place say little: ``Protocol error, got "<"`` (an HTTP
server answered) or ``DB index is out of range`` (``/99`` on a server with 16 databases), without the address.
These mixins catch them where the connection is known, and set on the exception (type and text unchanged)
:data:`SERVER_ATTR` (``host:port`` or the socket path), and for a database out of range
:data:`DATABASES_ATTR` (the server's ``databases``, or None when ``CONFIG GET`` is refused);
:func:`kvstatus.translate.translate_error` turns them into a sentence with the fix.
"""

from __future__ import annotations

from typing import Optional

from redis import exceptions as rx

SERVER_ATTR = "kvstatus_server"
"""Attribute these mixins set on a non-Redis reply's or a SELECT's error: ``host:port`` (or path)."""
DB_ATTR = "kvstatus_db"
"""Attribute set on a SELECT's "out of range" error: the database the URL asked for."""
DATABASES_ATTR = "kvstatus_databases"
"""Attribute set on a SELECT's "out of range" error: the server's ``databases`` (None: CONFIG GET refused)."""
OUT_OF_RANGE = "DB index is out of range"
"""Redis' (and Valkey's) reply to SELECT of a database the server does not have."""


def _server(connection: object) -> str:
    path = getattr(connection, "path", None)
    return str(path) if path else f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"


def _databases(reply: object) -> Optional[int]:
    """``databases`` from a ``CONFIG GET databases`` reply (a flat list in RESP2, a map in RESP3)."""
    if isinstance(reply, dict):
        values = list(reply.values())
    elif isinstance(reply, (list, tuple)) and len(reply) == 2:
        values = [reply[1]]
    else:
        return None
    try:
        return int(values[0])
    except (IndexError, TypeError, ValueError):
        return None


class NamedServerConnection:
    """Mixin for redis-py's sync connections (see the module)."""

    _kvstatus_connecting = False

    def on_connect_check_health(self, *args: object, **kwargs: object) -> object:
        self._kvstatus_connecting = True  # only the connect's SELECT is followed by a CONFIG GET
        try:
            return super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._kvstatus_connecting = False

    def read_response(self, *args: object, **kwargs: object) -> object:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except rx.InvalidResponse as exc:
            setattr(exc, SERVER_ATTR, _server(self))
            raise
        except rx.ResponseError as exc:
            if not self._kvstatus_connecting or OUT_OF_RANGE not in str(exc):
                raise
            setattr(exc, SERVER_ATTR, _server(self))
            setattr(exc, DB_ATTR, getattr(self, "db", None))
            try:  # the SELECT of the connect failed: the connection is still on db 0, with nothing pending
                self.send_command("CONFIG", "GET", "databases")  # type: ignore[attr-defined]
                setattr(exc, DATABASES_ATTR, _databases(super().read_response()))  # type: ignore[misc]
            except rx.RedisError:
                setattr(exc, DATABASES_ATTR, None)  # refused (ACL), or the connection went: unknown
            raise


class AsyncNamedServerConnection:
    """Mixin for redis.asyncio's connections (see the module)."""

    _kvstatus_connecting = False

    async def on_connect_check_health(self, *args: object, **kwargs: object) -> object:
        self._kvstatus_connecting = True
        try:
            return await super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._kvstatus_connecting = False

    async def read_response(self, *args: object, **kwargs: object) -> object:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except rx.InvalidResponse as exc:
            setattr(exc, SERVER_ATTR, _server(self))
            raise
        except rx.ResponseError as exc:
            if not self._kvstatus_connecting or OUT_OF_RANGE not in str(exc):
                raise
            setattr(exc, SERVER_ATTR, _server(self))
            setattr(exc, DB_ATTR, getattr(self, "db", None))
            try:
                await self.send_command("CONFIG", "GET", "databases")  # type: ignore[attr-defined]
                setattr(exc, DATABASES_ATTR, _databases(await super().read_response()))  # type: ignore[misc]
            except rx.RedisError:
                setattr(exc, DATABASES_ATTR, None)
            raise
