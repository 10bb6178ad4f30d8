"""Updates to one object's omap, combined while one is in flight (a client-side group commit).

An OSD applies one omap update to an object at a time: the object's lock is held from the
check of the update's conditions through every replica's commit (osd/service.py `_omap`).
So a directory that sixteen writers create files in would take one update per replicated
round trip, whatever the writers' number. Instead, updates to an object that arrive while
one to it is in flight wait here, and go together as one update when it returns: their sets
and removes together, their conditions together (every one must hold).

Each caller still sees what its own update would have met alone: if the combined update's
conditions fail, each update of the group is sent again alone, in order. The group applies as
the updates would one after another: conditions are checked before any of them applies (so an
update checking a key an earlier one changes waits for the next group), a key set by several
takes the last value (a directory's times, set by every create in it), and an update that
removes a key another sets, or sets one another removes, waits for the next group too; every
update after one that waits waits as well (order is kept). Updates with `create`, `clear`,
`if_version` or a prefix condition always go alone.
"""

import asyncio

from cairn.client.errors import PreconditionFailed
from cairn.common.limits import OMAP_UPDATE_BYTES_MAX

# One group at most: updates, keys set or removed or checked, and bytes (a header stays well
# under the frame's 1 MiB bound, and the update under the OSD's OMAP_UPDATE_BYTES_MAX).
GROUP_UPDATES_MAX = 128
GROUP_KEYS_MAX = 2048
GROUP_BYTES_MAX = OMAP_UPDATE_BYTES_MAX // 2


class _Waiting:
    __slots__ = ("header", "future", "sets", "removes", "checks", "size")

    def __init__(self, header, future):
        self.header = header
        self.future = future
        self.sets = {key for key, _ in header["set"]}
        self.removes = set(header["remove"])
        self.checks = {condition[1] for condition in header["if"]}
        self.size = sum(len(k) + len(v) for k, v in header["set"]) + \
            sum(map(len, header["remove"])) + \
            sum(len(c[1]) + (len(c[2]) if len(c) > 2 else 0) for c in header["if"])


def groupable(header):
    return not (header.get("create") or header.get("clear") or "if_version" in header or
                any(condition[0] == "none" for condition in header["if"]))


class OmapBatcher:
    """Per (pool, object): whether an update is in flight, and the updates waiting for it.
    `send(pool, name, header)` sends one omap update and returns the object's new version."""

    def __init__(self, send):
        self._send = send
        self._waiting = {}              # (pool, name) -> [_Waiting]; present while in flight
        self._tasks = set()
        self.groups_sent = 0            # combined updates sent (two or more in one)
        self.updates_grouped = 0        # updates that went in one
        self.groups_failed = 0          # groups whose conditions failed (then sent one by one)

    async def update(self, pool, name, header):
        key = (pool, name)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = []
            try:
                return await self._send(pool, name, header)
            finally:
                self._next(key)
        future = asyncio.get_running_loop().create_future()
        waiting.append(_Waiting(header, future))
        return await future

    def _next(self, key):
        """Send the next group for object `key`, or mark it idle."""
        waiting = self._waiting.get(key)
        while waiting and waiting[0].future.done():      # its caller was cancelled
            waiting.pop(0)
        if not waiting:
            self._waiting.pop(key, None)
            return
        group = [waiting.pop(0)]
        if groupable(group[0].header):
            first = group[0]
            sets, removes = set(first.sets), set(first.removes)
            keys, size = len(sets) + len(removes) + len(first.checks), first.size
            while waiting and len(group) < GROUP_UPDATES_MAX:
                item = waiting[0]
                if item.future.done():
                    waiting.pop(0)
                    continue
                if not groupable(item.header) or item.checks & (sets | removes) or \
                        item.removes & sets or item.sets & removes or \
                        keys + len(item.sets) + len(item.removes) + len(item.checks) > \
                        GROUP_KEYS_MAX or size + item.size > GROUP_BYTES_MAX:
                    break
                group.append(waiting.pop(0))
                sets |= item.sets
                removes |= item.removes
                keys += len(item.sets) + len(item.removes) + len(item.checks)
                size += item.size
        task = asyncio.ensure_future(self._send_group(key, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_group(self, key, group):
        pool, name = key
        try:
            if len(group) == 1:
                await self._settle(group[0], self._send(pool, name, group[0].header))
                return
            latest = {}                 # a key set by several: the last value, as in sequence
            for item in group:
                latest.update((key, value) for key, value in item.header["set"])
            header = {"op": "omap", "clear": False, "create": False,
                      "set": [[key, value] for key, value in latest.items()],
                      "remove": list(dict.fromkeys(k for item in group
                                                   for k in item.header["remove"])),
                      "if": [condition for item in group for condition in item.header["if"]]}
            self.groups_sent += 1
            self.updates_grouped += len(group)
            try:
                version = await self._send(pool, name, header)
            except PreconditionFailed as exc:
                # Some update's condition failed: each alone, so each meets its own outcome.
                self.groups_failed += 1
                for item in group:
                    await self._settle(item, self._send(pool, name, item.header),
                                       exc.maybe_applied)
                return
            except Exception as exc:
                for item in group:
                    if not item.future.done():
                        item.future.set_exception(exc)
                return
            except BaseException:
                for item in group:
                    item.future.cancel()
                raise
            for item in group:
                if not item.future.done():
                    item.future.set_result(version)
        finally:
            self._next(key)

    @staticmethod
    async def _settle(item, sending, maybe_applied=False):
        try:
            version = await sending
        except PreconditionFailed as exc:
            if not item.future.done():
                item.future.set_exception(
                    PreconditionFailed(str(exc), maybe_applied or exc.maybe_applied))
        except Exception as exc:
            if not item.future.done():
                item.future.set_exception(exc)
        except BaseException:
            item.future.cancel()
            raise
        else:
            if not item.future.done():
                item.future.set_result(version)
