#!/usr/bin/env bash
# Build the GPU-less stub host image for the integration tests (idempotent).
#
#   scripts/setup-stubs.sh            # apt (if missing) -> rootfs (cached) -> import -> build
#   RGT_STUB_MIRROR=http://... scripts/setup-stubs.sh   # override the Debian mirror
#   RGT_STUB_FORCE=1 scripts/setup-stubs.sh             # rebuild everything
#
# Writes nothing to /etc: podman reads tests/stubs/containers.conf through CONTAINERS_CONF.
# Steps already done are skipped:
#   - the base rootfs tar is cached as tests/stubs/.cache/rootfs-<hash>.tar, <hash> over the
#     suite, variant, package list and mmdebstrap options below;
#   - localhost/rgt-stub-base:latest carries the label rgt.rootfs=<hash>;
#   - localhost/rgt-stub:latest carries the label rgt.inputs=<hash of rootfs hash + build context>.
# Machine facts (runc not crun, lower ulimits): the comments in tests/stubs/containers.conf.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STUBS="$REPO/tests/stubs"
CACHE="$STUBS/.cache"
export CONTAINERS_CONF="$STUBS/containers.conf"

BASE_IMAGE="localhost/rgt-stub-base:latest"
STUB_IMAGE="localhost/rgt-stub:latest"
SUITE="bookworm"
VARIANT="minbase"
PACKAGES="openssh-server,python3,tmux,rsync,procps,iproute2,psmisc,ca-certificates"
MMDEBSTRAP_OPTS=(
  "--variant=$VARIANT"
  "--include=$PACKAGES"
  "--dpkgopt=path-exclude=/usr/share/doc/*"
  "--dpkgopt=path-exclude=/usr/share/man/*"
  "--dpkgopt=path-exclude=/usr/share/locale/*"
  "--dpkgopt=path-exclude=/usr/share/info/*"
  '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*'
  '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
)
HOST_PACKAGES=(podman netavark aardvark-dns catatonit runc iptables nftables iproute2 mmdebstrap
               openssh-client rsync tmux util-linux)

log() { printf '[setup-stubs %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
t0=$SECONDS

# --- 1. host packages --------------------------------------------------------------------------
missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then log "missing packages ${missing[*]} and not root"; exit 1; fi
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "host packages present"
fi

# --- 2. base rootfs (cached) ---------------------------------------------------------------------
mirror_from_apt() {
  # First deb URI of the main Debian archive that apt on this machine uses (deb822 or one-line format).
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    uri=$(awk 'BEGIN{IGNORECASE=1} /^URIs:/ {for (i=2;i<=NF;i++) if ($i !~ /security/) {print $i; exit}}' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r $f ]] || continue
    uri=$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {if ($i !~ /security/) {print $i; exit}}}' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
}
MIRROR="${RGT_STUB_MIRROR:-$(mirror_from_apt)}"
[[ -n $MIRROR ]] || { log "cannot find a Debian mirror in /etc/apt; set RGT_STUB_MIRROR"; exit 1; }

ROOTFS_HASH=$(printf '%s\n' "$SUITE" "${MMDEBSTRAP_OPTS[@]}" | sha256sum | cut -c1-16)
ROOTFS_TAR="$CACHE/rootfs-$ROOTFS_HASH.tar"
mkdir -p "$CACHE"
# one setup at a time (parallel test sessions call this through the harness)
exec 9>"$CACHE/.lock"
flock 9
if [[ -n ${RGT_STUB_FORCE:-} ]]; then rm -f "$ROOTFS_TAR"; fi
if [[ -s $ROOTFS_TAR ]]; then
  log "rootfs cached: $ROOTFS_TAR"
else
  log "mmdebstrap $SUITE ($VARIANT) from $MIRROR"
  ts=$SECONDS
  mmdebstrap --quiet --format=tar "${MMDEBSTRAP_OPTS[@]}" "$SUITE" "$ROOTFS_TAR.tmp" "$MIRROR"
  mv -f "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  # keep only the newest rootfs tar
  find "$CACHE" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$ROOTFS_HASH.tar" -delete
  log "rootfs built in $((SECONDS - ts)) s"
fi

# --- 3. import ------------------------------------------------------------------------------------
label_of() { podman image inspect --format "{{ index .Labels \"$2\" }}" "$1" 2>/dev/null || true; }
if [[ -z ${RGT_STUB_FORCE:-} && "$(label_of "$BASE_IMAGE" rgt.rootfs)" == "$ROOTFS_HASH" ]]; then
  log "base image up to date: $BASE_IMAGE"
else
  log "podman import -> $BASE_IMAGE"
  podman import --quiet --change "LABEL rgt.rootfs=$ROOTFS_HASH" --change 'CMD ["/bin/bash"]' \
    "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
fi

# --- 4. build -------------------------------------------------------------------------------------
INPUTS_HASH=$( { echo "$ROOTFS_HASH";
                 cd "$STUBS" && find . -path ./.cache -prune -o -type f ! -name containers.conf -print0 \
                   | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
if [[ -z ${RGT_STUB_FORCE:-} && "$(label_of "$STUB_IMAGE" rgt.inputs)" == "$INPUTS_HASH" ]]; then
  log "stub image up to date: $STUB_IMAGE"
else
  log "podman build -> $STUB_IMAGE"
  podman build --quiet --pull=never --label "rgt.inputs=$INPUTS_HASH" \
    -f "$STUBS/Containerfile" -t "$STUB_IMAGE" "$STUBS" >/dev/null
  # drop dangling layers of earlier builds
  podman image prune -f >/dev/null 2>&1 || true
fi
log "done in $((SECONDS - t0)) s: $STUB_IMAGE (export CONTAINERS_CONF=$CONTAINERS_CONF)"
