# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this file
# Building OCI image archives with no daemon: a small base root filesystem made from Debian
# packages, and buildah (chroot isolation, no network) for the Containerfiles.
# Source it; it needs root, buildah and apt-get (images/build.sh installs buildah).

IMAGES_SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
AETHER_CACHE="${AETHER_CACHE:-/var/cache/aether}"
# buildah's image store, and the base root filesystems by package versions.
BUILDAH_STORE="$AETHER_CACHE/buildah"
BASE_CACHE="$AETHER_CACHE/image-base"

# The base of aether's images: glibc and libgcc (aether's programs link them), nftables and
# libnftables (the proxy and aether-cni program pods' tables with them), the CA
# certificates; and exactly the libraries those need, nothing else (no shell, no package
# manager).
BASE_PACKAGES=(libc6 libgcc-s1 nftables libnftables1 libedit2 libbsd0 libmd0 libtinfo6 libgmp10
    libjansson4 libmnl0 libnftnl11 libxtables12 ca-certificates)

# The tag of aether's images: the chart's appVersion.
app_version() {
    sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$IMAGES_SOURCE/../charts/aether/Chart.yaml"
}

ensure_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return
    local apt=(apt-get -qq -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update
    DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
        "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
}

# base_rootfs: prints the path of the base root filesystem (a tar), made once per set of
# package versions from the packages' own files (no maintainer scripts run).
base_rootfs() {
    local versions key tar work deb
    versions="$(apt-cache policy "${BASE_PACKAGES[@]}" | awk '/^[^ ]/ {p=$1} /Candidate:/ {print p $2}')"
    if [ "$(grep -c . <<<"$versions")" -ne "${#BASE_PACKAGES[@]}" ] || grep -q '(none)' <<<"$versions"; then
        apt-get -qq -o DPkg::Lock::Timeout=600 update
        versions="$(apt-cache policy "${BASE_PACKAGES[@]}" | awk '/^[^ ]/ {p=$1} /Candidate:/ {print p $2}')"
    fi
    if grep -q '(none)' <<<"$versions"; then
        echo "images: apt has no candidate for some base packages:" >&2
        grep '(none)' <<<"$versions" >&2
        return 1
    fi
    key="$(sha256sum <<<"$versions" | cut -c1-16)"
    tar="$BASE_CACHE/base-$key.tar"
    if [ ! -f "$tar" ]; then
        work="$(mktemp -d)"
        mkdir -p "$work/debs" "$work/root" "$BASE_CACHE"
        (cd "$work/debs" && apt-get download -qq "${BASE_PACKAGES[@]}" 2>/dev/null) ||
            { echo "images: apt-get download of ${BASE_PACKAGES[*]} failed" >&2; rm -rf "$work"; return 1; }
        for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
        (
            cd "$work/root"
            rm -rf usr/share/doc usr/share/man usr/share/info usr/share/locale usr/share/lintian \
                usr/lib/x86_64-linux-gnu/gconv
            # What update-ca-certificates would make of the packaged certificates.
            mkdir -p etc/ssl/certs
            cat usr/share/ca-certificates/*/*.crt > etc/ssl/certs/ca-certificates.crt
            # root, and the user non-root images run as.
            printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > etc/passwd
            printf 'root:x:0:\nnonroot:x:65532:\n' > etc/group
            mkdir -p tmp home/nonroot && chmod 1777 tmp && chown 65532:65532 home/nonroot
        )
        # The base must really run what it is for.
        if ! chroot "$work/root" /usr/sbin/nft --version >/dev/null; then
            echo "images: nft does not run in the base root filesystem" >&2
            rm -rf "$work"
            return 1
        fi
        tar --sort=name --mtime=@0 --numeric-owner -C "$work/root" -cf "$tar.tmp" .
        mv "$tar.tmp" "$tar"
        rm -rf "$work"
    fi
    echo "$tar"
}

# build_image NAME CONTEXT CONTAINERFILE ARCHIVE: builds CONTAINERFILE in CONTEXT (a
# directory) and writes the image, named NAME, to the OCI archive ARCHIVE.
build_image() {
    local name="$1" context="$2" containerfile="$3" archive="$4"
    local buildah=(buildah --root "$BUILDAH_STORE/root" --runroot "$BUILDAH_STORE/run" --storage-driver vfs)
    mkdir -p "$BUILDAH_STORE/cni" "$(dirname "$archive")"
    # --timestamp 0: the same inputs give the same image, so nodes import nothing new.
    # --cni-config-dir: with chroot isolation buildah would otherwise create /etc/cni/net.d.
    "${buildah[@]}" bud --quiet --isolation chroot --cni-config-dir "$BUILDAH_STORE/cni" \
        --timestamp 0 --layers=false -f "$containerfile" -t "$name" "$context" >/dev/null
    rm -f "$archive"
    "${buildah[@]}" push --quiet "$name" "oci-archive:$archive:$name"
    "${buildah[@]}" rmi "$name" >/dev/null
}
