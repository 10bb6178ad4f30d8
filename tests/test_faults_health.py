"""Health under real faults (root, isolated mode): a loop device throttled with the blkio cgroup
while a write load runs is named by SLOW_DISK, and only it; reads avoid it meanwhile (p99 with
and without avoidance measured); the check clears after the throttle is removed; for 3 minutes
before the fault, the same load raises no SLOW_DISK, SLOW_OPS or NETWORK_*.
10% packet loss (nftables) between two hosts is named by NETWORK_PACKET_LOSS as that pair, 2% loss
too (within 120 s), loss on every link of one host as that host; all clear. Every raise and clear
reaches a webhook receiver on the cluster's bridge while two bad receivers (one hangs, one answers
500) are configured beside it.

Times are measured and printed (pytest -s shows them); the deadlines are the issue's: named within
30 s (2%: 120 s), cleared within 60 s."""

import json
import os
import signal
import subprocess
import sys
import time


from tests.helpers import WebhookReceivers, isolated_marks, isolated_up
from tests.test_console import console_tree

pytestmark = isolated_marks()

FALSE_ALARMS = ("SLOW_DISK", "SLOW_OPS", "NETWORK_PACKET_LOSS", "NETWORK_SLOW_PING",
                "READS_HEDGED")
# The false-alarm test: this long under a continuous bench load before the fault (the issue's
# 3 minutes; CAIRN_QUIET_S=600 for the 10-minute run).
QUIET_S = int(os.environ.get("CAIRN_QUIET_S", "180"))


def cli(directory, module, *args):
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "CAIRN_CLUSTER": directory})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def health(directory):
    return json.loads(cli(directory, "cairn.client.cli", "health", "detail", "--json"))


def receive_alerts(directory):
    """Webhook receivers on the address of the cluster's own bridge (the monitors run in its
    namespaces), configured as alert.webhooks: the one that records, one that hangs and one
    that answers 500."""
    with open(os.path.join(directory, "cluster.json")) as handle:
        octet = json.load(handle)["isolation"]["octet"]
    from cairn.cluster.isolated import SUBNET_PREFIX
    receivers = WebhookReceivers(f"{SUBNET_PREFIX}.{octet}.1")
    cli(directory, "cairn.client.cli", "config", "set", "alert.webhooks",
        ",".join(receivers.urls[name] for name in ("hang", "broken", "good")))
    return receivers


def assert_raised_then_cleared(receivers, name):
    """The receiver got `name` raised (perhaps changed) and then cleared, each as documented."""
    wait_for(f"{name} cleared at the webhook", lambda: "cleared" in receivers.events_of(name), 15)
    states = receivers.events_of(name)
    assert states[0] == "raised" and states[-1] == "cleared" and states.count("cleared") == 1, \
        states
    for event in receivers.events:
        assert set(event) == {"cluster", "check", "severity", "summary", "detail", "state",
                              "time"}, event


def wait_for(what, predicate, timeout_s):
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if predicate():
            return time.monotonic() - began
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def bench(directory, *args):
    """One `cairn bench cluster ... --json` run to its end; its result."""
    return json.loads(cli(directory, "cairn.client.cli", "--cluster", directory, "bench",
                          "cluster", "--json", *args).strip().splitlines()[-1])


