#!/usr/bin/env bash
# Installs what the project needs, idempotently: Debian packages (bubblewrap), npm packages (npm ci when the
# lock file changed), and the Python client's packages into the project-local .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[2m[setup]\033[0m %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v bwrap >/dev/null 2>&1; then
  log "installing bubblewrap (apt-get)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq bubblewrap >/dev/null
fi

lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.rollout-stamp ] || [ "$(cat node_modules/.rollout-stamp)" != "$lock_sum" ]; then
  log "installing npm packages (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.rollout-stamp
fi

req_sum=$(sha256sum python/requirements.txt | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ ! -f .venv/.rollout-stamp ] || [ "$(cat .venv/.rollout-stamp)" != "$req_sum" ]; then
  log "installing Python packages into .venv"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements.txt
  echo "$req_sum" > .venv/.rollout-stamp
fi

# grpcurl for the reflection contract test (test/contract/reflection-grpcurl.test.ts), built from the Go module
# proxy into .cache/bin with project-local module and build caches; skipped when already built at this version.
grpcurl_version=v1.9.4
if ! go version -m .cache/bin/grpcurl 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/fullstorydev/grpcurl[[:space:]]+$grpcurl_version[[:space:]]"; then
  if command -v go >/dev/null 2>&1; then
    log "building grpcurl $grpcurl_version (go install)"
    GOBIN="$PWD/.cache/bin" GOPATH="$PWD/.cache/go" GOMODCACHE="$PWD/.cache/go/mod" GOCACHE="$PWD/.cache/go/build" \
      GOFLAGS="-mod=mod -modcacherw" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$grpcurl_version"
  elif [ -n "${CI:-}" ]; then
    echo "[setup] no Go toolchain: cannot build grpcurl for the reflection contract test" >&2
    exit 1
  else
    log "warning: no Go toolchain, so no grpcurl: the reflection contract test will fail"
  fi
fi
