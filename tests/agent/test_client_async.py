"""AsyncAgentClient when things go wrong: used from another event loop or after its own
closed, closed while the agent does not read or while answers are awaited, a request the
agent does not answer in time, the connection lost in the middle of a pipeline. Against an
in-process AgentServer (nothing delivered: the cluster is unreachable) and scripted daemons."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from interop_broker import free_port
from test_client_writes import StalledDaemon, stalled  # noqa: F401 (a fixture)

from tidelog.agent import (
    Agent,
    AgentClosedError,
    AgentError,
    AgentServer,
    AsyncAgentClient,
    EventFormatError,
    EventId,
)


def released(daemon: StalledDaemon) -> None:
    """Let the stalled daemon read: it reads to the end of the connection, which the client
    closed (and its thread is done with its listener before the fixture closes it)."""
    daemon.release.set()
    assert daemon.finished.wait(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """The socket of an AgentServer in this process."""
    agent = Agent(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    )
    server = AgentServer(agent, tmp_path / "agent.sock")
    server.start()
    try:
        yield tmp_path / "agent.sock"
    finally:
        server.stop()
        agent.close()


def test_a_client_used_after_its_event_loop_closed_says_so(served: Path) -> None:
    async def first() -> AsyncAgentClient:
        client = await AsyncAgentClient.connect(served)
        assert await client.send("t", b"a", partition=0) == EventId("t", 0, 0)
        return client

    client = asyncio.run(first())  # closing the loop ends the client's reads

    async def second() -> None:
        with pytest.raises(AgentClosedError, match="event loop this client connected on"):
            await asyncio.wait_for(client.send("t", b"b", partition=0), 5)
        await asyncio.wait_for(client.close(), 5)

    asyncio.run(second())


def test_a_client_used_from_another_event_loop_says_so(served: Path) -> None:
    async def run() -> None:
        client = await AsyncAgentClient.connect(served)
        try:

            async def elsewhere() -> Any:
                return await asyncio.wait_for(client.send("t", b"b", partition=0), 5)

            def in_thread() -> Any:
                try:
                    return asyncio.run(elsewhere())
                except BaseException as exc:
                    return exc

            outcome = await asyncio.to_thread(in_thread)
            assert isinstance(outcome, AgentClosedError), repr(outcome)
            assert "another" in str(outcome) or "other than" in str(outcome)
            # The client goes on serving its own loop.
            assert await client.send("t", b"c", partition=0) == EventId("t", 0, 0)
        finally:
            await client.close()

    asyncio.run(run())


def test_close_returns_while_the_agent_does_not_read(stalled: StalledDaemon) -> None:  # noqa: F811
    async def run() -> None:
        client = await AsyncAgentClient.connect(stalled.path)
        # More than the socket holds: the rest waits in the transport, the send in drain().
        sending = asyncio.create_task(client.send("t", b"x" * 2_000_000, partition=0))
        await asyncio.sleep(0)
        await asyncio.wait_for(client.close(), 5)
        with pytest.raises(AgentClosedError, match="the client is closed"):
            await asyncio.wait_for(sending, 5)

    asyncio.run(run())
    released(stalled)


def test_close_fails_what_waits_for_an_answer_and_what_comes_after(
    stalled: StalledDaemon,  # noqa: F811
) -> None:
    async def run() -> None:
        client = await AsyncAgentClient.connect(stalled.path)
        waiting = asyncio.create_task(client.send("t", b"x", partition=0))
        await asyncio.sleep(0)  # written whole; the agent never answers
        await asyncio.wait_for(client.close(), 5)
        with pytest.raises(AgentClosedError, match="the client is closed"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(AgentClosedError, match="the client is closed"):
            await asyncio.wait_for(client.send("t", b"y", partition=0), 5)

    asyncio.run(run())
    released(stalled)


def test_a_request_not_answered_in_time_raises_timeout(stalled: StalledDaemon) -> None:  # noqa: F811
    async def run() -> None:
        client = await AsyncAgentClient.connect(stalled.path, timeout=0.3)
        try:
            with pytest.raises(TimeoutError, match="no answer from the agent in time"):
                await client.send("t", b"x", partition=0)
        finally:
            await client.close()

    asyncio.run(run())
    released(stalled)


def test_a_pipeline_cut_off_by_a_lost_connection_leaves_no_error_unretrieved(
    tmp_path: Path,
) -> None:
    """The daemon goes away while sends wait in drain(): each send raises, and no future
    is left failed with nobody to see it ("Future exception was never retrieved")."""
    path = tmp_path / "hangup.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)  # then hang up, the rest of the pipeline unread

    threading.Thread(target=serve, daemon=True).start()

    async def run() -> list[str]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context["message"])
        )
        client = await AsyncAgentClient.connect(path)
        sends = [
            asyncio.create_task(client.send("t", b"x" * 100_000, partition=0)) for _ in range(50)
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 10)
        assert all(isinstance(outcome, AgentClosedError) for outcome in outcomes), outcomes
        await client.close()
        del sends, outcomes
        gc.collect()
        await asyncio.sleep(0)
        return reported

    try:
        assert asyncio.run(run()) == []
    finally:
        listener.close()


def test_a_client_left_open_when_its_loop_closes_closes_its_socket(served: Path) -> None:
    """The application forgets close(): the loop's end stops the client's reads, which
    closes its connection then, rather than leaving the socket to the garbage collector."""

    async def forgetful() -> None:
        client = await AsyncAgentClient.connect(served)
        assert await client.send("t", b"a", partition=0) == EventId("t", 0, 0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(forgetful())
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_pipeline_through_a_stop_learns_every_event_stored(tmp_path: Path) -> None:
    """Concurrent sends through a graceful stop: the daemon stops reading, so a write fails;
    the answers to what it had taken still come, and each of those events is reported
    stored. Exactly the events the agent stored are answered, the others fail with
    AgentClosedError, and asyncio logs nothing about the refused writes."""
    agent = Agent(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    )
    server = AgentServer(agent, tmp_path / "agent.sock")
    server.start()

    def stop_once_some_are_stored() -> None:
        while not any(row["appended"] >= 1000 for row in agent.status()):
            time.sleep(0.001)
        server.stop()

    async def run() -> tuple[list[Any], list[str]]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context["message"])
        )
        # Tens of thousands of sends are in flight when the stop comes, each timed from
        # its creation: on a loaded machine the last answers, or the close that fails the
        # rest, can take longer than a few seconds. What is checked is which answer each
        # send gets, not how fast; the bound only keeps a lost answer from hanging the run.
        client = await AsyncAgentClient.connect(tmp_path / "agent.sock", timeout=120)
        stopper = threading.Thread(target=stop_once_some_are_stored)
        stopper.start()
        sends: list[asyncio.Task[EventId]] = []
        try:
            while len(sends) < 500_000:  # until the stop refuses the writes
                sends.append(asyncio.create_task(client.send("t", b"value", partition=0)))
                if len(sends) % 100 == 0:
                    await asyncio.sleep(0)
                    if sends[-100].done() and sends[-100].exception() is not None:
                        break  # the stop refused the writes
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
        finally:
            await asyncio.to_thread(stopper.join, 10)
            await client.close()
        return outcomes, reported

    try:
        outcomes, reported = asyncio.run(run())
        stored = [o for o in outcomes if isinstance(o, EventId)]
        failed = [o for o in outcomes if not isinstance(o, EventId)]
        assert all(isinstance(o, AgentClosedError) for o in failed), failed[:3]
        assert failed, "the stop came after the last send"
        [row] = agent.status()
        assert len(stored) == row["appended"] >= 1000
        assert stored == [EventId("t", 0, n) for n in range(len(stored))]
        assert all(isinstance(o, EventId) for o in outcomes[: len(stored)])
        assert reported == []
    finally:
        server.stop()
        agent.close()


def test_send_many_stores_the_events_of_one_call_in_order(served: Path) -> None:
    async def run() -> None:
        client = await AsyncAgentClient.connect(served, timeout=30)
        try:
            assert await client.send_many("t", [], partition=0) == []
            with pytest.raises(AgentError, match="partition"):
                await client.send_many("t", [], partition=-5)
            with pytest.raises(EventFormatError):
                await client.send_many("t", [(None, b"ok"), ("key", b"v")], partition=0)  # type: ignore[list-item]
            events: list[tuple[bytes | None, bytes | None]] = [
                (b"k%d" % i, b"v%d" % i) for i in range(5000)
            ]
            first, second = await asyncio.gather(
                client.send_many("t", events, partition=0),
                client.send_many("t", events[:10], partition=1),
            )
            assert first == [EventId("t", 0, n) for n in range(5000)]
            assert second == [EventId("t", 1, n) for n in range(10)]
            assert await client.send("t", b"after", partition=0) == EventId("t", 0, 5000)
        finally:
            await client.close()

    asyncio.run(run())


def test_send_many_cut_by_a_stop_names_exactly_the_events_stored(tmp_path: Path) -> None:
    """A send_many whose write a graceful stop refuses part-way: once the agent's answers to
    what it took are in, the error's ``stored`` names each event it stored."""
    agent = Agent(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(tmp_path / "a")}
    )
    server = AgentServer(agent, tmp_path / "agent.sock")
    server.start()

    def stop_once_some_are_stored() -> None:
        while not any(row["appended"] for row in agent.status()):
            time.sleep(0.001)
        server.stop()

    async def run() -> AgentClosedError:
        client = await AsyncAgentClient.connect(tmp_path / "agent.sock", timeout=30)
        stopper = threading.Thread(target=stop_once_some_are_stored)
        stopper.start()
        try:
            with pytest.raises(AgentClosedError) as caught:
                await client.send_many("t", [(None, b"v" * 1000)] * 50_000, partition=0)
            with pytest.raises(AgentClosedError):
                await client.send("t", b"after", partition=0)
            return caught.value
        finally:
            await asyncio.to_thread(stopper.join, 10)
            await client.close()

    try:
        error = asyncio.run(run())
        stored = error.stored
        assert stored is not None and len(stored) == 50_000
        ids = [e for e in stored if e is not None]
        [row] = agent.status()
        assert 0 < len(ids) == row["appended"] < 50_000
        assert ids == [EventId("t", 0, n) for n in range(len(ids))]
        assert stored[len(ids) :] == [None] * (50_000 - len(ids))
    finally:
        server.stop()
        agent.close()


def test_a_send_many_cancelled_before_close_leaves_no_error_unretrieved(served: Path) -> None:
    """The usual shutdown: cancel the tasks, then close the client. The send_many's answers,
    failed by the close, are for nobody; nothing is reported as never retrieved."""

    async def run() -> list[str]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context["message"])
        )
        client = await AsyncAgentClient.connect(served, timeout=10)
        task = asyncio.create_task(
            client.send_many("t", [(None, b"v" * 100)] * 200_000, partition=0)
        )
        await asyncio.sleep(0.05)  # written in part, waiting in _drain
        task.cancel()
        await client.close()
        await asyncio.gather(task, return_exceptions=True)
        del task
        gc.collect()
        await asyncio.sleep(0.1)
        return reported

    assert asyncio.run(run()) == []
