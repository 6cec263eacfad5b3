#!/usr/bin/env bash
# The container base image, made from Debian's packages (no image registry is needed): debootstrap a minimal
# bookworm with ca-certificates and curl (the HEALTHCHECK's), import it into podman as localhost/cdc-base:bookworm.
# Idempotent: an image already there is kept. Needs root (debootstrap, rootful podman).
#   scripts/base-image.sh [MIRROR]
set -euo pipefail
IMAGE="${CDC_BASE_IMAGE:-localhost/cdc-base:bookworm}"
MIRROR="${1:-http://deb.debian.org/debian}"
if podman image exists "$IMAGE"; then
  echo "base-image: $IMAGE is there" >&2
  exit 0
fi
root=$(mktemp -d /var/tmp/cdc-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap bookworm (minbase) from $MIRROR" >&2
debootstrap --variant=minbase --include=ca-certificates,curl bookworm "$root" "$MIRROR" > "$root.log" 2>&1 || { tail -30 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# smaller and reproducible-ish: no apt lists, caches or logs
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >&2
echo "base-image: $IMAGE imported" >&2
