#!/usr/bin/env bash
# Builds reproducible OCI image tarballs with no Docker engine and no registry (hack/image/oci.py writes them):
#
#   hack/image.sh [consistd|example-go|example-python|pause|busybox ...]   build these (default: all)
#   hack/image.sh --check [NAME ...]   build each twice into two fresh directories and compare the digests
#
# Each image lands in $CONSISTD_IMAGE_DIR/NAME.tar (default target/images), an OCI image layout in a tar
# that `ctr -n k8s.io images import FILE` accepts; the script prints each one's ref, manifest digest and
# compressed / uncompressed layer sizes. Pods run them with `imagePullPolicy: Never`.
#
#   consistd        localhost/consistd:VERSION                 the daemon (profile image: release, fat LTO), stripped, at /consistd
#                                                              and on PATH (/usr/local/bin/consistd), its ldd libraries,
#                                                              CA certificates, passwd/group; user 65532; the
#                                                              binary cached in $CONSISTD_CACHE/consistd-release
#   example-go      localhost/consistd-example-go:VERSION      examples/go, static (CGO_ENABLED=0)
#   example-python  localhost/consistd-example-python:VERSION  examples/python on CPython + the SDK's packages
#   pause           localhost/pause:3.10                       hack/image/pause.c, gcc -static
#   busybox         localhost/busybox:local                    Debian's busybox-static (apt-get installs it)
#
# Every mtime and the config's `created` are SOURCE_DATE_EPOCH (default: the commit time of HEAD). The same
# inputs (sources, toolchains, Debian packages, the pip-resolved Python packages) give the same digests.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${CONSISTD_IMAGE_DIR:-$repo/target/images}
# Its own target directory: the remapped RUSTFLAGS below would otherwise rebuild `cargo build --release`'s
# artifacts (make bench's) from scratch each time the two alternate, and they would rebuild these.
export CARGO_TARGET_DIR=${CONSISTD_IMAGE_CARGO_TARGET_DIR:-$repo/target/image-cargo}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct)}
oci=$repo/hack/image/oci.py
rootfs=$repo/hack/image/rootfs.py
ALL=(consistd example-go example-python pause busybox)

log() { printf 'image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

toml() { # FILE TABLE KEY: one value of a Cargo.toml, e.g. Cargo.toml workspace.package version
  python3 -c 'import sys, tomllib
value = tomllib.load(open(sys.argv[1], "rb"))
for key in sys.argv[2].split(".") + [sys.argv[3]]:
    value = value[key]
print(value)' "$repo/$1" "$2" "$3"
}
version=$(toml Cargo.toml workspace.package version)
source_url=$(toml Cargo.toml workspace.package repository)
revision=$(git -C "$repo" rev-parse HEAD)
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] || revision=$revision-dirty

