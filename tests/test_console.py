"""The operations console on a real cluster, through a real browser (headless Chromium driven
by Selenium) and plain HTTP: sign in by `cairn console`'s one-time link; the overview shows
HEALTH_OK and the OSDs, and an OSD SIGKILLed shows as down on the open page without a reload;
a pool created in the page with HTML in its name is shown as text; the recovery budget set in
the page is the cluster's config; a user added for team-a/ downloads a keyring that `cairn put`
accepts under team-a/ and refuses elsewhere; an allowlist set in the page is the pool's; an
OSD below full weight shows as an expansion with its step; a webhook added in the page gets
its test event; the audit page filters by op; a read-only key signs in with its key, sees the views, and
the server refuses its changes (not just the page); a change without the session's CSRF token
or from another origin is refused; nothing is shown without signing in. Screenshots of each
page are saved under the test's tmp dir (console-*.png)."""

import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytestmark = pytest.mark.cluster

BROWSER = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
HTML_NAME = '<img src=x onerror="window.pwned=1">'


def cli(cluster, *args):
    result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster",
                             cluster.dir, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = BROWSER
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--window-size=1400,1000", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(DRIVER))


def wait_page(driver, what, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate(driver.page_source):
            return time.monotonic()
        time.sleep(0.25)
    shown = driver.execute_script("return document.querySelector('main').innerText")
    raise AssertionError(f"the page did not show {what} in {timeout_s} s; it shows:\n{shown}")


def console_tree(directory):
    """The OSD page of `directory`'s console as a signed-in browser shows it: {row label: the
    row's text} (hosts as `hN`, OSDs as `osd.N`, each with its marks)."""
    from selenium.webdriver.common.by import By
    result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster", directory,
                             "console", "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    login = json.loads(result.stdout.strip().splitlines()[-1])["login_url"]
    driver = browser()
    try:
        driver.get(login)
        driver.find_element(By.CSS_SELECTOR, 'nav button[data-page="osds"]').click()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "read ms" not in driver.page_source:
            time.sleep(0.25)
        time.sleep(2.5)                             # a refresh with the health checks
        rows = driver.find_element(By.ID, "tree").find_elements(By.TAG_NAME, "tr")
        return {row.text.split()[0]: row.text for row in rows[1:] if row.text.strip()}
    finally:
        driver.quit()


hook_server = None


def start_receiver(received):
    """A webhook receiver on loopback: the JSON bodies POSTed to it go into `received`."""
    import http.server
    import threading
    global hook_server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass
    hook_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=hook_server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{hook_server.server_address[1]}/hook"


class Http:
    """A cookie-keeping HTTP client (a second browser, without a browser)."""

    def __init__(self, base):
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def call(self, path, data=None, headers=None, form=False):
        body = None
        if data is not None:
            body = urllib.parse.urlencode(data).encode() if form else json.dumps(data).encode()
            headers = {"Content-Type": "application/x-www-form-urlencoded" if form else
                       "application/json", **(headers or {})}
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with self.opener.open(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.mark.skipif(not (BROWSER and DRIVER), reason="chromium and chromedriver are not "
                    "installed (cluster-scripts/setup.sh installs them)")
def test_the_console_in_a_browser(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3)
    console = json.loads(cli(cluster, "console", "--json").strip().splitlines()[-1])
    assert set(console) == {"url", "login_url"}, console
    url = console["url"]
    assert cluster.description["console"] == url
    assert f"console: {url}" in cli(cluster, "status")

    # Nothing without signing in.
    anonymous = Http(url)
    status, body = anonymous.call("")
    assert status == 200 and "HEALTH_OK" not in body and "Sign in" in body, body
    assert anonymous.call("api/status")[0] == 401

    from selenium.webdriver.common.by import By
    driver = browser()
    try:
        shot = lambda name: driver.save_screenshot(str(tmp_path / f"console-{name}.png"))  # noqa: E731

        def open_page(name):
            driver.find_element(By.CSS_SELECTOR, f'nav button[data-page="{name}"]').click()
        driver.get(console["login_url"])
        wait_page(driver, "HEALTH_OK and 3 OSDs", lambda page: "HEALTH_OK" in page and
                  "3 OSDs: 3 up, 3 in" in page, 20)
        shot("overview")
        status, body = Http(url).call(console["login_url"][len(url):])       # used once only
        assert status == 403 and "used or expired" in body, (status, body)

        # A pool whose name is HTML: created through the page's form, shown as text.
        driver.find_element(By.CSS_SELECTOR, 'nav button[data-page="pools"]').click()
        form = driver.find_element(By.ID, "pool-create")
        form.find_element(By.NAME, "name").send_keys(HTML_NAME)
        form.find_element(By.NAME, "pg_num").clear()
        form.find_element(By.NAME, "pg_num").send_keys("8")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait_page(driver, "the new pool", lambda page: "created pool" in page, 15)
        table = driver.find_element(By.ID, "pool-table")
        deadline = time.monotonic() + 10
        while HTML_NAME not in table.text and time.monotonic() < deadline:
            time.sleep(0.25)
        assert HTML_NAME in table.text, table.text
        assert not table.find_elements(By.TAG_NAME, "img")
        assert driver.execute_script("return window.pwned") is None
        assert HTML_NAME in [pool["name"] for pool in cluster.cairn("pool", "ls")[1]["pools"]]
        shot("pools")

        driver.find_element(By.CSS_SELECTOR, 'nav button[data-page="osds"]').click()
        wait_page(driver, "the OSD tree", lambda page: "read ms" in page, 10)
        shot("osds")

        driver.find_element(By.CSS_SELECTOR, 'nav button[data-page="recovery"]').click()
        budget = driver.find_element(By.ID, "recovery-budget")
        deadline = time.monotonic() + 10
        while not budget.find_element(By.NAME, "cluster").get_attribute("value") and \
                time.monotonic() < deadline:
            time.sleep(0.25)
        budget.find_element(By.NAME, "cluster").clear()
        budget.find_element(By.NAME, "cluster").send_keys("200M")
        budget.find_element(By.CSS_SELECTOR, "button").click()
        wait_page(driver, "the budget saved", lambda page: "budgets saved" in page, 10)
        assert json.loads(cli(cluster, "--json", "config", "get",
                              "recovery.cluster_max_bytes_per_s"))["value"] in ("200M",
                                                                                200 << 20)
        wait_page(driver, "the cluster budget", lambda page: "for the cluster" in page, 10)
        shot("recovery")

        # Changes made in the console are audited under the signed-in entity.
        audit = json.loads(cli(cluster, "--json", "audit", "--entity", "client.admin"))
        assert any(event["op"] == "pool_create" and event["target"] == HTML_NAME
                   for event in audit["events"]), audit

        # Users: one for team-a/ in pool data, its keyring downloaded from the page.
        cluster.cairn("pool", "create", "data", "--replicated", "2", "--pg-num", "8")
        open_page("users")
        wait_page(driver, "the users", lambda page: "client.admin" in page, 10)
        form = driver.find_element(By.ID, "user-add")
        for field, value in (("name", "team"), ("pool", "data"), ("prefix", "team-a/")):
            form.find_element(By.NAME, field).send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait_page(driver, "the keyring link", lambda page: "keyring-download" in page, 15)
        keyring = driver.execute_async_script(
            "const done = arguments[0];"
            "fetch(document.getElementById('keyring-download').href)"
            ".then(r => r.text()).then(done);")
        (tmp_path / "team.keyring").write_text(keyring)
        (tmp_path / "blob").write_bytes(b"from the console's user")
        as_team = ("--name", "client.team", "--keyring", str(tmp_path / "team.keyring"))
        cli(cluster, *as_team, "put", "data", "team-a/x", str(tmp_path / "blob"))
        refused = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster",
                                  cluster.dir, *as_team, "put", "data", "team-b/x",
                                  str(tmp_path / "blob")], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode != 0 and "permission denied" in refused.stderr.lower(), \
            refused.stderr
        shot("users")

        # Allowlists: one set in the page is the pool's.
        open_page("allowlists")
        form = driver.find_element(By.ID, "allow-set")
        for field, value in (("pool", "data"), ("prefix", "team-a/"),
                             ("networks", "127.0.0.0/8, 10.1.2.3")):
            form.find_element(By.NAME, field).send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait_page(driver, "the allowlist", lambda page: "10.1.2.3/32" in page, 10)
        pools = {pool["name"]: pool for pool in cluster.cairn("pool", "ls")[1]["pools"]}
        assert pools["data"]["allow_from"] == {"team-a/": ["127.0.0.0/8", "10.1.2.3/32"]}
        shot("allowlists")

        # Expansion: an OSD below full weight, and the step in the audit log.
        cli(cluster, "osd", "weight", "2", "0.5")
        open_page("expansion")
        wait_page(driver, "osd.2 joining", lambda page: "0.500 of 1" in page and
                  "osd.2 weight 0.5" in page, 10)
        shot("expansion")
        cli(cluster, "osd", "weight", "2", "1")

        # Alerts: a webhook added in the page gets the test event.
        received = []
        hook = start_receiver(received)
        try:
            open_page("alerts")
            form = driver.find_element(By.ID, "webhook-add")
            form.find_element(By.NAME, "url").send_keys(hook)
            form.find_element(By.CSS_SELECTOR, "button").click()
            wait_page(driver, "the webhook", lambda page: "send a test" in page, 10)
            driver.find_element(By.XPATH, "//button[text()='send a test']").click()
            wait_page(driver, "the test sent", lambda page: "HTTP 200" in page, 15)
            assert received and received[0]["check"] == "TEST", received
            shot("alerts")
        finally:
            hook_server.shutdown()

        # Audit: the console's own changes, filtered by op.
        open_page("audit")
        form = driver.find_element(By.ID, "audit-filter")
        form.find_element(By.NAME, "op").send_keys("auth_add")
        form.find_element(By.CSS_SELECTOR, "button").click()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            table = driver.find_element(By.ID, "audit-table").text
            if "auth_add" in table and "pool_create" not in table:
                break
            time.sleep(0.25)
        assert "auth_add client.team" in table and "pool_create" not in table, table
        shot("audit")

        open_page("overview")
        cluster.script("kill", "osd.1")
        killed = time.monotonic()
        shown = wait_page(driver, "osd.1 down", lambda page: "HEALTH_OK" not in page and
                          re.search(r"osd\.1</td><td>[^<]*</td><td[^>]*>down<", page), 10)
        print(f"osd.1 shown down {shown - killed:.1f} s after its SIGKILL")
        shot("osd-down")
    finally:
        driver.quit()

    # A read-only key: it signs in with its key and sees, and its changes are refused.
    cli(cluster, "auth", "add", "client.viewer", "--caps", "mon=r",
        "--keyring-out", str(tmp_path / "viewer.keyring"))
    key = re.search(r"key = (\S+)", (tmp_path / "viewer.keyring").read_text()).group(1)
    viewer = Http(url)
    assert viewer.call("login", {"entity": "client.viewer", "key": key + "x"},
                       form=True)[0] == 403
    status, page = viewer.call("login", {"entity": "client.viewer", "key": key}, form=True)
    assert status == 200 and "client.viewer" in page, page
    csrf = re.search(r'data-csrf="([^"]+)"', page).group(1)
    status, body = viewer.call("api/status")
    assert status == 200 and json.loads(body)["osds"]["total"] == 3
    status, body = viewer.call("api/pool_create", {"name": "nope", "kind": "replicated",
                                                   "size": 2, "pg_num": 8},
                               headers={"X-Cairn-Csrf": csrf})
    assert status == 403 and "mon=rw" in json.loads(body)["message"], body
    assert "nope" not in [pool["name"] for pool in cluster.cairn("pool", "ls")[1]["pools"]]
    status, body = viewer.call("api/auth_ls")                # the key table needs admin
    assert status == 403 and "admin" in json.loads(body)["message"], body

    # The admin again, by key: a change needs the CSRF token and this console's origin.
    admin_key = re.search(r"key = (\S+)", open(os.path.join(
        cluster.dir, "client.admin.keyring")).read()).group(1)
    admin = Http(url)
    page = admin.call("login", {"entity": "client.admin", "key": admin_key}, form=True)[1]
    csrf = re.search(r'data-csrf="([^"]+)"', page).group(1)
    change = {"key": "recovery.max_active", "value": "2"}
    assert admin.call("api/config_set", change)[0] == 403
    assert admin.call("api/config_set", change, headers={"X-Cairn-Csrf": csrf,
                                                         "Origin": "http://evil.example"})[0] == 403
    status, body = admin.call("api/config_set", change, headers={"X-Cairn-Csrf": csrf})
    assert status == 200, body
    status, body = admin.call("api/osd_tree")
    assert status == 200 and any(not osd["up"] for osd in json.loads(body)["osds"])
    assert admin.call("api/no_such_view")[0] == 404
    assert admin.call("api/osd_boot")[0] == 404              # not a console view
    # A view's query cannot turn it into a change (the op is the URL's).
    status, body = admin.call("api/osd_tree?op=config_set&key=recovery.max_active&value=9")
    assert status == 200 and "osds" in json.loads(body), body
    assert json.loads(cli(cluster, "--json", "config", "get", "recovery.max_active"))[
        "value"] == 2
