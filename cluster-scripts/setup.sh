#!/usr/bin/env bash
# Set up this machine for cairn (Debian 12, root or sudo): system packages, a virtualenv in
# .venv, and the native build. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and chromium-driver: the console's tests drive a real browser (tests/test_console.py).
SYSTEM_PACKAGES=(liburing-dev liberasurecode-dev libisal-dev fio gcc python3-dev python3-venv iproute2
                 nftables mount fuse3 libfuse3-dev pkg-config openssl openssh-client
                 openssh-server systemd systemd-container chromium chromium-driver)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for package in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  as_root apt-get update -qq
  # openssh-server and systemd-container are for the bring-up tests, which run their own sshd
  # inside network namespaces and boot systemd in nspawn containers: the packages must not
  # start services on this machine (policy-rc.d says "not now").
  made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  if [ -n "$made_policy" ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
fi

# The interpreter: Debian's own python3.11 (installed above with python3-dev and python3-venv)
# unless PYTHON names another. The daemons' per-op work is interpreter-bound, and Debian's build
# ran a 3-OSD cluster's 4 KiB gets and puts about 10% faster than a plain source build of 3.11
# (pyenv's default, which runs the interpreter from a shared libpython): README, "Storing data".
PREFERRED_PYTHON=/usr/bin/python3.11
PYTHON=${PYTHON:-$([ -x "$PREFERRED_PYTHON" ] && echo "$PREFERRED_PYTHON" || echo python3)}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version) ($(command -v "$PYTHON"))"
  "$PYTHON" -m venv .venv
else
  venv_python=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  wanted_python=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null || true)
  if [ "$(readlink -f "$venv_python")" != "$(readlink -f "$wanted_python")" ]; then
    echo "setup: note: .venv runs $venv_python, not $PYTHON; remove .venv and run this again" \
         "to rebuild it on $PYTHON"
  fi
fi
log=$(mktemp)
pip_quietly() {
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    grep -v "is ignored" "$log" >&2; rm -f "$log"; exit 1
  fi
}
pip_quietly --upgrade pip setuptools wheel
echo "setup: installing cairn and its Python dependencies (builds the io_uring extension)"
pip_quietly -e '.[test]'
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # PyTorch for the checkpoint tests (CPU is enough): the CPU build where the machine's wheel
  # cache has it (about 30 s), else PyTorch's CPU index, else PyPI's torch (the default build,
  # with CUDA libraries: a large download, but reachable wherever PyPI is); the tests say why
  # they skip without it.
  echo "setup: installing PyTorch (CPU build) for the checkpoint tests"
  .venv/bin/python -m pip install -q "torch==2.13.0+cpu" >"$log" 2>&1 \
    || .venv/bin/python -m pip install -q --timeout 15 --retries 1 \
         --index-url https://download.pytorch.org/whl/cpu torch >"$log" 2>&1 \
    || { echo "setup: PyTorch's CPU build is not reachable; installing torch from PyPI"
         .venv/bin/python -m pip install -q torch >"$log" 2>&1; } \
    || echo "setup: PyTorch could not be installed; tests/test_torch_checkpoints.py will skip"
fi
rm -f "$log"
.venv/bin/python -c "import cairn.native._uring, cairn.native._isal" \
  || { echo "setup: the native extensions did not build; see the pip output above" >&2; exit 1; }
echo "setup: ready (.venv/bin/cairn, .venv/bin/cairn-osd)"
