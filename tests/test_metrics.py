"""Prometheus /metrics on every daemon of a real cluster, and the `cairn health` JSON contract.

Every daemon's URL is in cluster.json; each scrape parses with prometheus_client's own parser;
the OSDs' device and client-op latency histograms count the ops the test made, and the
monitor's health gauges follow a check raised by stopping an OSD."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cairn.client.cluster import Cluster
from tests.helpers import run

pytestmark = pytest.mark.cluster


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return {family.name: family for family in
                text_string_to_metric_families(response.read().decode())}


def samples(family, name, **labels):
    return [s.value for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def test_every_daemon_serves_metrics_and_health_follows_the_contract(local_cluster):
    cluster = local_cluster(hosts=3, config=("mon.osd_grace_s=3",
                                             "osd.heartbeat_interval_s=0.5"))
    cluster.cairn("pool", "create", "p", "--replicated", "3", "--pg-num", "8")

    async def writes():
        async with await Cluster.connect(cluster.dir) as client:
            for i in range(20):
                await client.pool("p").put(f"o{i}", bytes(10_000))
    run(writes())
    description = cluster.description
    urls = [entry["metrics"] for entry in description["mons"] + description["osds"]]
    assert all(url and url.startswith("http://") and url.endswith("/metrics") for url in urls)
    puts = 0
    for osd in description["osds"]:
        families = scrape(osd["metrics"])
        device = families["cairn_osd_device_latency_seconds"]
        writes_done = samples(device, "cairn_osd_device_latency_seconds_count", kind="write")
        assert writes_done and writes_done[0] >= 20            # every copy of every object
        inf = samples(device, "cairn_osd_device_latency_seconds_bucket", kind="write", le="+Inf")
        assert inf == writes_done
        ops = families.get("cairn_osd_op_latency_seconds")
        puts += sum(samples(ops, "cairn_osd_op_latency_seconds_count", op="put")) if ops else 0
        assert samples(families["cairn_osd_used_bytes"], "cairn_osd_used_bytes")[0] > 0
        # each new object's record is looked up in RocksDB once on every OSD holding it
        assert samples(families["cairn_osd_record_cache_misses"],
                       "cairn_osd_record_cache_misses_total")[0] >= 20
    assert puts == 20                                           # each put counted at its primary
    client_in = sum(samples(scrape(osd["metrics"])["cairn_osd_client_bytes"],
                            "cairn_osd_client_bytes_total", direction="in")[0]
                    for osd in description["osds"])
    assert client_in == 20 * 10_000                             # at the primaries only
    cluster.wait_for("pool usage reported", lambda: samples(scrape(
        description["mons"][0]["metrics"])["cairn_pool_objects"], "cairn_pool_objects",
        pool="p") == [20.0], 10)
    families = scrape(description["mons"][0]["metrics"])
    assert samples(families["cairn_pool_stored_bytes"], "cairn_pool_stored_bytes",
                   pool="p") == [200_000.0]
    assert samples(families["cairn_cluster_bytes"], "cairn_cluster_bytes", kind="used")[0] > 0
    code, report = cluster.cairn("health", "--json")
    assert code == 0 and report == {"status": "HEALTH_OK", "checks": {}}
    cluster.script("kill", "osd.1")
    cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], 20)
    _, report = cluster.cairn("health", "detail", "--json")
    assert set(report) == {"status", "checks"} and report["status"] == "HEALTH_WARN"
    down = report["checks"]["OSD_DOWN"]
    assert set(down) == {"severity", "summary", "detail", "since"}
    assert down["severity"] == "HEALTH_WARN" and any("osd.1" in line and "host h2" in line
                                                     for line in down["detail"]), down
    families = scrape(description["mons"][0]["metrics"])
    assert samples(families["cairn_health_status"], "cairn_health_status") == [1.0]
    assert samples(families["cairn_health_check"], "cairn_health_check", check="OSD_DOWN",
                   severity="HEALTH_WARN") == [1.0]
    assert samples(families["cairn_osds"], "cairn_osds", state="up") == [2.0]
