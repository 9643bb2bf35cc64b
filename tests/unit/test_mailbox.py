"""The one-reader queue both ends of a stream use (protos/mailbox.py): items come out in the
order they went in, a waiting reader wakes on the next put, and a reader cancelled while it
waits loses nothing put after."""

from __future__ import annotations

import asyncio

import pytest

from protos.mailbox import Mailbox


async def test_items_come_out_in_order_and_a_waiting_reader_wakes() -> None:
    box: Mailbox[int] = Mailbox()
    assert not box
    box.put_nowait(1)
    box.put_nowait(2)
    assert box
    assert [await box.get(), await box.get()] == [1, 2]
    reader = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    assert not reader.done()
    asyncio.get_running_loop().call_soon(box.put_nowait, 3)
    assert await asyncio.wait_for(reader, 1.0) == 3
    assert not box


async def test_a_reader_cancelled_while_waiting_loses_nothing() -> None:
    box: Mailbox[str] = Mailbox()
    reader = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    box.put_nowait("kept")  # its waiter was cancelled: not woken, not an error
    assert box
    assert await asyncio.wait_for(box.get(), 1.0) == "kept"
