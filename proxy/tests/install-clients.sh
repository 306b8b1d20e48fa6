#!/usr/bin/env bash
# Installs the official SDKs the real-client tests drive through the proxy (proxy/tests/proxy/
# clients.rs): Python's `openai` and `anthropic` from PyPI, in a venv (or with `pip install
# --target` where the venv module is missing), and Node's `openai` from npm; and
# `playwright-core` from npm, which drives Debian's Chromium (/usr/bin/chromium, installed
# apart: `apt-get install chromium`) through the status page in proxy/tests/proxy/admin.rs. It
# downloads no browser of its own.
#
#   bash proxy/tests/install-clients.sh [DIR]      (default: $TOLLGATE_PROXY_CLIENTS, else
#                                                   target/proxy-clients)
#   export TOLLGATE_PROXY_CLIENTS=DIR
#
# Needs python3 (with pip) and node (with npm). Prints DIR on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-${TOLLGATE_PROXY_CLIENTS:-target/proxy-clients}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# Python: DIR/python/bin/python when a venv can be made, else the system python3 with the
# packages in DIR/python-packages (the tests add it to PYTHONPATH).
if [ ! -x "$dir/python/bin/python" ] && [ ! -d "$dir/python-packages" ]; then
  if python3 -m venv "$dir/python" >/dev/null 2>&1 && [ -x "$dir/python/bin/python" ]; then
    :
  else
    rm -rf "$dir/python"
    mkdir -p "$dir/python-packages"
  fi
fi
if [ -x "$dir/python/bin/python" ]; then
  "$dir/python/bin/python" -m pip install --quiet --disable-pip-version-check openai anthropic
else
  python3 -m pip install --quiet --disable-pip-version-check --upgrade \
    --target "$dir/python-packages" openai anthropic
fi

# Node: DIR/node/node_modules/openai and DIR/node/node_modules/playwright-core.
mkdir -p "$dir/node"
if [ ! -f "$dir/node/package.json" ]; then
  printf '{"name":"tollgate-proxy-clients","private":true}\n' >"$dir/node/package.json"
fi
(cd "$dir/node" && npm install --silent --no-audit --no-fund openai playwright-core >/dev/null)

echo "$dir"
