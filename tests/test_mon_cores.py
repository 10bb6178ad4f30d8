"""Monitor and OSD control-plane cores with a fake clock: failure detection, peer heartbeats,
health, config options; and the monitor's durable map log (reopened as after a crash)."""

import msgpack
import pytest

from cairn.common import config
from cairn.common.clustermap import ClusterMap, Incremental
from cairn.mon import health, peerguard
from cairn.mon.failure import NS_PER_S, FailureDetector
from cairn.mon.store import FULL_MAP_EVERY_EPOCHS, LOG_EPOCHS_KEPT, MonStore, MonStoreError, mkfs
from cairn.osd.heartbeat import PeerWatch, choose_peers

pytestmark = pytest.mark.unit

S = NS_PER_S


def cluster(hosts=3, per_host=2, **config_values):
    cmap = ClusterMap("fsid-test", epoch=1)
    ops = []
    for host in range(hosts):
        for index in range(per_host):
            osd_id = host * per_host + index
            ops.append({"op": "osd_add", "id": osd_id, "uuid": f"u-{osd_id}",
                        "location": {"host": f"h{host}"}})
            ops.append({"op": "osd_boot", "id": osd_id, "addr": f"127.0.0.{host + 2}:{6800 + index}"})
    ops += [{"op": "config_set", "key": key.replace("__", "."), "value": str(value)}
            for key, value in config_values.items()]
    return cmap.apply(Incremental(2, tuple(ops)))


def step(cmap, *ops):
    return cmap.apply(Incremental(cmap.epoch + 1, ops))


def test_silent_osd_goes_down_after_grace_then_out_after_interval():
    cmap = cluster(mon__osd_grace_s=10, mon__osd_down_out_interval_s=60)
    detector = FailureDetector(0)
    detector.observe(cmap, 0)
    for second in range(0, 10):
        for osd_id in cmap.osds:
            if osd_id != 3:
                detector.heartbeat(osd_id, second * S)
        assert detector.tick(cmap, second * S) == []
    assert detector.tick(cmap, 10 * S + 1) == [{"op": "osd_down", "id": 3}]
    cmap = step(cmap, {"op": "osd_down", "id": 3})
    detector.observe(cmap, 11 * S)
    for osd_id in cmap.osds:
        if osd_id != 3:
            detector.heartbeat(osd_id, 70 * S)
    assert detector.tick(cmap, 70 * S) == []                       # 59 s down: not yet out
    assert detector.tick(cmap, 71 * S) == [{"op": "osd_out", "id": 3}]
    cmap = step(cmap, {"op": "osd_out", "id": 3})
    assert detector.tick(cmap, 200 * S) == [{"op": "osd_down", "id": i} for i in cmap.osds
                                            if i != 3]   # everyone else went silent meanwhile


def test_reports_from_two_other_hosts_mark_down_before_grace():
    cmap = cluster(hosts=4, per_host=1, mon__osd_grace_s=20)
    detector = FailureDetector(0)
    detector.observe(cmap, 0)
    detector.report(1, 0, True, 1 * S)
    assert detector.tick(cmap, 1 * S) == []                         # one host is not enough
    detector.report(1, 0, False, 2 * S)                             # withdrawn
    detector.report(2, 0, True, 2 * S)
    assert detector.tick(cmap, 2 * S) == []
    detector.report(3, 0, True, 3 * S)
    detector.report(1, 0, True, 3 * S)
    assert detector.tick(cmap, 3 * S) == [{"op": "osd_down", "id": 0}]
    # stale reports (older than the grace) do not count
    detector2 = FailureDetector(0)
    detector2.observe(cmap, 0)
    detector2.report(2, 0, True, 0)
    detector2.report(3, 0, True, 25 * S)
    for osd_id in cmap.osds:
        detector2.heartbeat(osd_id, 25 * S)
    assert detector2.tick(cmap, 25 * S) == []


def test_reports_from_the_same_host_do_not_count_and_two_hosts_suffice_alone():
    cmap = cluster(hosts=2, per_host=2)
    detector = FailureDetector(0)
    detector.observe(cmap, 0)
    detector.report(1, 0, True, S)                                  # same host h0
    assert detector.tick(cmap, S) == []
    down_reporter = step(cmap, {"op": "osd_down", "id": 2})
    detector.report(2, 0, True, S)                                  # the only other host...
    assert detector.tick(down_reporter, S) == []                   # ...but it is down
    assert detector.tick(cmap, S) == [{"op": "osd_down", "id": 0}]


