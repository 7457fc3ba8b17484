"""URL parsing, every topology's form, and password masking: no connection is made."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from kvstatus.connection import connect
from kvstatus.errors import InvalidURLError, mask_url
from kvstatus.url import ConnectionOptions, parse_url

SECRET = "s3cr3t-Pa55"
TLS_FIELDS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
SENTINEL_SECRET = "Sentinel-s3cret"


@pytest.mark.parametrize(
    "url, hosts, db, username, password",
    [
        ("redis://localhost:6379/0", (("localhost", 6379),), 0, None, None),
        ("redis://h", (("h", 6379),), 0, None, None),
        ("redis://:pw@h:7000/3", (("h", 7000),), 3, None, "pw"),
        ("redis://user:p%40ss@h:7000", (("h", 7000),), 0, "user", "p@ss"),
        ("rediss://[::1]:6380/1", (("::1", 6380),), 1, None, None),
        ("redis://h:1/?db=5", (("h", 1),), 5, None, None),
    ],
)
def test_parse_url_accepts_the_documented_forms(url, hosts, db, username, password) -> None:
    parsed = parse_url(url)
    assert (parsed.hosts, parsed.db, parsed.username, parsed.password) == (hosts, db, username, password)


def test_parse_unix_url() -> None:
    parsed = parse_url("unix:///run/redis.sock?db=2")
    assert (parsed.path, parsed.db, parsed.hosts) == ("/run/redis.sock", 2, ())


@pytest.mark.parametrize(
    "url, complaint",
    [
        ("http://h:6379", "unsupported scheme 'http'"),
        ("redis://h:notaport", "bad port"),
        ("redis://h:70000", "bad port"),
        ("redis://h/abc", "database is not a number"),
        ("redis://h?colour=red", "unknown option 'colour'"),
        ("redis://h?socket_timeout=soon", "bad value for option 'socket_timeout'"),
        ("rediss://h?ssl_check_hostname=maybe", "bad value for option 'ssl_check_hostname'"),
        ("unix://", "needs a socket path"),
        ("", "expected a string"),
        ("redis://a:1,b:2", "takes one host"),
    ],
)
def test_bad_urls_name_the_problem(url: str, complaint: str) -> None:
    with pytest.raises(InvalidURLError, match=complaint):
        connect(url)


def test_bad_url_errors_never_show_the_password() -> None:
    for url in (
        f"redis://user:{SECRET}@h:bad",
        f"redis://:{SECRET}@h?nope=1",
        f"ftp://u:{SECRET}@h",
        # Unencoded / ? # @ in a password move urlsplit's boundaries; no part of it may show.
        "redis://:Ab/s3cr3t-Pa55==@127.0.0.1:1/0",
        "redis://:Ab?s3cr3t-Pa55@127.0.0.1:1/0",
        "redis://:Ab#s3cr3t-Pa55@127.0.0.1:1/0",
        "redis://:s3cr3t@-Pa55@127.0.0.1:x/0",
        "redis://us/er:s3cr3t-Pa55@127.0.0.1:x/0",
    ):
        with pytest.raises(InvalidURLError) as info:
            connect(url)
        text = str(info.value)
        assert "s3cr3t" not in text and "Pa55" not in text and "***" in text, text


def test_mask_url_hides_passwords_only() -> None:
    assert mask_url(f"redis://user:{SECRET}@h:1/0") == "redis://user:***@h:1/0"
    assert mask_url("redis://h:1/0") == "redis://h:1/0"
    assert SECRET not in repr(parse_url(f"rediss://:{SECRET}@h:1"))


def test_retry_budget_is_documented_in_seconds() -> None:
    options = ConnectionOptions()
    assert options.retry_budget() == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.6)


@pytest.mark.parametrize(
    "url, scheme, hosts, service, db",
    [
        ("redis+cluster://a:7000,b:7001", "redis+cluster", (("a", 7000), ("b", 7001)), None, 0),
        ("rediss+cluster://u:pw@a:7000?ssl_ca_certs=/ca.pem", "rediss+cluster", (("a", 7000),), None, 0),
        (
            "redis+sentinel://s1:26379,s2:26380/mymaster",
            "redis+sentinel",
            (("s1", 26379), ("s2", 26380)),
            "mymaster",
            0,
        ),
        (
            "rediss+sentinel://:pw@s1:26379/prod-redis/2?sentinel_password=x",
            "rediss+sentinel",
            (("s1", 26379),),
            "prod-redis",
            2,
        ),
    ],
)
def test_cluster_and_sentinel_urls_parse(url: str, scheme: str, hosts: Any, service: Any, db: int) -> None:
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.hosts, parsed.service, parsed.db) == (scheme, hosts, service, db)
    assert parsed.tls is scheme.startswith("rediss")


@pytest.mark.parametrize(
    "url, complaint",
    [
        ("redis+sentinel://s1:26379", "needs /service_name"),
        ("redis+sentinel://s1:26379/mymaster/x", "database is not a number"),
        ("redis+cluster://a:7000/3", "only database 0"),
        ("redis://h?sentinel_password=x", "sentinel_\\* options need redis\\+sentinel://"),
        ("unix:///tmp/r.sock?sentinel_username=x", "sentinel_\\* options need redis\\+sentinel://"),
        ("unix:///tmp/r.sock?db=-1", "database is not a number"),
        ("unix:///tmp/r.sock?db=2147483648", "database 2147483648 out of range"),
        ("redis+cluster://a:notaport", "bad port"),
    ],
)
def test_bad_topology_urls_name_the_problem(url: str, complaint: str) -> None:
    with pytest.raises(InvalidURLError, match=complaint):
        parse_url(url)


def test_every_password_is_masked() -> None:
    url = f"rediss+sentinel://user:{SECRET}@s1:1,s2:2/svc/0?sentinel_username=s&sentinel_password={SENTINEL_SECRET}"
    for text in (mask_url(url), repr(parse_url(url)), parse_url(url).masked):
        assert SECRET not in text and SENTINEL_SECRET not in text
    assert mask_url(url).endswith("sentinel_password=***")
    with pytest.raises(InvalidURLError) as info:
        parse_url(url.replace("svc/0", "svc/zero"))
    assert SECRET not in str(info.value) and SENTINEL_SECRET not in str(info.value)


def test_tls_options_pass_through() -> None:
    client = connect("rediss://a:1?ssl_ca_certs=/ca&ssl_certfile=/c&ssl_keyfile=/k&ssl_check_hostname=false")
    pool = client.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)
    assert {name: value for name, value in pool.connection_kwargs.items() if name in TLS_FIELDS} == {
        "ssl_ca_certs": "/ca",
        "ssl_certfile": "/c",
        "ssl_keyfile": "/k",
        "ssl_check_hostname": False,
    }


def test_an_unencoded_slash_in_a_password_is_refused_without_showing_any_of_it() -> None:
    """urlsplit ends the user info at the first '/': the rest of the password would become the path."""
    for url in ("unix://user:Qz7/Qz7@/tmp/redis.sock", "redis://user:1/Qz7@host:6379/0"):
        with pytest.raises(InvalidURLError) as caught:
            parse_url(url)
        assert "Qz7" not in str(caught.value) and "percent-encode" in str(caught.value)


def test_from_url_settles_connection_options_once_url_last() -> None:
    """The store's own resends and deadline use the same options as its client: the URL's query wins."""
    from kvstatus import StatusStore

    store = StatusStore.from_url(
        "redis://127.0.0.1:1/0?deadline=2.5&retries=2", namespace="u", retries=4, socket_timeout=1.5, ttl=5
    )
    assert (store.options.deadline, store.options.retries, store.options.socket_timeout) == (2.5, 2, 1.5)
    assert store.ttl == 5 and store.namespace == "u"
    with pytest.raises(TypeError, match="bogus"):
        StatusStore.from_url("redis://127.0.0.1:1/0", namespace="u", bogus=1)
