"""One client, one op at a time: the latency (p50, p90) of an omap update (plain and
conditional), an omap get, a 4 KiB put and a 4 KiB get on an idle cluster: what a file op
in one directory waits for (docs/perf/files.md).

    python cluster-scripts/op_latency.py CLUSTER_DIR META_POOL DATA_POOL [OPS]
"""
import asyncio
import sys
import time

from cairn.client.cluster import Cluster


async def main(cluster_dir, meta_pool, data_pool, ops):
    async with await Cluster.connect(cluster_dir) as cluster:
        meta, data = cluster.pool(meta_pool), cluster.pool(data_pool)
        await meta.put("op-latency-dir", b"")

        async def timed(label, op):
            took = []
            for k in range(ops):
                began = time.perf_counter()
                await op(k)
                took.append((time.perf_counter() - began) * 1e3)
            took.sort()
            print(f"{label}: p50 {took[ops // 2]:.2f} ms, p90 {took[int(ops * 0.9)]:.2f} ms")

        await timed("omap update", lambda k: meta.omap_update(
            "op-latency-dir", {b"e%06d" % k: b"v" * 60}))
        await timed("omap update, conditional", lambda k: meta.omap_update(
            "op-latency-dir", {b"f%06d" % k: b"v" * 60}, absent=[b"f%06d" % k]))
        await timed("omap get", lambda k: meta.omap_get("op-latency-dir", [b"e%06d" % k]))
        await timed("put 4 KiB", lambda k: data.put(f"op-latency-{k}", b"x" * 4096))
        await timed("get 4 KiB", lambda k: data.get(f"op-latency-{k}"))
        await meta.delete("op-latency-dir")
        for k in range(ops):
            await data.delete(f"op-latency-{k}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    asyncio.run(main(*sys.argv[1:4], int(sys.argv[4]) if len(sys.argv) == 5 else 300))