def test_boot_clears_reports_and_restarts_grace_and_manual_out_sticks():
    cmap = cluster(hosts=3, per_host=1, mon__osd_grace_s=5, mon__osd_down_out_interval_s=0)
    detector = FailureDetector(0)
    detector.observe(cmap, 0)
    cmap = step(cmap, {"op": "osd_down", "id": 0})
    detector.observe(cmap, S)
    assert detector.tick(cmap, 10_000 * S) == [{"op": "osd_down", "id": 1},
                                               {"op": "osd_down", "id": 2}]  # no auto-out (0)
    cmap = step(cmap, {"op": "osd_boot", "id": 0, "addr": "127.0.0.2:1"})
    detector.observe(cmap, 10_000 * S)
    assert 0 not in detector.reports
    assert {"op": "osd_down", "id": 0} not in detector.tick(cmap, 10_004 * S)


def test_a_restarted_monitor_waits_a_full_interval():
    cmap = step(cluster(hosts=3, per_host=1, mon__osd_down_out_interval_s=30),
                {"op": "osd_down", "id": 1})
    detector = FailureDetector(1000 * S)
    detector.observe(cmap, 1000 * S)
    for osd_id in (0, 2):
        detector.heartbeat(osd_id, 1029 * S)
    assert detector.tick(cmap, 1029 * S) == []
    assert detector.tick(cmap, 1030 * S) == [{"op": "osd_out", "id": 1}]


def test_peer_choice_prefers_other_hosts_in_ring_order():
    cmap = cluster(hosts=3, per_host=2)
    assert choose_peers(cmap, 0, 3) == [2, 3, 4]
    assert choose_peers(cmap, 5, 10) == [0, 1, 2, 3, 4]
    assert choose_peers(cmap, 2, 10) == [4, 5, 0, 1, 3]      # same-host peer last
    cmap = step(cmap, {"op": "osd_down", "id": 3})
    assert 3 not in choose_peers(cmap, 2, 10)
    single = cluster(hosts=1, per_host=3)
    assert choose_peers(single, 1, 5) == [2, 0]


def test_peer_watch_reports_once_and_withdraws():
    watch = PeerWatch()
    watch.set_peers([1, 2], 0)
    assert watch.tick(5 * S, 10 * S) == []
    report = watch.refused(1, "connection refused")
    assert report.target == 1 and report.failed
    assert watch.refused(1, "again") is None                       # once
    reports = watch.tick(11 * S, 10 * S)
    assert [(r.target, r.failed) for r in reports] == [(2, True)]
    assert watch.tick(12 * S, 10 * S) == []
    back = watch.answered(2, 13 * S)
    assert (back.target, back.failed) == (2, False)
    assert watch.answered(2, 14 * S) is None
    watch.set_peers([2, 3], 15 * S)
    assert watch.peers == [2, 3] and watch.reported == set()
    assert watch.answered(9, 16 * S) is None                       # not a peer


def test_health_checks():
    cmap = cluster(hosts=3, per_host=1)
    assert health.evaluate(cmap).status == health.OK
    assert health.evaluate(ClusterMap("f", 1)).checks.keys() == {"NO_OSDS"}
    cmap = step(cmap, {"op": "pool_create", "name": "p", "kind": "replicated", "size": 3,
                       "min_size": 2, "pg_num": 16})
    down1 = step(cmap, {"op": "osd_down", "id": 0})
    judged = health.evaluate(down1)
    assert judged.status == health.WARN
    assert set(judged.checks) == {"OSD_DOWN", "PG_DEGRADED"}
    assert "osd.0" in judged.checks["OSD_DOWN"]
    assert judged.pgs["p"] == {"total": 16, "degraded": 16, "unavailable": 0}
    down2 = step(down1, {"op": "osd_down", "id": 1})
    judged = health.evaluate(down2)
    assert judged.status == health.ERR and "PG_UNAVAILABLE" in judged.checks
    out_but_up = step(cmap, {"op": "osd_out", "id": 2, "manual": True})
    assert "OSD_OUT" in health.evaluate(out_but_up).checks


