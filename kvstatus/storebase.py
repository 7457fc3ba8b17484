"""What the sync and async stores share around their I/O: settings, topology
detection, and every decision of the send loop (what to resend after NOSCRIPT,
which delays a failover gets, how errors are translated). Each store's loop
performs those decisions with blocking calls or awaits, and nothing else.

Sending a request: one call goes out with ``execute_command``, several in one
non-transactional pipeline. Script calls that meet NOSCRIPT (a restart,
``SCRIPT FLUSH``, a new cluster node) are sent again after ``SCRIPT LOAD``;
if the script is gone again by then, they are sent with their source
(``EVAL``), which cannot meet NOSCRIPT. A cluster or Sentinel client that meets
an unavailable backend resends the whole request after each failover delay.

Observing (``metrics=``, :mod:`kvstatus.observer`): with an observer, each
call the loop sends is timed and its outcome or error reported
(:func:`observe_result`, :func:`observe_error`), and every resend counted;
without one the loop pays one attribute check.

Every call runs under a deadline (``ConnectionOptions.deadline``, plus
``CHUNK_SECONDS`` per further chunk of a batch): the store sets
:data:`kvstatus.deadline.DEADLINE` for its duration, kvstatus connections
cap every socket wait to the time left, and no resend starts whose backoff
would end past it. Clients whose pools cannot queue for a connection
(redis-py's cluster clients) pass a *gate* first: at most ``max_connections``
calls of one client run at a time, the others wait until their deadline.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, ClassVar, Optional, TypeVar

from redis.exceptions import NoScriptError

from kvstatus.clients import is_cluster_client, is_sentinel_client
from kvstatus.connection import (
    CONNECTION_FIELDS,
    DEFAULT_URL,
    ConnectionOptions,
    options_for,
    url_lease_ttl,
    url_script_mode,
)
from kvstatus.deadline import ClientPoolExhausted, may_wait
from kvstatus.keys import DEFAULT_PREFIX, KeySchema
from kvstatus.leases import LeaseCore, validate_lease_ttl
from kvstatus.nearcache import make_near_cache, near_cache_setting
from kvstatus.observer import StoreObserver, check_observer
from kvstatus.operations import (
    DEFAULT_TOMBSTONE_TTL_SECONDS,
    DEFAULT_TTL_SECONDS,
    Call,
    FunctionsCore,
    StoreCore,
    validate_script_mode,
)
from kvstatus.rule import Policy
from kvstatus.scripts import LuaScript
from kvstatus.translate import translate_error

S = TypeVar("S", bound="StoreBase")
T = TypeVar("T")


def failover_delays(client: Any, options: Optional[ConnectionOptions]) -> tuple[float, ...]:
    """Seconds to wait before each resend of a whole store call that met an unavailable backend.

    Only for cluster and Sentinel clients: redis-py surfaces a dead cluster
    node or a demoted Sentinel master at once ("The previous master is now a
    slave"), before the topology has moved. A standalone client already
    retries each command itself (same :class:`ConnectionOptions`), so it gets
    no second layer.
    """
    if not (is_cluster_client(client) or is_sentinel_client(client)):
        return ()
    return (options or ConnectionOptions()).retry_delays()


def gate_for(client: Any, options: ConnectionOptions, asynchronous: bool) -> Optional[Any]:
    """The semaphore that queues a cluster client's calls, shared by every store on ``client``; None elsewhere.

    redis-py's cluster clients have no blocking pool: a call past a node's ``max_connections`` fails at once.
    A store call holds at most one connection per node, so admitting ``max_connections`` calls at a time keeps
    every node's pool within its size.
    """
    if not is_cluster_client(client):
        return None
    made = asyncio.Semaphore(options.max_connections) if asynchronous \
        else threading.BoundedSemaphore(options.max_connections)
    return client.__dict__.setdefault("_kvstatus_gate", (made, options.max_connections))


def pool_exhausted(limit: int, waited: float) -> BaseException:
    """The error of a call that waited at the gate until its deadline (nothing was sent)."""
    return translate_error(ClientPoolExhausted(limit, waited))


class StoreBase:
    """Attributes common to :class:`~kvstatus.StatusStore` and :class:`~kvstatus.AsyncStatusStore`."""

    _connect: ClassVar[Callable[..., Any]]
    _asynchronous: ClassVar[bool]
    _keeper_class: ClassVar[Callable[..., Any]]

    def __init__(
        self,
        client: Any,
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: str | Policy = Policy.SEED,
        options: Optional[ConnectionOptions] = None,
        scripts: str = "eval",
        near_cache: Any = None,
        metrics: Optional[StoreObserver] = None,
        lease_ttl: Optional[float] = None,
        tombstone_ttl: float = DEFAULT_TOMBSTONE_TTL_SECONDS,
    ) -> None:
        """``scripts``: "eval" (EVALSHA; the client loads the scripts itself) or "functions" (FCALL of the
        library an admin loaded with ``kvstatus functions load``: what the tenant ACL recipe allows)."""
        self.client = client
        self.options = options or ConnectionOptions()
        self._failover_delays = failover_delays(client, self.options)
        self._deadline = self.options.deadline
        self._gate = gate_for(client, self.options, self._asynchronous)
        self._core = (FunctionsCore if validate_script_mode(scripts) == "functions" else StoreCore)(
            namespace=namespace,
            participant=participant,
            prefix=prefix,
            ttl=ttl,
            policy=policy,
            cluster=is_cluster_client(client),
            tombstone_ttl=tombstone_ttl,
        )
        self._functions = isinstance(self._core, FunctionsCore)  # every request goes out as FCALLs
        # metrics: an observer (kvstatus.observer.StoreObserver, e.g. kvstatus.observe.metrics.StoreMetrics) or None.
        self._metrics = check_observer(metrics)
        # near_cache: True or NearCacheOptions for a new cache (kvstatus.nearcache), a cache to share, or None.
        self._near = make_near_cache(near_cache, client, self._core.schema, self.options.retry_delays(),
                                     self._metrics)
        self._keeper: Any = None
        if lease_ttl is not None:
            # The record outlives the lease by the room TTL: a dead participant stays "lost" while its entries live.
            lease_ttl = validate_lease_ttl(lease_ttl)
            lease = LeaseCore(self._core.schema, self._core.participant, lease_ttl,
                              keep_ms=self._core.ttl_ms + round(lease_ttl * 1000))
            self._keeper = self._keeper_class(lease, self._send)

    @classmethod
    def from_url(
        cls: type[S],
        url: str = DEFAULT_URL,
        *,
        options: Optional[ConnectionOptions] = None,
        scripts: Optional[str] = None,
        near_cache: Any = None,
        **settings: Any,
    ) -> S:
        """Connect to ``url`` (see :mod:`kvstatus.connection`) and wrap the client.

        ``settings`` are this class's keyword arguments (``namespace``, ``participant``, ``ttl`` ...) and any
        :class:`ConnectionOptions` field, which overrides ``options``; the URL's own query options win over
        both. ``scripts`` None takes the URL's ``?scripts=`` option, else "eval"; ``near_cache`` None takes
        the URL's ``near_cache=true&near_cache_size=N``; ``lease_ttl`` None takes the URL's ``?lease_ttl=``
        (seconds in [3, 3600]; 0: no lease).
        """
        overrides = {name: settings.pop(name) for name in list(settings) if name in CONNECTION_FIELDS}
        opts = options_for(url, options, **overrides)
        mode = url_script_mode(url) if scripts is None else scripts
        if settings.get("lease_ttl") is None:
            settings["lease_ttl"] = url_lease_ttl(url)
        return cls(cls._connect(url, opts), options=opts, scripts=mode, near_cache=near_cache_setting(url, near_cache),
                   **settings)

    @property
    def namespace(self) -> str:
        return self._core.schema.namespace

    @property
    def prefix(self) -> str:
        return self._core.schema.prefix

    @property
    def participant(self) -> str:
        return self._core.participant

    @property
    def ttl(self) -> float:
        """Seconds: the least TTL each write of this store leaves on a room key (a longer one stays)."""
        return self._core.ttl_ms / 1000

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def lease(self) -> Optional[LeaseCore]:
        """This store's lease (participant, ttl, incarnation, generation, held, lost), or None without one."""
        return None if self._keeper is None else self._keeper.core

    @property
    def scripts(self) -> str:
        """How this store runs its Lua: "eval" (EVALSHA) or "functions" (FCALL)."""
        return "functions" if self._functions else "eval"

    @property
    def schema(self) -> KeySchema:
        """The :class:`~kvstatus.keys.KeySchema` of this store's namespace: how its keys are built and parsed."""
        return self._core.schema

    def for_participant(self, participant: str) -> Any:
        """A store with the same client and settings, writing as ``participant`` (with its own lease, if this one has one)."""
        metrics = None if self._metrics is None else self._metrics.for_participant(participant)
        lease_ttl = None if self._keeper is None else self._keeper.core.ttl
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options,
                          scripts=self.scripts, near_cache=self._near, metrics=metrics, lease_ttl=lease_ttl)

    @property
    def metrics(self) -> Optional[StoreObserver]:
        """The observer told of every call (:mod:`kvstatus.observer`), or None."""
        return self._metrics

    @property
    def near_cache(self) -> Any:
        """The :mod:`kvstatus.nearcache` cache serving this store's reads, or None."""
        return self._near

    def _wrote(self, rooms: Any) -> None:
        """Drop rooms this store wrote (or may have written) from its near cache: read-your-writes."""
        if self._near is not None:
            try:
                self._near.invalidate(list(rooms))
            except TypeError:
                pass  # not an iterable of rooms: the operation itself raised about it

    def _resent(self) -> None:
        """The send loop sends a call again (NOSCRIPT, failover): tell the observer."""
        if self._metrics is not None:
            self._metrics.on_resend()

    def _uncached(self, participant: str) -> Any:
        """A store on the same client reading ``participant``'s entry without the near cache (for wait_for)."""
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options,
                          scripts=self.scripts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


