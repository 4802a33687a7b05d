#!/usr/bin/env bash
# Build the lego-rl base image without a container registry.
#
# debootstrap a minimal Debian (trixie: python3 is 3.13, which the OpenHands SDK needs), add python3, git,
# patch, bash, coreutils, ca-certificates and pytest (wheels fetched on the host with `pip download`, installed
# inside the chroot with the pip wheel itself), create the non-root `agent` user, and import the tree as
#   lego-rl/base:trixie-<recipe hash>   (content-addressed)   and   lego-rl/base:trixie   (stable alias)
# Task Dockerfiles build `FROM lego-rl/base:trixie`; build-images hashes the base image id into task tags, so a
# new recipe invalidates every task image.
#
# Idempotent and cached: the recipe hash covers this script; an existing image is re-tagged and reused, and
# the rootfs tarball is kept in $LEGO_RL_CACHE/base/ so a pruned engine re-imports it in seconds.
# Needs root (debootstrap, chroot) and a Debian mirror; uses the `docker` CLI only for import/tag (the Rust
# code talks to the engine through bollard).
#
# Usage: scripts/bootstrap-base-image.sh [--print-tag] [--force]
set -euo pipefail

SUITE="${LEGO_RL_BASE_SUITE:-trixie}"
MIRROR="${LEGO_RL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,git,patch,ca-certificates,procps,less"
PIP_PINS="pip==25.2 pytest==8.4.1"
PYVER="3.13"
CACHE="${LEGO_RL_CACHE:-$HOME/.cache/lego-rl}/base"
NAME="lego-rl/base"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self="$here/$(basename "${BASH_SOURCE[0]}")"
hash="$(sha256sum "$self" | cut -c1-12)"
TAG="$NAME:$SUITE-$hash"
ALIAS="$NAME:$SUITE"

force=0
for arg in "$@"; do
  case "$arg" in
    --print-tag) echo "$TAG"; exit 0 ;;
    --force) force=1 ;;
    *) echo "usage: $0 [--print-tag] [--force]" >&2; exit 2 ;;
  esac
done

log() { echo "bootstrap-base-image: $*" >&2; }

if [[ $force == 0 ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
  docker tag "$TAG" "$ALIAS"
  log "cache hit: $TAG (aliased $ALIAS)"
  exit 0
fi

mkdir -p "$CACHE"
tarball="$CACHE/$SUITE-$hash.tar"
if [[ $force == 1 || ! -s "$tarball" ]]; then
  if ! command -v debootstrap >/dev/null; then
    # A fresh machine: install it from Debian's packages (root, no prompts).
    if [ "$(id -u)" -eq 0 ]; then
      log "installing debootstrap"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
    fi
    command -v debootstrap >/dev/null || { log "debootstrap missing: apt-get install debootstrap"; exit 2; }
  fi
  work="$(mktemp -d "$CACHE/build.XXXXXX")"
  trap 'umount -l "$work/root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
  log "debootstrap $SUITE from $MIRROR (takes minutes)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

  log "downloading wheels: $PIP_PINS (python $PYVER)"
  mkdir -p "$work/root/tmp/wheels"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --only-binary=:all: --python-version "$PYVER" --implementation py \
    --dest "$work/root/tmp/wheels" $PIP_PINS
  pipwhl="$(cd "$work/root/tmp/wheels" && ls pip-*.whl)"
  # shellcheck disable=SC2086
  chroot "$work/root" /usr/bin/python3 "/tmp/wheels/$pipwhl/pip" install --quiet --no-index \
    --break-system-packages --root-user-action=ignore --no-compile --find-links /tmp/wheels $PIP_PINS

  chroot "$work/root" /usr/sbin/useradd --create-home --uid 1000 --shell /bin/bash agent
  chroot "$work/root" git config --system init.defaultBranch main
  chroot "$work/root" git config --system --add safe.directory '*'
  # Slim the tree: caches and docs are not needed in sandboxes.
  rm -rf "$work/root/tmp/wheels" "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* \
    "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/locale"
  find "$work/root" -name __pycache__ -type d -prune -exec rm -rf {} +
  tar --numeric-owner -C "$work/root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi

log "importing $tarball as $TAG"
docker import \
  --change 'ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL lego-rl.base-recipe=$hash" \
  "$tarball" "$TAG" >/dev/null
docker tag "$TAG" "$ALIAS"
log "built $TAG (aliased $ALIAS)"
