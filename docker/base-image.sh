#!/usr/bin/env bash
# Build the local base image lockgate/base:bookworm without any image registry:
#
#   debootstrap --variant=minbase bookworm  ->  tar  ->  docker import
#
# The image is Debian bookworm (minbase) + python3 (3.11) + python3-venv + ca-certificates,
# with apt sources for bookworm, bookworm-updates and bookworm-security (so Dockerfiles built
# on it can `apt-get install` with `docker build --network host`), docs/man pages/locales
# stripped and excluded from later installs, and apt configured like the official images
# (no recommends, no cached .debs).
#
#   docker/base-image.sh            # skip if the image exists
#   docker/base-image.sh --force    # rebuild
#
# Environment: LOCKGATE_BASE_IMAGE (default lockgate/base:bookworm),
#              LOCKGATE_DEBIAN_MIRROR, LOCKGATE_DEBIAN_SECURITY_MIRROR (the archive and
#              its security archive; no host is named here). Unset, they come from the
#              host's apt sources (/etc/apt/sources.list, sources.list.d/*.list and
#              *.sources): the first enabled `deb` source of a Debian suite, and of a
#              -security suite. With no Debian source on the host, debootstrap uses its
#              own default mirror and the image gets no security source (a warning says
#              so; set LOCKGATE_DEBIAN_SECURITY_MIRROR).
# Needs root and a running engine (docker/ensure-engine.sh). Progress goes to stderr.
set -euo pipefail

IMAGE="${LOCKGATE_BASE_IMAGE:-lockgate/base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
# Bump when the recipe below changes in a way that should produce a new image.
RECIPE_VERSION=1
# Debian suites a host's source may name (the archive serves every release).
DEBIAN_SUITES='(oldoldstable|oldstable|stable|testing|unstable|sid|buster|bullseye|bookworm|trixie|forky|duke)'

say() { printf '[base-image] %s\n' "$*" >&2; }

# host_apt_uri SUITE_REGEX: print the URI of the host's first enabled `deb` source with a
# suite matching SUITE_REGEX (an extended regex for the whole suite), or nothing.
# Reads the one-line format (sources.list, *.list) and deb822 (*.sources), as apt does.
host_apt_uri() {
    local want="^($1)\$" f uri=""
    local -a lists=() deb822=()
    [[ -f /etc/apt/sources.list ]] && lists+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list; do [[ -f $f ]] && lists+=("$f"); done
    for f in /etc/apt/sources.list.d/*.sources; do [[ -f $f ]] && deb822+=("$f"); done
    if ((${#lists[@]})); then
        # deb [options] URI SUITE COMPONENT...
        uri="$(sed -e 's/#.*//' -e 's/\[[^]]*\]//' "${lists[@]}" |
            awk -v want="$want" '$1 == "deb" && $3 ~ want { print $2; exit }')"
    fi
    if [[ -z $uri ]] && ((${#deb822[@]})); then
        # Paragraphs of "Field: value"; Types must hold deb, Enabled must not be no.
        uri="$(for f in "${deb822[@]}"; do sed -e '/^[[:space:]]*#/d' "$f"; printf '\n'; done |
            awk -v want="$want" '
                function done_par() {
                    if (types ~ /(^| )deb( |$)/ && enabled != "no" && uri != "") {
                        n = split(suites, s, " ")
                        for (i = 1; i <= n; i++) if (s[i] ~ want) { print uri; uri = ""; exit }
                    }
                    types = ""; suites = ""; uri = ""; enabled = ""
                }
                /^[ \t]*$/ { done_par(); next }
                tolower($1) == "types:" { $1 = ""; types = $0 " " }
                tolower($1) == "suites:" { $1 = ""; suites = $0 }
                tolower($1) == "uris:" { uri = $2 }
                tolower($1) == "enabled:" { enabled = tolower($2) }
                END { done_par() }')"
    fi
    [[ -n $uri ]] && printf '%s\n' "$uri"
    return 0
}

MIRROR="${LOCKGATE_DEBIAN_MIRROR:-$(host_apt_uri "$SUITE|$DEBIAN_SUITES(-updates)?")}"
SECURITY_MIRROR="${LOCKGATE_DEBIAN_SECURITY_MIRROR:-$(host_apt_uri "$DEBIAN_SUITES-security")}"

force=0
case "${1:-}" in
    --force) force=1 ;;
    "") ;;
    *) say "usage: $0 [--force]"; exit 2 ;;
