"""The resends' last error says why the attempts before it failed: a call that met a Redis loading its data
(``LOADING``) and then ran out of time ends in a timeout, whose own text says only that the deadline passed."""

from __future__ import annotations

import asyncio
from typing import Callable

import pytest
import redis.exceptions as rx
from redis.backoff import ExponentialBackoff

from kvstatus.deadline import AsyncDeadlineRetry, DeadlineRetry
from kvstatus.errors import BackendUnavailableError
from kvstatus.translate import translate_error

LOADING = "Redis is loading the dataset in memory"
EXPIRED = "the call's deadline passed (ConnectionOptions.deadline)"
Resend = Callable[[list[Exception]], BaseException]
"""Runs one call whose attempts raise the errors given, in turn; returns the error the call ended with."""


def _never_final(error: Exception, failures: int) -> bool:
    return False


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.001, base=0.001)


def _sync(errors: list[Exception]) -> BaseException:
    def attempt() -> None:
        raise errors.pop(0)

    with pytest.raises(rx.RedisError) as raised:
        DeadlineRetry(_backoff(), 2, _never_final).call_with_retry(attempt, lambda error: None)
    return raised.value


def _async(errors: list[Exception]) -> BaseException:
    async def attempt() -> None:
        raise errors.pop(0)

    async def nothing(error: Exception) -> None:
        return None

    async def run() -> BaseException:
        with pytest.raises(rx.RedisError) as raised:
            await AsyncDeadlineRetry(_backoff(), 2, _never_final).call_with_retry(attempt, nothing)
        return raised.value

    return asyncio.run(run())


@pytest.mark.parametrize("resend", [_sync, _async], ids=["sync", "async"])
def test_a_timeout_after_loading_replies_names_the_loading(resend: Resend) -> None:
    last = resend([rx.BusyLoadingError(LOADING), rx.BusyLoadingError(LOADING), rx.TimeoutError(EXPIRED)])
    error = translate_error(last)
    assert isinstance(error, BackendUnavailableError)
    assert str(error).endswith(f"{EXPIRED} (an earlier attempt: {LOADING})"), str(error)


@pytest.mark.parametrize("resend", [_sync, _async], ids=["sync", "async"])
def test_timeouts_alone_add_nothing_and_the_last_reply_speaks_for_itself(resend: Resend) -> None:
    timeouts = resend(
        [rx.TimeoutError("Timeout reading"), rx.TimeoutError("Timeout reading"), rx.TimeoutError(EXPIRED)]
    )
    assert str(translate_error(timeouts)).endswith(f"): {EXPIRED}")
    loading = resend(
        [rx.TimeoutError("Timeout reading"), rx.TimeoutError("Timeout reading"), rx.BusyLoadingError(LOADING)]
    )
    assert str(translate_error(loading)).endswith(f"): {LOADING}")
