"""flowerbed's ServerApp on a deployment: replies pulled every REPLY_POLL_S, a busy SuperLink's
server errors tried again, a refusal raised."""

from types import SimpleNamespace

import httpx
import pytest

from flowerbed.server.grid import poll_replies


class _Grid:
    """Pushes get ids; pulls answer after ``ready_after`` pulls, failing with ``errors`` first."""

    def __init__(self, errors: list[int], ready_after: int = 2) -> None:
        self.errors = list(errors)
        self.ready_after = ready_after
        self.pulls = 0

    def push_messages(self, messages):
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids):
        self.pulls += 1
        if self.errors:
            status = self.errors.pop(0)
            request = httpx.Request("POST", "https://superlink/v1/runtime/pull-messages")
            raise httpx.HTTPStatusError(
                "busy", request=request, response=httpx.Response(status, request=request)
            )
        if self.pulls < self.ready_after:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]


def test_replies_are_collected_and_server_errors_tried_again():
    grid = _Grid(errors=[500, 503], ready_after=4)
    replies = poll_replies(grid, [object(), object()], timeout=30, poll_s=0.001)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    assert grid.pulls == 4  # two server errors, one empty pull, the replies


def test_a_refusal_is_raised_and_a_timeout_ends_the_wait():
    with pytest.raises(httpx.HTTPStatusError):
        poll_replies(_Grid(errors=[403]), [object()], timeout=30, poll_s=0.001)
    late = _Grid(errors=[], ready_after=10**9)
    assert poll_replies(late, [object()], timeout=0.05, poll_s=0.01) == []