esac

if ((force == 0)) && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE exists; skipping (use --force to rebuild)"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    say "debootstrap needs root"
    exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends debootstrap >&2; then
        apt-get update -q >&2
        apt-get install -y -q --no-install-recommends debootstrap >&2
    fi
fi

workdir="$(mktemp -d /var/tmp/lockgate-rootfs.XXXXXX)"
rootfs="$workdir/rootfs"
cleanup() {
    # Never leave /proc mounted inside a directory we are about to delete.
    if mountpoint -q "$rootfs/proc" 2>/dev/null; then umount -l "$rootfs/proc" || true; fi
    rm -rf --one-file-system "$workdir"
}
trap cleanup EXIT

start=$SECONDS
say "debootstrap --variant=minbase $SUITE into $rootfs (packages: $PACKAGES, mirror: ${MIRROR:-the debootstrap default})"
# Without a mirror argument debootstrap uses its own default.
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" ${MIRROR:+"$MIRROR"} >&2
if [[ -z $MIRROR ]]; then
    # The mirror debootstrap chose, from the sources.list it wrote into the rootfs.
    MIRROR="$(awk '$1 == "deb" { print $2; exit }' "$rootfs/etc/apt/sources.list" 2>/dev/null || true)"
    [[ -n $MIRROR ]] || { say "cannot tell which mirror debootstrap used: set LOCKGATE_DEBIAN_MIRROR"; exit 1; }
fi

# apt sources: the release, its updates and (when one is known) security.
rm -f "$rootfs/etc/apt/sources.list"
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
if [[ -n $SECURITY_MIRROR ]]; then
    cat >>"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
else
    say "warning: no Debian security source on the host and LOCKGATE_DEBIAN_SECURITY_MIRROR unset: the image has no $SUITE-security source"
fi

# apt/dpkg settings in the spirit of the official Debian images.
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
cat >"$rootfs/etc/apt/apt.conf.d/docker-no-languages" <<'EOF'
Acquire::Languages "none";
EOF
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
# Services must not start inside the image build.
cat >"$rootfs/usr/sbin/policy-rc.d" <<'EOF'
#!/bin/sh
exit 101
EOF
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"

say "applying $SUITE-updates / $SUITE-security"
mount -t proc proc "$rootfs/proc"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -q && apt-get -y -q upgrade && apt-get clean' >&2
umount "$rootfs/proc"

# Slim down: what the dpkg excludes above keep out of later installs.
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs/usr/share/man/"* "$rootfs/usr/share/info/"* "$rootfs/usr/share/lintian"
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
rm -rf "$rootfs/var/lib/apt/lists/"* "$rootfs/var/cache/apt/"* "$rootfs/var/log/"*.log \
    "$rootfs/var/cache/debconf/"*-old "$rootfs/tmp/"*
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
find "$rootfs/dev" -mindepth 1 -delete

python_version="$(chroot "$rootfs" python3 -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')"
say "rootfs ready ($(du -sh --apparent-size "$rootfs" | cut -f1), python $python_version); importing as $IMAGE"

tar --numeric-owner --xattrs -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL org.opencontainers.image.title=lockgate-base" \
    --change "LABEL org.opencontainers.image.base.name=debian:$SUITE-minbase" \
    --change "LABEL io.lockgate.base.recipe=$RECIPE_VERSION" \
    --change "LABEL io.lockgate.base.python=$python_version" \
    --message "debootstrap --variant=minbase $SUITE + $PACKAGES" \
    - "$IMAGE" >/dev/null

say "built $IMAGE in $((SECONDS - start))s"