def test_config_options_are_checked_and_typed():
    assert config.value({}, "mon.osd_grace_s") == 20.0
    assert config.value({"osd.heartbeat_peers": "3"}, "osd.heartbeat_peers") == 3
    with pytest.raises(ValueError, match="integer"):
        config.check("osd.heartbeat_peers", "2.5")
    with pytest.raises(KeyError, match="did you mean"):
        config.check("osd.heartbeat_peer", "2")


def test_mon_store_logs_every_epoch_durably_and_reloads(tmp_path):
    directory = str(tmp_path / "mon")
    fsid = mkfs(directory)
    with pytest.raises(MonStoreError, match="already there"):
        mkfs(directory)
    store = MonStore.open(directory)
    with pytest.raises(MonStoreError, match="in use"):
        MonStore.open(directory)
    cmap = store.load()
    assert cmap.fsid == fsid and cmap.epoch == 1
    total = LOG_EPOCHS_KEPT + FULL_MAP_EVERY_EPOCHS * 2 + 5
    expected = []
    for epoch in range(2, total + 2):
        incremental = Incremental(epoch, ({"op": "config_set", "key": "osd.heartbeat_peers",
                                           "value": str(epoch % 60 + 1)},))
        cmap = cmap.apply(incremental)
        store.append(incremental, cmap)
        expected.append(incremental.to_dict())
    head = cmap.epoch
    assert store.incrementals(head - 3, head) == expected[-3:]
    assert store.incrementals(head, head) == []
    assert store.incrementals(2, head) is None                     # trimmed: send a full map
    store.close()
    reopened = MonStore.open(directory)          # as after a crash: everything appended is there
    again = reopened.load()
    assert again.to_dict() == cmap.to_dict()
    assert reopened.incrementals(head - LOG_EPOCHS_KEPT, head) == \
        expected[-LOG_EPOCHS_KEPT:]
    reopened.close()
    with pytest.raises(MonStoreError, match="cairn-mon mkfs"):
        MonStore.open(str(tmp_path / "elsewhere"))


def test_mon_store_persists_raft_readies_and_installs_snapshots(tmp_path):
    """The Raft log's durable part round-trips through a reopen (as after a crash): hard state,
    entries (a conflicting suffix replaced), compaction; a snapshot from the leader replaces the
    state machine in the same batch."""
    from cairn.mon.raft import CONF, DATA, Entry, HardState, Ready, Snapshot
    directory = str(tmp_path / "mon")
    mkfs(directory, members={"mon.0": "127.0.0.1:1", "mon.1": "127.0.0.1:2"})
    store = MonStore.open(directory)
    start = store.restored()
    assert start.hard_state == HardState(0, None, 0) and start.entries == ()
    assert start.snapshot.members == {"mon.0": "127.0.0.1:1", "mon.1": "127.0.0.1:2"}
    entries = tuple(Entry(1, i, DATA, b"x%d" % i) for i in range(1, 6))
    store.persist(Ready(hard_state=HardState(1, "mon.0", 3), entries_from=1, entries=entries))
    store.persist(Ready(entries_from=4, entries=(Entry(2, 4, CONF, {"mon.0": "a"}, "rid.9"),)))
    store.persist(Ready(snapshot=Snapshot(3, 1, {"mon.0": "a"}, b"state"), compacted_to=(2, 1)))
    store.close()
    store = MonStore.open(directory)
    back = store.restored()
    assert back.hard_state == HardState(1, "mon.0", 3)
    assert back.entries == (entries[2], Entry(2, 4, CONF, {"mon.0": "a"}, "rid.9"))  # 5 replaced
    assert (back.offset, back.offset_term, back.snapshot.data) == (2, 1, b"state")
    cmap = step(cluster(), {"op": "config_set", "key": "osd.heartbeat_peers", "value": "3"})
    state = msgpack.packb({"map": cmap.to_dict(), "pgact": [[1, 7, [9, [1, 2], [1]]]]})
    installed = store.persist(Ready(snapshot=Snapshot(40, 3, {"mon.0": "a"}, state), install=True,
                                    compacted_to=(40, 3), hard_state=HardState(3, None, 40)))
    assert installed.epoch == cmap.epoch and store.applied() == 40
    store.close()
    store = MonStore.open(directory)
    assert store.load().to_dict() == cmap.to_dict() and store.pg_active(1, 7) == [9, [1, 2], [1]]
    assert store.restored().entries == () and store.restored().applied == 40
    store.close()


