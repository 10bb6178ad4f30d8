"""TLS on a real cluster (`cairn-cluster up --tls`): clients, the CLI and OSD-to-OSD
replication run over TLS 1.3; a plaintext peer and a client pinning another certificate get
nothing."""

import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from cairn.client.cluster import Cluster
from cairn.common import frame, messenger, tls
from cairn.common.frame import Kind
from tests.helpers import run

pytestmark = pytest.mark.cluster


def test_a_tls_cluster_speaks_only_tls_with_its_own_certificate(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3, extra=("--tls",))
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "8")
    key = os.path.join(cluster.dir, "tls", tls.KEY_FILE)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    payload = os.urandom(5 << 20)
    osd_addr = cluster.description["osds"][0]["addr"]
    other_cert, _ = tls.make(str(tmp_path / "other"), "another-cluster")

    async def main():
        async with await Cluster.connect(cluster.dir) as client:
            pool = client.pool("data")
            await pool.put("x", payload)                # primary to two replicas, over TLS
            assert bytes(await pool.get("x")) == payload
            transports = [client.monc._connection._transport] + \
                [c._transport for c in client._connections._connections.values()]
            assert len(transports) >= 2
            for transport in transports:
                assert transport.get_extra_info("ssl_object").version() == "TLSv1.3"
        # A client that trusts another certificate cannot connect.
        with pytest.raises(messenger.ConnectionClosed, match="TLS failed"):
            await messenger.connect(osd_addr, timeout_s=5,
                                    tls=tls.client_context(other_cert))

    run(main())

    # A plaintext client gets no answer: the daemon drops it at the TLS handshake.
    host, port = messenger.parse_addr(osd_addr)
    with socket.create_connection((host, port), timeout=5) as plain:
        plain.sendall(frame.encode_bytes(Kind.REQUEST, 1, {"op": "ping"}))
        received = b""
        try:
            while chunk := plain.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
        assert frame.MAGIC not in received, received

    _, status = cluster.cairn("status")                 # the CLI finds the certificate too
    assert status["osds"]["up"] == 3
    _, got = cluster.cairn("stat", "data", "x")
    assert got["size"] == len(payload)


def test_bench_auth_measures_all_three_modes_in_one_run(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "bench-auth",
                             "--rounds", "1", "--seconds", "1", "--size", "4K", "--hosts", "3",
                             "--dir", str(tmp_path / "bench"), "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    runs, summary = lines[:-1], lines[-1]
    assert sorted(run["mode"] for run in runs) == ["auth", "auth+tls", "none"]
    assert all(run["ops"] > 0 and run["size_bytes"] == 4096 for run in runs)
    entry = summary["4K"]
    assert entry["field"] == "iops" and set(entry["median"]) == {"none", "auth", "auth+tls"}
    assert entry["auth_ratio"] == entry["median"]["auth"] / entry["median"]["none"]
    # Every cluster it made is down again.
    for mode in ("none", "auth", "auth-tls"):
        assert not os.path.exists(tmp_path / "bench" / mode)
