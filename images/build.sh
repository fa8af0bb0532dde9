#!/usr/bin/env bash
# Builds aether's container images as OCI archives, with no daemon: operator, proxy and cni,
# each on a base made from Debian packages (images/lib.sh), tagged with the chart's
# appVersion. Needs root on Debian 12 (it installs buildah with apt-get when missing).
#
#   images/build.sh [--debug] [--registry REGISTRY] [--out DIR]
#
# --debug      the dev build of the workspace instead of the release build (the local
#              cluster's tests use it)
# --registry   the images' names: REGISTRY/operator:TAG ... (default localhost/aether, the
#              chart's default `image.registry`)
# --out        where the archives go: DIR/aether-operator.tar ... (default
#              $AETHER_CACHE/images)
#
# Push them to a registry of yours with skopeo, e.g.
#   skopeo copy oci-archive:DIR/aether-proxy.tar docker://registry.example.com/aether/proxy:0.1.0
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"

profile=release registry=localhost/aether out="$AETHER_CACHE/images"
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=debug ;;
        --registry) registry="${2:?--registry needs a value}"; shift ;;
        --out) out="${2:?--out needs a value}"; shift ;;
        *) echo "usage: $0 [--debug] [--registry REGISTRY] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done

ensure_packages buildah binutils
tag="$(app_version)"
[ -n "$tag" ] || { echo "no appVersion in charts/aether/Chart.yaml" >&2; exit 1; }
target="${CARGO_TARGET_DIR:-$AETHER_CACHE/target}"
cargo_flags=(--workspace --bins --quiet)
[ "$profile" = release ] && cargo_flags+=(--release)
(cd "$here/.." && CARGO_TARGET_DIR="$target" cargo build "${cargo_flags[@]}")

base="$(base_rootfs)"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$base" "$context/base.tar"
mkdir -p "$out"
for component in operator proxy cni; do
    binary="$target/$profile/aether-$component" archive="$out/aether-$component.tar"
    # An archive made from the same program, Containerfile, base and name is not made again.
    key="$(stat -c '%Y %s' "$binary") $(sha256sum "$here/$component.Containerfile" | cut -c1-16) $(basename "$base") $registry/$component:$tag"
    if [ ! -f "$archive" ] || [ "$(cat "$archive.inputs" 2>/dev/null)" != "$key" ]; then
        # Debug info stays in the build; the image gets the program and its symbols.
        strip --strip-debug -o "$context/aether-$component" "$binary"
        build_image "$registry/$component:$tag" "$context" "$here/$component.Containerfile" "$archive"
        rm "$context/aether-$component"
        echo "$key" > "$archive.inputs"
    fi
    printf '%-32s %s\n' "$registry/$component:$tag" "$(du -h "$archive" | cut -f1) $archive"
done
