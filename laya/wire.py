"""Commands on a connection held by one caller, for the paths a producer waits on.

redis-py's command methods check a connection out of the pool, wrap the call in
retries, record metrics and run a reply callback on every call. On the 2-core
development machine that is about 40 µs of CPU per call on top of a loopback
round trip of about 75 µs (a PING through ``Redis.ping`` took 122 µs at p50,
the same PING on a held connection 81 µs). The router's read → route → commit
loop and ``Client.ask`` put two or three commands on the path between a submit
and its answer, so they send them here: raw replies (lists and bytes, as
hiredis parses them), several commands in one write, replies read in order.

A connection error is raised to the caller, with no retry: the connection is
closed, and the next exchange reconnects (to the current primary, with a
Sentinel URL).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from redis import Redis
    from redis.connection import ConnectionPool
    from redis.typing import EncodableT

__all__ = ["Command", "Wire"]

Command = Sequence["EncodableT"]


class Replies:
    """The replies of one exchange, read one at a time in the order the commands were sent."""

    def __init__(self, connection: Any, count: int) -> None:
        self._connection = connection
        self.unread = count

    def next(self) -> Any:
        """The next reply; an error reply raises its :class:`ResponseError` (the reply is consumed)."""
        try:
            reply = self._connection.read_response()
        except ResponseError:
            self.unread -= 1
            raise
        self.unread -= 1
        return reply


class Wire:
    """A connection taken from ``redis``'s pool, for one thread at a time.

    ``held=True`` keeps it for the life of the object (a loop that calls many
    times); otherwise each exchange checks one out and returns it, so the
    object may be shared between threads like a ``Redis`` client.
    """

    def __init__(self, redis: Redis, *, held: bool = False) -> None:
        self._pool: ConnectionPool = redis.connection_pool
        self._hold = held
        self._held: Any = None  # taken at the first exchange; redis-py leaves a connection's methods untyped

    @contextmanager
    def exchange(self, commands: Sequence[Command]) -> Iterator[Replies]:
        """Send ``commands`` in one write; the block reads their replies.

        A block that ends with replies unread (it returned early, or a reply
        raised) closes the connection: a command still running on the server,
        such as a blocking pop, must not answer the connection's next user.
        """
        connection: Any = self._held if self._held is not None else self._pool.get_connection()
        if self._hold:
            self._held = connection
        replies = Replies(connection, len(commands))
        try:
            # Reconnect here, not in the send: a Sentinel-managed connection asks the Sentinels for the
            # primary only in connect(), and the send would reconnect to the address it had (the dead
            # primary, or a restarted one that is empty). A connected connection returns at once.
            connection.connect()
            connection.send_packed_command(connection.pack_commands(commands))
            yield replies
        finally:
            if replies.unread:
                connection.disconnect()
            if not self._hold:
                self._pool.release(connection)

    def call(self, *command: EncodableT) -> Any:
        """One command, its raw reply."""
        with self.exchange([command]) as replies:
            return replies.next()

    def close(self) -> None:
        if self._held is not None:
            self._pool.release(self._held)
            self._held = None
