"""How a supervising process (`cronhook up`, `cronhook scheduler --processes N`) tells a child
that stopped with it from one that left on its own (app/processes.py, Children.wait_until).

A stop sent to the whole process group (a terminal's Ctrl-C, systemd's stop) reaches parent
and children at once; a child answers it with exit 0, sometimes before the parent's loop has
run its own handler. Such a child is part of the stop, not a failure that makes the whole
service exit 1. Real child processes (`cronhook --help` exits 0 at once, an unknown verb 2)."""

from __future__ import annotations

import asyncio

import pytest

from app.processes import Children, ChildSpec

# A stop recorded by an earlier test would end every wait at once: these would then pass
# without reaching the code under test.
pytestmark = pytest.mark.usefixtures("no_stop_recorded")


async def exited_child(args: list[str]) -> Children:
    children = Children()
    proc = children.spawn(ChildSpec("quick", args))
    await asyncio.to_thread(proc.wait, 60)
    return children


async def test_a_child_that_stopped_just_before_the_parents_own_stop_is_part_of_it() -> None:
    children = await exited_child(["--help"])
    stop = asyncio.Event()
    # The parent's handler runs a moment after the child's exit is seen (a busy loop).
    asyncio.get_running_loop().call_later(0.2, stop.set)
    assert await children.wait_until(stop) is None


async def test_a_child_that_exits_0_while_the_parent_is_not_stopping_left_on_its_own() -> None:
    children = await exited_child(["--help"])
    assert await children.wait_until(asyncio.Event()) == ("quick", 0)


async def test_a_child_that_fails_is_reported_even_while_a_stop_is_coming() -> None:
    children = await exited_child(["no-such-verb"])
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    assert await children.wait_until(stop) == ("quick", 2)