# config USER ENTRYPOINT_JSON CMD_JSON TITLE DESCRIPTION [ENV_JSON]: the image config's config object.
config() {
  python3 - "$@" <<'EOF'
import json, os, sys
user, entrypoint, cmd, title, description = sys.argv[1:6]
env = json.loads(sys.argv[6]) if len(sys.argv) > 6 else []
labels = {"org.opencontainers.image.source": os.environ["IMAGE_SOURCE"],
          "org.opencontainers.image.version": os.environ["IMAGE_VERSION"],
          "org.opencontainers.image.revision": os.environ["IMAGE_REVISION"],
          "org.opencontainers.image.title": title, "org.opencontainers.image.description": description}
value = {"User": user, "Entrypoint": json.loads(entrypoint), "Labels": labels, "WorkingDir": "/",
         "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] + env}
if json.loads(cmd):
    value["Cmd"] = json.loads(cmd)
print(json.dumps(value))
EOF
}
export IMAGE_SOURCE=$source_url IMAGE_VERSION=$version IMAGE_REVISION=$revision

# write NAME REF CONFIG LAYER...: the layout tar and its summary line.
write() {
  local name=$1 ref=$2 cfg=$3 layers=()
  shift 3
  for l in "$@"; do layers+=(--layer "$l"); done
  python3 "$oci" --ref "$ref" --config "$cfg" --epoch "$SOURCE_DATE_EPOCH" "${layers[@]}" --out "$out/$name.tar" |
    tee "$out/$name.json"
}

# The base every non-busybox image shares: CA certificates, passwd/group, a root-owned sticky /tmp.
base_layer() { # STAGE
  [ -r /etc/ssl/certs/ca-certificates.crt ] ||
    die "no /etc/ssl/certs/ca-certificates.crt: apt-get install ca-certificates"
  echo "file /etc/ssl/certs/ca-certificates.crt 0644 /etc/ssl/certs/ca-certificates.crt"
  python3 "$rootfs" users "$1"
  echo "dir /tmp 1777"
}

build_consistd() {
  local stage=$out/stage/consistd start
  mkdir -p "$stage"
  # Paths of this checkout and of the cargo registry would otherwise be in panic messages, so two checkouts
  # would build different binaries; remapped, the binary does not depend on where it was built.
  # SOURCE_DATE_EPOCH is left out: the cc crate's build scripts (ring, psm) rebuild when it changes, which
  # would rebuild most of the tree at every commit, and the binary does not depend on it.
  local flags="--remap-path-prefix=$repo=/consistd --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
  # The stripped binary is cached by everything it is built from, as hack/control-plane.sh caches its
  # binaries by version: a fresh clone of a commit built before on this machine takes it from the cache.
  local cache key
  cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}/consistd-release
  key=$({
    rustc -vV
    echo "cargo build --profile image -p consistd --locked, paths remapped"
    cd "$repo" && find Cargo.toml Cargo.lock daemon/Cargo.toml daemon/src daemon/core daemon/observe daemon/cluster daemon/messages daemon/server proto/Cargo.toml proto/src proto/consistd \
      -type f -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16)
  if [ -x "$cache/$key/consistd" ]; then
    log "consistd $key from $cache (built before from the same sources and toolchain)"
  else
    start=$(date +%s)
    env -u SOURCE_DATE_EPOCH RUSTFLAGS="$flags" \
      cargo build --profile image -p consistd --locked --manifest-path "$repo/Cargo.toml" >&2
    log "cargo build --profile image -p consistd: $(($(date +%s) - start)) s"
    mkdir -p "$cache/$key.tmp"
    strip --strip-all -o "$cache/$key.tmp/consistd" "$CARGO_TARGET_DIR/image/consistd"
    rm -rf "${cache:?}/$key" && mv "$cache/$key.tmp" "$cache/$key"
    # Keep the three newest.
    find "$cache" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn | tail -n +4 | cut -d' ' -f2- |
      xargs -r rm -rf
  fi
  cp "$cache/$key/consistd" "$stage/consistd"
  {
    echo "file /consistd 0755 $stage/consistd"
    # On PATH too, so `kubectl exec POD -c consistd -- consistd status` finds it.
    echo "symlink /usr/local/bin/consistd /consistd"
    python3 "$rootfs" libs "$stage/consistd"
    base_layer "$stage"
  } >"$stage/layer.txt"
  write consistd "localhost/consistd:$version" "$(config 65532:65532 '["/consistd"]' '["run"]' consistd \
    "$(toml daemon/Cargo.toml package description)")" "$stage/layer.txt"
}

build_example_go() {
  local stage=$out/stage/example-go
  mkdir -p "$stage"
  (cd "$repo/examples/go" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod \
    go build -trimpath -ldflags '-s -w -buildid=' -o "$stage/greeting-operator" ./greeting-operator)
  { echo "file /greeting-operator 0755 $stage/greeting-operator"; base_layer "$stage"; } >"$stage/layer.txt"
  write example-go "localhost/consistd-example-go:$version" "$(config 65532:65532 '["/greeting-operator"]' \
    '["controller"]' consistd-example-go 'The Go Greeting operator example on the consistd Go SDK.')" \
    "$stage/layer.txt"
}

build_example_python() {
  local stage=$out/stage/example-python venv=$out/stage/example-python/venv want
  mkdir -p "$stage"
  # A venv of the machine's python3 with the SDK (not editable) and its dependencies; rebuilt when
  # pyproject.toml changes. The versions pip resolves are inputs: a newer grpcio is a different image.
  want=$(find "$repo/client-sdk/python/pyproject.toml" "$repo/client-sdk/python/src" -type f -not -name '*.pyc' |
    sort | xargs cat | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --progress-bar off \
      --no-compile "$repo/client-sdk/python" >&2
    echo "$want" >"$venv/.stamp"
  fi
  {
    rm -rf "$stage/stripped"
    python3 "$rootfs" python "$(python3 -c 'import sys; print(sys.executable)')" "$venv" /usr/local "$stage/stripped"
    echo "file /app/greeting_operator.py 0644 $repo/examples/python/greeting_operator.py"
  } >"$stage/runtime.txt"
  base_layer "$stage" >"$stage/base.txt"
  write example-python "localhost/consistd-example-python:$version" "$(config 65532:65532 \
    '["/usr/local/bin/python3", "/app/greeting_operator.py"]' '["controller"]' consistd-example-python \
    'The Python Greeting operator example on the consistd Python SDK.' \
    '["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"]')" "$stage/base.txt" "$stage/runtime.txt"
}

build_pause() {
  local stage=$out/stage/pause
  mkdir -p "$stage"
  gcc -static -Os -Wall -Wextra -Werror -o "$stage/pause.unstripped" "$repo/hack/image/pause.c"
  strip --strip-all -o "$stage/pause" "$stage/pause.unstripped"
  echo "file /pause 0755 $stage/pause" >"$stage/layer.txt"
  write pause localhost/pause:3.10 "$(config 65535:65535 '["/pause"]' '[]' pause \
    'A static pause process for pod sandboxes: holds the namespaces, reaps children, exits on SIGTERM.')" \
    "$stage/layer.txt"
}

build_busybox() {
  local stage=$out/stage/busybox bin=/bin/busybox
  mkdir -p "$stage"
  if ! dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then
    log "installing Debian's busybox-static"
    apt-get install -y -q -o DPkg::Lock::Timeout=300 busybox-static >&2 ||
      { apt-get update -q >&2 && apt-get install -y -q -o DPkg::Lock::Timeout=300 busybox-static >&2; }
  fi
  {
    echo "file /bin/busybox 0755 $bin"
    # One symlink per applet (bin/sh, usr/bin/env, ...), as `busybox --install -s` would make.
    "$bin" --list-full | sort | while read -r applet; do
      [ "$applet" = bin/busybox ] || echo "symlink /$applet /bin/busybox"
    done
    python3 "$rootfs" users "$stage"
    echo "dir /tmp 1777"
  } >"$stage/layer.txt"
  write busybox localhost/busybox:local "$(config 0:0 '[]' '["sh"]' busybox \
    "Debian's busybox-static $(dpkg-query -W -f '${Version}' busybox-static), for local pods.")" "$stage/layer.txt"
}

build() {
  mkdir -p "$out"
  for name in "$@"; do
    case "$name" in
    consistd | example-go | example-python | pause | busybox) "build_${name//-/_}" ;;
    *) die "unknown image $name (want one of: ${ALL[*]})" ;;
    esac
  done
}

if [ "${1:-}" = --check ]; then
  shift
  names=("$@")
  [ ${#names[@]} -gt 0 ] || names=("${ALL[@]}")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for round in a b; do
    log "--check: round $round into $tmp/$round"
    CONSISTD_IMAGE_DIR=$tmp/$round "$0" "${names[@]}" >/dev/null
  done
  failed=0
  for name in "${names[@]}"; do
    a=$(sha256sum <"$tmp/a/$name.tar" | cut -d' ' -f1) b=$(sha256sum <"$tmp/b/$name.tar" | cut -d' ' -f1)
    digest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["digest"])' "$tmp/a/$name.json")
    if [ "$a" = "$b" ] && cmp -s "$tmp/a/$name.json" "$tmp/b/$name.json"; then
      echo "reproducible $name $digest (tar sha256:$a)"
    else
      echo "DIFFERENT $name: tar sha256:$a vs sha256:$b"
      failed=1
    fi
  done
  exit $failed
fi

[ $# -gt 0 ] || set -- "${ALL[@]}"
build "$@"
