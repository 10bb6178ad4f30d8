"""Per-key mutual exclusion for one event loop, without a Lock object per key.

The OSD serialises work per object in one table per PG (`Pg.locks`, osd/pgs.py): a client
write holds its object's lock across its whole replication, recovery and rollbacks across
theirs. (The store keeps no locks: it plans transactions in the order they start, see
osd/store_plan.py.) Almost every acquisition finds the key free. An `asyncio.Lock` per key
cost a Lock object, a coroutine call to acquire it and another to release it, on every 4 KiB
op; here a free key costs one dict insert and one delete, and only a contended key makes a
future.

Rules:
1. A key is held by at most one owner. `acquire` returns at once when the key is free; else the
   caller waits in line, and `release` hands the key straight to the first waiter still
   waiting (strict FIFO: no later arrival overtakes a waiter, so writes to one object are
   applied in the order they arrived).
2. A waiter cancelled while waiting leaves the line; one cancelled just as the key was handed to
   it gives the key on at once, so a cancellation never strands a key.
3. `release` of a key not held is a bug (KeyError).
"""

import asyncio
import collections


class KeyLocks:
    def __init__(self):
        self._held = {}                 # key -> deque of waiting futures (empty: no waiters)

    def __len__(self):
        return len(self._held)

    def held(self, key):
        return key in self._held

    async def acquire(self, key):
        waiters = self._held.get(key)
        if waiters is None:
            self._held[key] = collections.deque()
            return
        future = asyncio.get_running_loop().create_future()
        waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)       # handed to us as we were cancelled: pass it on
            raise

    def take(self, key):
        """Hold a key that is free now (`held` said so), without waiting."""
        assert key not in self._held, key
        self._held[key] = collections.deque()

    def release(self, key):
        waiters = self._held[key]
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)     # the key is theirs now
                return
        del self._held[key]
