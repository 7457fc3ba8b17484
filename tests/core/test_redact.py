"""Password masking by parsing (issue 9, item 9): generated passwords of any characters, on every URL scheme,
through every place that prints a URL."""

from __future__ import annotations

from urllib.parse import quote

import fakeredis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvstatus.connection import _BUILDERS
from kvstatus.errors import InvalidArgumentError, mask_url
from kvstatus.keys import validate_name
from kvstatus.url import SENTINEL_SCHEMES, parse_url
from tests.helpers.cli import invoke

MARK = "Qz7"
"""Wraps every generated password, and every character of some: a leaked piece of one shows the mark."""

SCHEMES = sorted(_BUILDERS)
raw = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
password = st.one_of(
    raw.map(lambda t: MARK + t + MARK),
    raw.map(lambda t: MARK + MARK.join(t) + MARK),
    st.sampled_from(
        [
            f"{MARK}a b{MARK}",
            f"{MARK}\t{MARK}",
            f"{MARK}@/?#:{MARK}",
            f"{MARK}&x=1{MARK}",
            f"{MARK}é €{MARK}",
            f"{MARK}a@b@c{MARK}",
        ]
    ),
)


def url_with(scheme: str, secret: str, encode: bool, where: str, user: str = "worker") -> str:
    shown = quote(secret, safe="") if encode else secret
    host = "/run/redis.sock" if scheme == "unix" else "127.0.0.1:1"
    path = "/svc/0" if scheme in SENTINEL_SCHEMES else ("" if scheme == "unix" else "/0")
    if where == "query":
        return f"{scheme}://{host}{path}?socket_timeout=1&sentinel_password={shown}"
    return f"{scheme}://{user}:{shown}@{host}{path}"


def assert_masked(text: str, secret: str) -> None:
    assert MARK not in text and secret not in text, text


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES), secret=password, encode=st.booleans(), where=st.sampled_from(["userinfo", "query"])
)
@example(scheme="redis", secret=f"{MARK} {MARK}", encode=False, where="userinfo")  # whitespace: failed before
@example(scheme="redis", secret=f"{MARK}\t{MARK}", encode=False, where="userinfo")
@example(scheme="redis", secret=f"{MARK}[{MARK}]{MARK}", encode=False, where="userinfo")  # urllib quoted "[Qz7]"
def test_no_piece_of_a_password_survives_masking_or_url_errors(
    scheme: str, secret: str, encode: bool, where: str
) -> None:
    url = url_with(scheme, secret, encode, where)
    assert_masked(mask_url(url), secret)
    assert_masked(mask_url(f"error talking to {url}: refused"), secret)
    try:
        parsed = parse_url(url)
    except InvalidArgumentError as exc:
        assert_masked(str(exc), secret)
    else:
        assert_masked(repr(parsed), secret)
        assert_masked(parsed.masked, secret)
    with pytest.raises(InvalidArgumentError) as info:
        validate_name(url, "namespace")  # a URL pasted into --namespace
    assert_masked(str(info.value), secret)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(SCHEMES), secret=password, encode=st.booleans(), where=st.sampled_from(["userinfo", "query"])
)
@example(scheme="redis", secret=f"{MARK} {MARK}", encode=False, where="userinfo")
def test_cli_never_prints_a_password(scheme: str, secret: str, encode: bool, where: str) -> None:
    url = url_with(scheme, secret, encode, where)
    server = fakeredis.FakeServer()
    connect = lambda _: fakeredis.FakeRedis(server=server)  # noqa: E731
    for argv in (
        ["--url", url, "--namespace", "prod-a", "doctor"],  # the connectivity line
        ["--url", url, "--namespace", "prod-a", "doctor", "--json"],
        ["--url", url, "--namespace", "prod-a", "get", "1"],
        ["--namespace", url, "get", "1"],
    ):  # the invalid-namespace message
        result = invoke(connect, *argv)
        assert result.exit_code in (0, 1, 2), result.output
        assert_masked(result.output + (result.stderr if result.stderr_bytes is not None else ""), secret)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://user:pa ss@h:1/0", "redis://user:***@h:1/0"),
        ("redis://user:p\tw@h:1/0", "redis://user:***@h:1/0"),
        ("redis://:s3cr3t@h:1/0", "redis://:***@h:1/0"),
        ("redis://alone@h:1/0", "redis://***@h:1/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        (
            "redis+sentinel://h:1/svc/0?sentinel%5Fpassword=a b&x=1",
            "redis+sentinel://h:1/svc/0?sentinel%5Fpassword=***",
        ),
        ("rediss://h:1/0?ssl_ca_certs=/ca.pem", "rediss://h:1/0?ssl_ca_certs=/ca.pem"),
    ],
)
def test_mask_url_examples(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_texts_without_urls_are_left_alone() -> None:
    text = "NOPERM User worker has no permissions to run the 'hset' command @user_script:12"
    assert mask_url(text) == text
