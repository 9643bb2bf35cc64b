"""A request's work against its client hanging up (proxy/doors/disconnect.py): work that
waits is cancelled, its own cleanup run, when the client leaves first, whether the
connection says so itself (the proxy's HTTP protocol's hook) or a task reads the disconnect
(any other server: work that needs no wait, a cache hit, is then answered without watching
the connection at all)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.doors.disconnect import until_disconnect
from proxy.doors.protocol import HANG_UP
from proxy.errors import ClientGone
from tests.leaks import Uploads, collector_off


class Client:
    """What the server has for a request whose body was read: the disconnect, when the
    client hangs up (`leave`)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.receives = 0
        self.scope: dict = {}

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> dict:
        self.receives += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_work_that_never_waits_is_answered_without_watching_the_client() -> None:
    client = Client()

    async def hit() -> str:
        return "answer"

    assert await until_disconnect(client, hit()) == "answer"  # type: ignore[arg-type]
    assert client.receives == 0  # no watcher task was made for it


@pytest.mark.parametrize("told_by", ["a watcher task", "the connection"])
async def test_work_that_waits_is_cancelled_when_the_client_leaves(told_by: str) -> None:
    client = Client() if told_by == "a watcher task" else Connection()
    cleaned = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()
        return "late"

    asyncio.get_running_loop().call_later(0.05, client.leave)
    with pytest.raises(ClientGone):
        await until_disconnect(client, slow())  # type: ignore[arg-type]
    assert cleaned.is_set()  # finished before ClientGone was raised
    if isinstance(client, Client):
        assert client.receives == 1
    else:
        assert client.watching == []  # no longer watched


async def test_work_that_waits_answers_when_the_client_stays() -> None:
    client = Client()

    async def run() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert await until_disconnect(client, run()) == 7  # type: ignore[arg-type]
    assert client.receives == 1  # it was watched while it waited


@pytest.mark.parametrize("told_by", ["a watcher task", "the connection"])
async def test_a_caller_cancelled_cancels_its_work(told_by: str) -> None:
    client = Client() if told_by == "a watcher task" else Connection()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(until_disconnect(client, slow()))  # type: ignore[arg-type]
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):  # its own cancellation, not ClientGone
        await caller
    await asyncio.sleep(0)
    assert cancelled.is_set()
    assert getattr(client, "watching", []) == []  # no longer watched


@pytest.mark.parametrize("told_by", ["a watcher task", "the connection"])
@pytest.mark.parametrize("waits", [False, True])
async def test_an_error_leaves_no_cycle_that_holds_the_request(waits: bool, told_by: str) -> None:
    # The error went on with until_disconnect's frame in its traceback, and that frame held
    # the task, which held the error: a cycle only a full collection frees. 22 OCR photos
    # refused at capacity kept 400 MiB of uploads in a proxy so, between full collections.
    uploads = Uploads()

    async def refused() -> None:
        _upload = uploads.new()
        if waits:
            await asyncio.sleep(0.01)
        raise RuntimeError("at capacity")

    with collector_off():
        with pytest.raises(RuntimeError, match="at capacity"):
            request = Client() if told_by == "a watcher task" else Connection()
            await until_disconnect(request, refused())  # type: ignore[arg-type]
        # The loop's handle that woke this test may hold the finished task until its step
        # ends; then the upload must be gone, with no collection.
        await asyncio.sleep(0)
        assert uploads.alive() == 0


class Connection:
    """A request behind the proxy's own protocol: the connection tells the callbacks watching
    it when it is lost (`leave`), and nothing reads `http.disconnect`."""

    def __init__(self) -> None:
        self.watching: list = []
        self.lost = False
        self.scope = {"extensions": {HANG_UP: self.watch}}

    def watch(self, hung_up):
        if self.lost:
            hung_up()
        self.watching.append(hung_up)
        return lambda: self.watching.remove(hung_up)

    def leave(self) -> None:
        self.lost = True
        for hung_up in list(self.watching):
            hung_up()

    async def receive(self) -> dict:
        raise AssertionError("nothing reads the disconnect behind the proxy's protocol")


async def test_behind_the_proxys_protocol_work_answers_and_stops_watching() -> None:
    connection = Connection()

    async def run() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert await until_disconnect(connection, run()) == 7  # type: ignore[arg-type]
    assert connection.watching == []
    connection.leave()  # a hang-up after the answer touches nothing


async def test_behind_the_proxys_protocol_a_connection_already_lost_never_runs_the_work() -> None:
    connection = Connection()
    connection.leave()
    ran: list[int] = []

    async def work() -> None:
        ran.append(1)

    with pytest.raises(ClientGone):
        await until_disconnect(connection, work())  # type: ignore[arg-type]
    assert ran == []