def test_mon_store_remembers_requests_done_through_reopen_snapshot_and_install(tmp_path,
                                                                               monkeypatch):
    """The requests done (rid -> outcome) are state machine: written with the entry that did
    them, reloaded after a crash, forgotten oldest first beyond REQUESTS_KEPT (by log index, so
    every monitor forgets the same), carried in snapshots and replaced by an install."""
    from cairn.mon import store as store_module
    from cairn.mon.raft import Ready, Snapshot
    monkeypatch.setattr(store_module, "REQUESTS_KEPT", 3)
    directory = str(tmp_path / "mon")
    mkfs(directory)
    store = MonStore.open(directory)
    cmap = store.load()
    for index in range(1, 6):
        incremental = Incremental(cmap.epoch + 1, ({"op": "config_set",
                                                    "key": "osd.heartbeat_peers",
                                                    "value": str(index)},))
        cmap = cmap.apply(incremental)
        store.apply_map(index, incremental, cmap, rid=f"c.{index}")
    store.apply_nothing(6, ("c.6", {"error": "invalid", "message": "no such pool"}))
    store.apply_nothing(7)                                    # an entry without a request
    expected = {"c.4": (4, {"epoch": 5}), "c.5": (5, {"epoch": 6}),
                "c.6": (6, {"error": "invalid", "message": "no such pool"})}
    assert store.requests == expected and store.applied() == 7
    state = store.state(cmap)
    store.close()
    store = MonStore.open(directory)                          # as after a crash
    assert store.requests == expected
    assert list(store.requests) == ["c.4", "c.5", "c.6"]      # oldest first, to forget next
    store.close()
    other = str(tmp_path / "other")
    mkfs(other)
    follower = MonStore.open(other)
    follower.apply_nothing(1, ("stale.1", {"epoch": 2}))
    follower.persist(Ready(snapshot=Snapshot(7, 1, {"mon.0": None}, state), install=True,
                           compacted_to=(7, 1)))
    assert follower.requests == expected                      # replaced, not merged
    follower.close()
    follower = MonStore.open(other)
    assert follower.requests == expected and follower.load().to_dict() == cmap.to_dict()
    follower.close()


def test_mon_store_keeps_the_health_history_through_reopen_snapshot_and_install(tmp_path,
                                                                                monkeypatch):
    """Health events (cairn health history) are state machine: written with their entry,
    trimmed oldest first beyond HISTORY_KEPT, reloaded after a crash, carried in snapshots and
    replaced by an install; `in_force` reads what was raised and not cleared."""
    from cairn.mon import store as store_module
    from cairn.mon.alerts import in_force
    from cairn.mon.raft import Ready, Snapshot
    monkeypatch.setattr(store_module, "HISTORY_KEPT", 3)

    def event(check, state, time_s):
        return {"cluster": "f", "check": check, "severity": "HEALTH_WARN", "summary": check,
                "detail": [f"{check} line"], "state": state, "time": time_s}
    directory = str(tmp_path / "mon")
    mkfs(directory)
    store = MonStore.open(directory)
    cmap = store.load()
    store.apply_history(1, [event("OSD_DOWN", "raised", 1.0), event("SLOW_DISK", "raised", 1.0)])
    store.apply_history(2, [event("OSD_DOWN", "cleared", 2.0)])
    store.apply_history(3, [event("SLOW_OPS", "raised", 3.0)])
    kept = [event("SLOW_DISK", "raised", 1.0), event("OSD_DOWN", "cleared", 2.0),
            event("SLOW_OPS", "raised", 3.0)]
    assert store.events() == kept and store.applied() == 3
    state = store.state(cmap)
    store.close()
    store = MonStore.open(directory)                          # as after a crash
    assert store.events() == kept
    assert set(in_force(store.events())) == {"SLOW_DISK", "SLOW_OPS"}
    assert in_force(store.events())["SLOW_OPS"]["since"] == 3.0
    store.close()
    other = str(tmp_path / "other")
    mkfs(other)
    follower = MonStore.open(other)
    follower.apply_history(1, [event("STALE", "raised", 0.5)])
    follower.persist(Ready(snapshot=Snapshot(7, 1, {"mon.0": None}, state), install=True,
                           compacted_to=(7, 1)))
    assert follower.events() == kept                          # replaced, not merged
    follower.close()
    follower = MonStore.open(other)
    assert follower.events() == kept
    follower.apply_history(8, [event("X", "raised", 9.0)])
    assert [e["check"] for e in follower.events()] == ["OSD_DOWN", "SLOW_OPS", "X"]
    follower.close()


