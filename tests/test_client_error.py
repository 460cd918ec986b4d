"""One place says what a client is told of a failure: a request error keeps its code,
anything else is `internal`; our bugs are named by their class, our own errors keep
their words."""

from __future__ import annotations

from navi_trio.errors import (
    ForbiddenError,
    InternalError,
    TaskRejectedError,
    UnavailableError,
    client_error,
)


def test_a_request_error_is_told_as_it_is() -> None:
    refused = ForbiddenError("not your session", request_id=7, session_id="s1")
    assert client_error(refused) is refused
    shutting = UnavailableError("the daemon is shutting down")
    assert client_error(shutting) is shutting and shutting.code == "internal"


def test_a_bug_is_internal_and_named_by_its_class() -> None:
    told = client_error(KeyError("a bug"))
    assert isinstance(told, InternalError) and told.code == "internal"
    assert str(told) == "internal error: KeyError: 'a bug'"
    assert told.request_id is None and told.session_id is None


def test_our_own_error_without_a_wire_code_is_internal_in_its_own_words() -> None:
    told = client_error(TaskRejectedError("too many background tasks (8)"))
    assert (told.code, str(told)) == ("internal", "too many background tasks (8)")
