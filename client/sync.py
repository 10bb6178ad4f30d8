"""A blocking wrapper around the client library, for code that is not asyncio.

    from cairn.client.sync import connect
    with connect("/var/tmp/c1") as cluster:
        pool = cluster.pool("checkpoints")
        pool.put("step-1000/rank-0", data)
        data = pool.get("step-1000/rank-0")
        for chunk in pool.get_stream("model.bin"): ...

It runs one event loop in a background thread and hands every call to it, so the same
connections and map subscription serve all calls; methods and errors are those of
`cairn.client.cluster` (typed errors from `cairn.client.errors`).
"""

import asyncio
import atexit
import threading

from cairn.client.cluster import OP_TIMEOUT_S_DEFAULT, Cluster, new_event_loop

# Clients not closed yet. At exit each is closed here, its loop thread stopped: a loop thread
# still running while the interpreter tears itself down can crash it (a test run that left
# four fsspec clients open ended in a segmentation fault after every test had passed).
_OPEN = set()
CLOSE_AT_EXIT_S = 2.0


@atexit.register
def _close_open_clients():
    for client in list(_OPEN):
        client._close_at_exit()


class SyncCluster:
    def __init__(self, where=None, op_timeout_s=OP_TIMEOUT_S_DEFAULT, name=None, keyring=None):
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cairn-client",
                                        daemon=True)
        self._thread.start()
        try:
            self._cluster = self.call(Cluster.connect(where, op_timeout_s=op_timeout_s,
                                                      name=name, keyring=keyring))
        except BaseException:
            self._stop_loop()
            raise
        _OPEN.add(self)

    def call(self, coroutine):
        """Run `coroutine` on the client's loop and return its result (or raise its error)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def map(self):
        return self._cluster.map

    def pool(self, name):
        return SyncPool(self, self.call(_pool(self._cluster, name)))

    def close(self):
        _OPEN.discard(self)
        try:
            self.call(self._cluster.close())
        finally:
            self._stop_loop()

    def _close_at_exit(self):
        """close(), bounded: the cluster may be gone by now."""
        _OPEN.discard(self)
        try:
            asyncio.run_coroutine_threadsafe(self._cluster.close(), self._loop).result(
                CLOSE_AT_EXIT_S)
        except Exception:           # gone, slow or failing: the loop stops regardless
            pass
        self._stop_loop(CLOSE_AT_EXIT_S)

    def _stop_loop(self, timeout_s=None):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


async def _pool(cluster, name):
    return cluster.pool(name)


class SyncPool:
    def __init__(self, owner, pool):
        self._owner = owner
        self._pool = pool
        self.name = pool.name

    def put(self, name, data):
        return self._owner.call(self._pool.put(name, data))

    def get(self, name, offset=0, length=None):
        return self._owner.call(self._pool.get(name, offset, length))

    def stat(self, name):
        return self._owner.call(self._pool.stat(name))

    def delete(self, name):
        return self._owner.call(self._pool.delete(name))

    def list(self, prefix="", page=None, limit=1000):
        return self._owner.call(self._pool.list(prefix, page, limit))

    def put_stream(self, name, source, **options):
        return self._owner.call(self._pool.put_stream(name, source, **options))

    def get_stream(self, name, **options):
        """An iterator over the object's bytes, chunk by chunk."""
        stream = self._pool.get_stream(name, **options)
        try:
            while True:
                try:
                    yield self._owner.call(stream.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._owner.call(stream.aclose())


def connect(where=None, op_timeout_s=OP_TIMEOUT_S_DEFAULT):
    """A SyncCluster connected to `where` (a cluster directory, cluster.json, monitor
    addresses, or $CAIRN_CLUSTER)."""
    return SyncCluster(where, op_timeout_s)
