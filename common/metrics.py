"""Prometheus `/metrics` for every daemon (`--metrics-port`).

aiohttp serves the text format that prometheus_client renders from one collector per daemon;
the collector reads the daemon's own counters when scraped, so metrics cost nothing per op.
Names follow Prometheus conventions: `cairn_<daemon>_..._total` for counters, `_seconds` and
`_bytes` for units. A scrape that fails answers 500 and the daemon serves on.
"""

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily

from cairn.native import latency


class _Collector:
    def __init__(self, collect):
        self._collect = collect

    def collect(self):
        return self._collect()


async def serve(ip, port, collect):
    """Serve /metrics on ip:port (0: any free port) from `collect()` (an iterable of metric
    families); (the aiohttp runner to clean up, the URL)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(collect))

    async def metrics(request):
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, ip, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{ip}:{bound}/metrics"


def histogram(name, documentation, labels, series):
    """A HistogramMetricFamily from [(label values, counts per latency.BUCKETS, sum seconds)]:
    bucket b of native/latency.py becomes the cumulative count at le = its upper bound."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    bounds = [latency.bucket_bounds_s(index)[1] for index in range(latency.BUCKETS - 1)]
    for values, counts, sum_s in series:
        cumulative = np.cumsum(np.asarray(counts, dtype=np.uint64)).tolist()
        buckets = [(f"{bound:g}", cumulative[index]) for index, bound in enumerate(bounds)]
        buckets.append(("+Inf", cumulative[-1]))
        family.add_metric(list(values), buckets, sum_s)
    return family


class OpLatency:
    """Latency histograms of named operations, in native/latency.py's buckets: counts are
    Python lists (one list increment per client op; a numpy element increment cost ten times
    as much), turned into arrays when scraped."""

    def __init__(self):
        self._counts = {}
        self._sums = {}

    def record(self, name, latency_ns):
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = [0] * latency.BUCKETS
            self._sums[name] = 0
        counts[latency.bucket(latency_ns)] += 1
        self._sums[name] += latency_ns

    def series(self):
        return [((name,), np.asarray(counts, np.uint64), self._sums[name] / 1e9)
                for name, counts in sorted(self._counts.items())]
