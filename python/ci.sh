#!/usr/bin/env bash
# The Python package's part of CI, run by .ci/run at its end (after `cargo test --workspace`
# built the tree, the example programs and tollgate-proxy): a virtualenv, the wheel built by
# maturin on that same tree, and pytest.
#
#   bash python/ci.sh              # everything
#   bash python/ci.sh --prepare    # only the virtualenv and its packages
#
# The wheel is built with the dev profile in the workspace's target directory, with the
# features the test kit turns on and the same RUSTFLAGS, so that it reuses the dependencies
# `cargo test --workspace` compiled (tokenizers, tiktoken-rs, redis, ...): only pyo3, this
# crate, and what its build changes (pyo3's interpreter settings) compile here.
set -euo pipefail
cd "$(dirname "$0")"
root="$(cd .. && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
venv="$CARGO_TARGET_DIR/python-ci"
started=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# The SDKs the transports are tested with (openai and anthropic; both ride on httpx2), httpx
# itself, tiktoken to check counts against, pydantic models as arguments. Already there (after
# `--prepare`), this is a quick check.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  maturin pytest httpx tiktoken openai anthropic pydantic
# `--prepare`: only the virtualenv and its packages (mostly waiting on the network), which
# .ci/run does while the tree builds.
if [ "${1:-}" = "--prepare" ]; then
  echo "python/ci.sh --prepare: the virtualenv is ready in $(( $(date +%s) - started )) s"
  exit 0
fi

rm -rf "$CARGO_TARGET_DIR/python-wheels"
VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --profile dev \
  --out "$CARGO_TARGET_DIR/python-wheels" --quiet
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "$CARGO_TARGET_DIR"/python-wheels/tollgate-*.whl
built=$(date +%s)
echo "python/ci.sh: wheel built and installed in $((built - started)) s"

# What the tests need is required here: a missing server, program, SDK or fixture fails them
# instead of skipping them.
export TOLLGATE_REQUIRE_REDIS=1 TOLLGATE_REQUIRE_PROGRAMS=1 TOLLGATE_REQUIRE_CLIENTS=1
export TOLLGATE_REQUIRE_FIXTURES=1
# pytest is run as a program, not `python -m pytest`: the working directory must not shadow
# the installed wheel with the sources (which lack the compiled module).
"$venv/bin/pytest" -p no:cacheprovider -q tests
echo "python/ci.sh: $(( $(date +%s) - started )) s in all"
