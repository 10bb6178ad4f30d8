"""cairn's client library. The names a newcomer reaches for first:

    from cairn.client import Cluster, connect

    async with await connect("/var/tmp/c1") as cluster:     # a cluster dir, or monitor addrs
        pool = cluster.pool("data")
        await pool.put("a", b"bytes")
        await pool.put_many({"b": b"1", "c": b"2"})          # grouped by primary OSD
        print(await pool.get_many(["a", "b", "c"]))

The rest lives in `cairn.client.cluster` (Cluster, Pool, ObjectStat) and `cairn.client.errors`.
Imported on first use, so `import cairn.client.cli` does not pay for the library.
"""

__all__ = ["Cluster", "Pool", "ObjectStat", "connect", "errors"]


async def connect(where=None, **options):
    """`Cluster.connect(where, **options)`: a connected Cluster (use it with `async with`)."""
    from cairn.client.cluster import Cluster
    return await Cluster.connect(where, **options)


def __getattr__(name):
    if name in ("Cluster", "Pool", "ObjectStat"):
        from cairn.client import cluster
        return getattr(cluster, name)
    if name == "errors":
        import importlib
        return importlib.import_module("cairn.client.errors")
    raise AttributeError(f"module 'cairn.client' has no attribute {name!r}")