def scrape(url, family, **labels):
    from prometheus_client.parser import text_string_to_metric_families
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for metric in text_string_to_metric_families(text)
               for sample in metric.samples if sample.name == family
               and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_a_throttled_disk_is_named_avoided_and_cleared_without_false_alarms(disk_dir):
    with isolated_up(os.path.join(str(disk_dir), "health"), "--hosts", "4", "--device-size",
                     "2G") as directory:
        cli(directory, "cairn.client.cli", "pool", "create", "h", "--replicated", "3",
            "--pg-num", "32")
        cli(directory, "cairn.client.cli", "pool", "create", "e", "--erasure", "2+1",
            "--pg-num", "16")
        receivers = receive_alerts(directory)
        for pool in ("h", "e"):                                # objects for the reads below
            bench(directory, "--pool", pool, "--op", "write", "--size", "64K", "--concurrency",
                  "4", "--seconds", "5")
        log = open(os.path.join(str(disk_dir), "load.log"), "w")       # closed by the test
        load = subprocess.Popen([sys.executable, "-m", "cairn.client.cli", "--cluster",
                                 directory, "bench", "cluster", "--pool", "h", "--op", "write",
                                 "--size", "64K", "--concurrency", "8", "--seconds",
                                 str(QUIET_S + 220),
                                 "--objects", "2000"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            quiet_until = time.monotonic() + QUIET_S
            while time.monotonic() < quiet_until:           # a busy healthy cluster
                raised = set(health(directory)["checks"]) & set(FALSE_ALARMS)
                assert not raised, health(directory)
                time.sleep(2)
            cli(directory, "cairn.cluster.cli", "fault", "--dir", directory, "throttle",
                "osd.2", "--bps", "1M")
            named_s = wait_for("SLOW_DISK", lambda: "SLOW_DISK" in health(directory)["checks"],
                               30)
            report = health(directory)
            check = report["checks"]["SLOW_DISK"]
            assert report["status"] == "HEALTH_WARN" and check["severity"] == "HEALTH_WARN"
            text = check["summary"] + " " + " ".join(check["detail"])
            assert "osd.2" in text and not any(f"osd.{i}" in text for i in (0, 1, 3)), check
            assert len(check["detail"]) == 1 and "host h3" in check["detail"][0], check
            assert isinstance(check["since"], float) and check["since"] <= time.time()

            # Reads avoid the flagged OSD; the same reads with avoidance turned off, to compare.
            # Hedged reads (test_faults_hedged.py) are off here: they would read around osd.2
            # by themselves and leave the avoidance nothing to do.
            wait_for("osd.2 flagged slow", lambda: json.loads(cli(
                directory, "cairn.client.cli", "osd", "tree", "--json"))["osds"][2]["slow"], 15)
            tree = console_tree(directory)          # the console marks it too
            assert "slow" in tree["osd.2"] and not any(
                "slow" in tree[f"osd.{n}"] for n in (0, 1, 3)), tree
            cli(directory, "cairn.client.cli", "config", "set", "osd.hedge_shard_reads", "0")
            reads = ("--op", "rand", "--size", "64K", "--concurrency", "4", "--seconds", "10",
                     "--no-hedge")
            urls = [osd["metrics"] for osd in json.load(open(os.path.join(
                directory, "cluster.json")))["osds"]]
            avoiding = bench(directory, "--pool", "h", *reads)
            avoided = scrape(urls[2], "cairn_osd_avoided_reads_total")
            before = sum(scrape(url, "cairn_osd_avoided_reads_total") for url in urls)
            ec_avoiding = bench(directory, "--pool", "e", *reads)
            ec_avoided = sum(scrape(url, "cairn_osd_avoided_reads_total") for url in urls) - \
                before
            cli(directory, "cairn.client.cli", "config", "set", "osd.avoid_slow_reads", "0")
            time.sleep(1)
            plain = bench(directory, "--pool", "h", *reads)
            ec_plain = bench(directory, "--pool", "e", *reads)
            cli(directory, "cairn.client.cli", "config", "rm", "osd.avoid_slow_reads")
            cli(directory, "cairn.client.cli", "config", "rm", "osd.hedge_shard_reads")
            assert avoided > 0, "osd.2 served every read itself"
            assert ec_avoided > 0, "no erasure read decoded around osd.2's shards"
            assert avoiding["lat_ms_p99"] < plain["lat_ms_p99"], (avoiding, plain)
            assert ec_avoiding["lat_ms_p99"] < ec_plain["lat_ms_p99"], (ec_avoiding, ec_plain)

            cli(directory, "cairn.cluster.cli", "fault", "--dir", directory, "clear")
            cleared_s = wait_for("SLOW_DISK cleared",
                                 lambda: "SLOW_DISK" not in health(directory)["checks"], 60)
            wait_for("osd.2 no longer flagged slow", lambda: not json.loads(cli(
                directory, "cairn.client.cli", "osd", "tree", "--json"))["osds"][2]["slow"], 15)
            assert load.poll() is None, "the load stopped early: " + open(log.name).read()[-2000:]
            assert_raised_then_cleared(receivers, "SLOW_DISK")
            print(f"no false alarm in {QUIET_S} s of load; SLOW_DISK named osd.2 {named_s:.0f} s "
                  f"after the throttle, cleared {cleared_s:.0f} s after it was removed, under "
                  f"load; 64 KiB random reads during the fault: p99 {avoiding['lat_ms_p99']} ms "
                  f"avoiding osd.2 ({avoided:.0f} reads served elsewhere, "
                  f"{avoiding['iops']} IOPS), p99 {plain['lat_ms_p99']} ms not avoiding it "
                  f"({plain['iops']} IOPS); erasure 2+1: p99 {ec_avoiding['lat_ms_p99']} ms "
                  f"avoiding ({ec_avoided:.0f} reads decoded around it, {ec_avoiding['iops']} "
                  f"IOPS), {ec_plain['lat_ms_p99']} ms not ({ec_plain['iops']} IOPS)")
        finally:
            load.send_signal(signal.SIGKILL)
            load.wait(timeout=30)
            log.close()
            receivers.stop()


def test_packet_loss_names_the_pair_or_the_host_and_clears(disk_dir):
    with isolated_up(os.path.join(str(disk_dir), "loss"), "--hosts", "4", "--device-size",
                     "1G") as directory:
        fault = lambda *args: cli(directory, "cairn.cluster.cli", "fault", "--dir",  # noqa: E731
                                  directory, *args)
        receivers = receive_alerts(directory)
        try:
            time.sleep(10)
            assert "NETWORK_PACKET_LOSS" not in health(directory)["checks"]
            fault("loss", "h1", "h2", "--percent", "10")
            named_s = wait_for("NETWORK_PACKET_LOSS", lambda: "NETWORK_PACKET_LOSS" in health(
                directory)["checks"], 30)
            check = health(directory)["checks"]["NETWORK_PACKET_LOSS"]
            text = check["summary"] + " " + " ".join(check["detail"])
            assert "h1" in text and "h2" in text and "h3" not in text and "h4" not in text, check
            tree = console_tree(directory)          # the console marks the pair's hosts
            assert [host for host in ("h1", "h2", "h3", "h4") if "loss" in tree[host]] == \
                ["h1", "h2"], tree
            fault("clear")
            cleared_s = wait_for("NETWORK_PACKET_LOSS cleared", lambda: "NETWORK_PACKET_LOSS"
                                 not in health(directory)["checks"], 60)
            assert_raised_then_cleared(receivers, "NETWORK_PACKET_LOSS")
            receivers.events.clear()

            fault("loss", "h1", "h3", "--percent", "2")
            low_s = wait_for("2% loss named", lambda: "h1-h3" in health(directory)[
                "checks"].get("NETWORK_PACKET_LOSS", {}).get("summary", ""), 120)
            check = health(directory)["checks"]["NETWORK_PACKET_LOSS"]
            assert "h2" not in check["summary"] and "h4" not in check["summary"], check
            fault("clear")
            low_cleared_s = wait_for("2% loss cleared", lambda: "NETWORK_PACKET_LOSS" not in
                                     health(directory)["checks"], 60)
            assert_raised_then_cleared(receivers, "NETWORK_PACKET_LOSS")

            for other in ("h1", "h2", "h3"):                # every link of h4
                fault("loss", "h4", other, "--percent", "10")
            host_s = wait_for("h4 named", lambda: "host h4" in json.dumps(
                health(directory)["checks"].get("NETWORK_PACKET_LOSS", {})), 60)
            check = health(directory)["checks"]["NETWORK_PACKET_LOSS"]
            assert check["detail"] == ["host h4 loses packets to every peer host"], check
            fault("clear")
            wait_for("cleared again", lambda: "NETWORK_PACKET_LOSS" not in health(directory)[
                "checks"], 60)
            print(f"10% loss h1-h2 named in {named_s:.0f} s, cleared {cleared_s:.0f} s after; "
                  f"2% loss h1-h3 named in {low_s:.0f} s, cleared {low_cleared_s:.0f} s after; "
                  f"loss on every link of h4 named as the host in {host_s:.0f} s; raise and "
                  f"clear posted to the webhook each time")
        finally:
            receivers.stop()
