"""What an OSD's /metrics shows (common/metrics.py serves it): device ops, bytes and latency,
client op latency and ops in progress, store commits, capacity, recovery, PG states."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cairn.common import config
from cairn.common.metrics import histogram
from cairn.native import latency


def collect(daemon):
    labels = {"osd": str(daemon.id)}
    device = daemon.device
    ops = CounterMetricFamily("cairn_osd_device_ops", "device operations completed or queued",
                              labels=["osd", "kind"])
    for kind, count in device.ops_total.items():
        ops.add_metric([labels["osd"], kind], count)
    yield ops
    moved = CounterMetricFamily("cairn_osd_device_bytes", "bytes read from and written to the "
                                "device", labels=["osd", "kind"])
    for kind, count in device.bytes_total.items():
        moved.add_metric([labels["osd"], kind], count)
    yield moved
    snapshot = device.latency_snapshot()
    yield histogram("cairn_osd_device_latency_seconds", "device op latency (queued to reaped)",
                    ["osd", "kind"],
                    [((labels["osd"], kind), snapshot.counts[index].sum(axis=0),
                      int(snapshot.sum_ns[index].sum()) / 1e9)
                     for index, kind in enumerate(latency.KINDS)])
    yield histogram("cairn_osd_op_latency_seconds", "client op latency at the OSD",
                    ["osd", "op"], [((labels["osd"], *values), counts, sum_s)
                                    for values, counts, sum_s in daemon.service.op_latency.series()])
    complaint_s = config.value(daemon.monc.map.config, "osd.op_complaint_s")
    slow = GaugeMetricFamily("cairn_osd_slow_ops", f"client ops in progress for more than the "
                             f"complaint time ({complaint_s:g} s)", labels=["osd"])
    slow.add_metric([labels["osd"]], daemon.service.ops_older_than(complaint_s))
    yield slow
    stats = daemon.store.statistics()
    commits = CounterMetricFamily("cairn_osd_store_commits", "store commit groups",
                                  labels=["osd"])
    commits.add_metric([labels["osd"]], stats["commits_total"])
    yield commits
    transactions = CounterMetricFamily("cairn_osd_store_transactions", "store transactions",
                                       labels=["osd"])
    transactions.add_metric([labels["osd"]], stats["transactions_total"])
    yield transactions
    misses = CounterMetricFamily("cairn_osd_record_cache_misses", "object record lookups the "
                                 "record cache did not answer (RocksDB reads)", labels=["osd"])
    misses.add_metric([labels["osd"]], stats["record_cache"]["misses_total"])
    yield misses
    hits = CounterMetricFamily("cairn_osd_read_cache_hits", "gets answered from the read cache",
                               labels=["osd"])
    hits.add_metric([labels["osd"]], stats["read_cache"]["hits_total"])
    yield hits
    cached = GaugeMetricFamily("cairn_osd_read_cache_bytes", "small objects' bytes kept after "
                               "reads", labels=["osd"])
    cached.add_metric([labels["osd"]], stats["read_cache"]["bytes"])
    yield cached
    space = daemon.store.statfs()
    for key, name in (("total_bytes", "cairn_osd_capacity_bytes"),
                      ("used_bytes", "cairn_osd_used_bytes")):
        gauge = GaugeMetricFamily(name, f"store {key.replace('_', ' ')}", labels=["osd"])
        gauge.add_metric([labels["osd"]], space[key])
        yield gauge
    recovered = CounterMetricFamily("cairn_osd_recovery_bytes", "bytes moved by recovery and "
                                    "backfill", labels=["osd"])
    recovered.add_metric([labels["osd"]], daemon.pgs.recovery_bytes_total)
    yield recovered
    client = CounterMetricFamily("cairn_osd_client_bytes", "payload bytes of client requests "
                                 "(in) and of their replies (out)", labels=["osd", "direction"])
    client.add_metric([labels["osd"], "in"], daemon.service.client_bytes_in)
    client.add_metric([labels["osd"], "out"], daemon.service.client_bytes_out)
    yield client
    avoided = CounterMetricFamily("cairn_osd_avoided_reads", "reads this primary served from "
                                  "other members because it or a shard's OSD is flagged slow",
                                  labels=["osd"])
    avoided.add_metric([labels["osd"]], sum(backend.avoided_reads_total
                                            for backend in daemon.service.backends.values()))
    yield avoided
    hedges = daemon._hedge_counts()
    served = CounterMetricFamily("cairn_osd_hedged_reads", "clients' reads of replicated "
                                 "objects taken by a replica: `served` here as the replica "
                                 "(`cancelled`: stopped, its primary answered first); "
                                 "`hedged` and `steered` around this OSD as their primary (it "
                                 "confirmed them: a hedge raced it, or the client found it "
                                 "slow and did not ask it)", labels=["osd", "role"])
    served.add_metric([labels["osd"], "served"], hedges["replica_reads_served"])
    served.add_metric([labels["osd"], "cancelled"], hedges["replica_reads_cancelled"])
    served.add_metric([labels["osd"], "hedged"], hedges["reads_hedged_around"])
    served.add_metric([labels["osd"], "steered"], hedges["reads_steered_around"])
    yield served
    sent, won = hedges["reads_hedged_around"], hedges["reads_hedged_won"]
    around = CounterMetricFamily("cairn_osd_read_hedges", "clients' reads of replicated objects "
                                 "whose primary is this OSD, hedged to a replica because this "
                                 "OSD was late: sent (the replica asked this OSD to confirm), "
                                 "won (the replica answered first) and wasted (the rest: this "
                                 "OSD answered first, or the replica refused)",
                                 labels=["osd", "outcome"])
    around.add_metric([labels["osd"], "sent"], sent)
    around.add_metric([labels["osd"], "won"], won)
    around.add_metric([labels["osd"], "wasted"], max(0, sent - won))
    yield around
    shards = CounterMetricFamily("cairn_osd_shard_hedges", "erasure-coded reads by this "
                                 "primary that stopped waiting for a member's late shard: "
                                 "sent, won (decoded before it came), wasted, steered (read "
                                 "around it without asking), by that member",
                                 labels=["osd", "member", "outcome"])
    for member, counts in hedges["shards"]["by_osd"].items():
        for outcome, count in counts.items():
            shards.add_metric([labels["osd"], member, outcome], count)
    yield shards
    states = GaugeMetricFamily("cairn_osd_pgs", "PGs this OSD is primary of, by state",
                               labels=["osd", "state"])
    for state, count in daemon.pgs.states().items():
        states.add_metric([labels["osd"], str(state)], count)
    yield states
