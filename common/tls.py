"""Optional TLS for the wire (`cairn-cluster up --tls`).

Authentication (common/auth.py) already proves who is at each end and MACs every frame, so
TLS adds one thing: nobody on the path reads the bytes. One self-signed certificate per
cluster (an EC P-256 key, made with `openssl`, in DIR/tls/cluster.crt and cluster.key, mode
0600) serves every monitor and OSD; clients and daemons pin it as their only trusted root.
Addresses are IPs that change, so the name in the certificate is not checked: holding the
cluster's key is what a server proves. TLS 1.3 only.

Where a client finds it: $CAIRN_TLS_CA (a certificate file), else the `tls` entry of the
cluster description (cluster.json) it was given. Daemons get `--tls DIR`.
"""

import json
import os
import ssl
import subprocess

CERT_FILE = "cluster.crt"
KEY_FILE = "cluster.key"
CERT_DAYS = 3650


class TlsError(Exception):
    """The certificate could not be made or loaded; the message says which file and why."""


def make(directory, fsid):
    """Make DIR/cluster.crt and DIR/cluster.key (mode 0600) for the cluster `fsid`."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    cert, key = os.path.join(directory, CERT_FILE), os.path.join(directory, KEY_FILE)
    result = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", str(CERT_DAYS), "-subj", f"/CN=cairn-{fsid}", "-keyout", key,
         "-out", cert], capture_output=True, text=True)
    if result.returncode != 0:
        raise TlsError(f"openssl could not make the cluster certificate: "
                       f"{result.stderr.strip()}")
    os.chmod(key, 0o600)
    return cert, key


def server_context(directory):
    """The SSLContext a daemon serves with (DIR holds cluster.crt and cluster.key)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        context.load_cert_chain(os.path.join(directory, CERT_FILE),
                                os.path.join(directory, KEY_FILE))
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the cluster certificate from {directory}: {exc}") from None
    return context


def client_context(cafile):
    """The SSLContext a client connects with: only the cluster's own certificate is trusted."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False          # pinned: the certificate is the only root
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_verify_locations(cafile)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the cluster certificate {cafile}: {exc}") from None
    return context


def daemon_contexts(directory):
    """(server, client) contexts of a daemon started with --tls DIR; (None, None) without."""
    if not directory:
        return None, None
    return server_context(directory), client_context(os.path.join(directory, CERT_FILE))


def for_cluster(where):
    """The client context for the cluster found through `where` (as load_cluster takes it),
    or None when it runs without TLS."""
    cafile = os.environ.get("CAIRN_TLS_CA")
    if not cafile:
        where = where or os.environ.get("CAIRN_CLUSTER")
        if not where:
            return None
        path = os.path.join(where, "cluster.json") if os.path.isdir(where) else where
        if not os.path.isfile(path):
            return None
        try:
            with open(path) as handle:
                entry = json.load(handle).get("tls")
        except (OSError, ValueError, AttributeError):
            return None
        if not entry:
            return None
        cafile = os.path.join(os.path.dirname(os.path.abspath(path)), entry, CERT_FILE)
    return client_context(cafile)