def test_refused_raft_messages_raise_mon_peer_invalid_until_they_age_out():
    findings = peerguard.Findings()
    assert findings.check(0.0) is None
    findings.record("mon.0", "mon.1", "append", "two leaders in term 3: this member leads it", 10.0)
    findings.record("mon.0", "mon.1", "append", "two leaders in term 3: this member leads it", 11.0)
    check = findings.check(12.0)
    assert check["severity"] == health.WARN and "mon.1" in check["summary"]
    assert check["detail"] == ["mon.0 refused 2 raft message(s) from mon.1, the last 1 s ago "
                               "(append): two leaders in term 3: this member leads it"]
    # A follower's findings travel to the leader once, and the leader shows them.
    follower = peerguard.Findings()
    follower.record("mon.2", "mon.9", "vote_response", "a vote from mon.9, not a member", 11.0)
    reports = follower.pending()
    assert follower.pending() == []
    findings.merge(reports, 12.0)
    assert "mon.9" in findings.check(12.0)["summary"]
    for bad in ("x", [{"reporter": "mon.2"}], [1], [{}] * (peerguard.FINDINGS_MAX + 1)):
        with pytest.raises(ValueError):
            findings.merge(bad, 12.0)
    assert findings.check(12.0 + peerguard.SHOWN_S + 1) is None
    # A flood of forged names costs bounded memory, and long names are clipped.
    for n in range(peerguard.FINDINGS_MAX * 3):
        findings.record("mon.0", f"mon.forged{n}" + "x" * 10_000, "append", "r" * 10_000, 20.0)
    check = findings.check(20.0)
    assert len(check["detail"]) == peerguard.FINDINGS_MAX
    assert max(map(len, check["detail"])) < 3 * peerguard.TEXT_BYTES_MAX


def test_every_error_code_has_one_meaning_and_unknown_words_are_protocol_errors():
    from cairn.common import codes, errors
    assert set(codes.MEANINGS) == set(codes.Code)
    for code, meaning in codes.MEANINGS.items():
        assert codes.parse(str(code)) is code and code == code.value
        assert issubclass(meaning.error, errors.ClientError)
    assert codes.parse("a_newer_code") == "a_newer_code"
    assert codes.meaning("a_newer_code").error is errors.ProtocolError
    assert not codes.meaning("a_newer_code").retryable
    retried = {code for code, meaning in codes.MEANINGS.items() if meaning.retryable}
    assert {codes.Code.WRONG_PRIMARY, codes.Code.STALE, codes.Code.AGAIN} <= retried
    assert codes.meaning(codes.Code.AGAIN).may_have_applied
    assert not codes.meaning(codes.Code.WRONG_PRIMARY).may_have_applied


def test_throughput_history_turns_counters_into_rates_and_survives_restarts():
    from cairn.mon.throughput import HOUR_SAMPLES, SAMPLE_S, ThroughputHistory
    history = ThroughputHistory()
    history.observe(0, {"client_in": 1000, "client_out": 0, "recovery": 0})
    history.observe(1, {"client_in": 5000, "client_out": 7, "recovery": "junk"})
    history.tick(100.0, 1_000.0)                     # the first call only remembers
    assert not history.samples
    history.observe(0, {"client_in": 1000 + 10_000, "client_out": 2_000, "recovery": 50_000})
    history.observe(1, {"client_in": 3000, "client_out": 7})    # restarted: counts from 0
    history.tick(100.0 + SAMPLE_S / 2, 1_005.0)      # too soon
    assert not history.samples
    history.tick(100.0 + SAMPLE_S, 1_010.0)
    assert list(history.samples) == [{"at": 1010.0, "client_in": (10_000 + 3000) / SAMPLE_S,
                                      "client_out": 2_000 / SAMPLE_S,
                                      "recovery": 50_000 / SAMPLE_S}]
    history.forget(1)
    for step in range(2, HOUR_SAMPLES + 10):
        history.tick(100.0 + step * SAMPLE_S, 1_000.0 + step * SAMPLE_S)
    assert len(history.samples) == HOUR_SAMPLES      # an hour kept
    assert history.samples[-1]["client_in"] == 0
