"""What a monitor's /metrics shows (common/metrics.py serves it): health checks as gauges, OSD
and PG counts, capacity and pool usage, packet loss and round trips per host pair, the map epoch
and leadership. Health,
PG states and network figures come from the OSDs' heartbeats, which go to the leader: a
follower shows its map's view only."""

from prometheus_client.core import GaugeMetricFamily

from cairn.mon import capacity, netloss, views

_STATUS = {"HEALTH_OK": 0, "HEALTH_WARN": 1, "HEALTH_ERR": 2}


def collect(monitor):
    report = views.health_report(monitor, views.mons_view(monitor))
    status = GaugeMetricFamily("cairn_health_status", "0 HEALTH_OK, 1 HEALTH_WARN, "
                               "2 HEALTH_ERR")
    status.add_metric([], _STATUS[report["status"]])
    yield status
    checks = GaugeMetricFamily("cairn_health_check", "1 for each health check raised",
                               labels=["check", "severity"])
    for name, check in report["checks"].items():
        checks.add_metric([name, check["severity"]], 1)
    yield checks
    cmap = monitor.map
    osds = GaugeMetricFamily("cairn_osds", "OSDs by state", labels=["state"])
    osds.add_metric(["total"], len(cmap.osds))
    osds.add_metric(["up"], sum(osd["up"] for osd in cmap.osds.values()))
    osds.add_metric(["in"], sum(osd["in"] for osd in cmap.osds.values()))
    yield osds
    pgs = GaugeMetricFamily("cairn_pgs", "PGs by state (from their primaries)",
                            labels=["state"])
    for state, count in views.pg_state_totals(monitor).items():
        pgs.add_metric([str(state)], count)
    yield pgs
    usage = capacity.df(cmap, monitor._capacity, views.pool_totals(monitor), views.ratios(monitor))
    raw = GaugeMetricFamily("cairn_cluster_bytes", "raw capacity of the OSDs that reported",
                            labels=["kind"])
    raw.add_metric(["total"], usage["raw"]["total_bytes"])
    raw.add_metric(["used"], usage["raw"]["used_bytes"])
    yield raw
    pool_objects = GaugeMetricFamily("cairn_pool_objects", "objects in each pool",
                                     labels=["pool"])
    pool_bytes = GaugeMetricFamily("cairn_pool_stored_bytes", "bytes stored in each pool "
                                   "(before replication or coding)", labels=["pool"])
    pool_quota = GaugeMetricFamily("cairn_pool_quota_ratio", "the larger of objects and bytes "
                                   "over the pool's quota (pools with a quota)", labels=["pool"])
    for pool in usage["pools"]:
        pool_objects.add_metric([pool["name"]], pool["objects"])
        pool_bytes.add_metric([pool["name"]], pool["stored_bytes"])
        if pool["quota_ratio"] is not None:
            pool_quota.add_metric([pool["name"]], pool["quota_ratio"])
    yield pool_objects
    yield pool_bytes
    yield pool_quota
    epoch = GaugeMetricFamily("cairn_map_epoch", "the cluster map epoch this monitor has")
    epoch.add_metric([], cmap.epoch)
    yield epoch
    leader = GaugeMetricFamily("cairn_mon_leader", "1 if this monitor leads")
    leader.add_metric([], int(views.mons_view(monitor)["leader"] == monitor.name))
    yield leader
    host_of = {osd_id: osd["location"].get("host") for osd_id, osd in cmap.osds.items()
               if osd["up"]}
    figures = netloss.pair_figures({osd_id: report for osd_id, report in monitor._net.items()
                                    if osd_id in host_of}, host_of)
    loss = GaugeMetricFamily("cairn_network_packet_loss_ratio", "UDP probes lost between two "
                             "hosts over the last 45 s", labels=["host_a", "host_b"])
    rtt = GaugeMetricFamily("cairn_network_rtt_seconds", "mean probe round trip between two "
                            "hosts over the last 20 s", labels=["host_a", "host_b"])
    for (a, b), (_, _, judged, lost, rtt_ms) in sorted(figures.items()):
        loss.add_metric([a, b], lost / judged if judged else 0.0)
        if rtt_ms is not None:
            rtt.add_metric([a, b], rtt_ms / 1e3)
    yield loss
    yield rtt