def observe_result(metrics: StoreObserver, operation: str, result: Any) -> None:
    """Tell ``metrics`` what a call returned: the rule's outcomes of ``update_status`` and ``update_many``."""
    if operation == "update_status":
        metrics.on_update(result)
    elif operation == "update_many":
        metrics.on_updates(result.values())


def observe_error(metrics: StoreObserver, exc: BaseException) -> None:
    """Tell ``metrics`` of an error raised to the caller; ``check_status``'s KeyError is an answer, not an error."""
    if not isinstance(exc, KeyError):
        metrics.on_error(exc)


def may_resend(delay: float) -> bool:
    """True if a resend after ``delay`` seconds still starts before the running call's deadline."""
    return may_wait(delay)


def noscript_resend(calls: list[Call], replies: list[Any], as_eval: bool) -> tuple[list[int], list[Call]]:
    """The script calls whose reply is NOSCRIPT: their indices, and the calls to send again in their place.

    ``as_eval`` False: the same EVALSHA (after SCRIPT LOAD of :func:`scripts_of` them);
    True: ``EVAL`` with the script's source, which no SCRIPT FLUSH can make fail.
    """
    indices = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError) and calls[i].script]
    return indices, [calls[i].as_eval() if as_eval else calls[i] for i in indices]


def scripts_of(calls: list[Call]) -> list[LuaScript]:
    """The distinct scripts of ``calls``, each to SCRIPT LOAD once."""
    return list({call.script.sha: call.script for call in calls if call.script}.values())


def merge(replies: list[Any], indices: list[int], resent: list[Any]) -> None:
    """Put the replies of resent calls in their places."""
    for i, reply in zip(indices, resent):
        replies[i] = reply


def checked(calls: list[Call], replies: list[Any]) -> list[Any]:
    """``replies`` if none is an error; else raise the first error as its kvstatus error."""
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            error = translate_error(reply, call)
            if error is reply:
                raise reply
            raise error from reply
    return replies
