#!/usr/bin/env bash
# Build the cairn test-host images from local files, without any registry:
#
#   cairn-testhost:ash     this machine's own sshd, sftp-server, ssh-keygen and their libraries,
#                          busybox-static for /bin/sh (ash) and every applet. No network. ~1 s.
#   cairn-testhost:debian  Debian bookworm (debootstrap --variant=minbase, openssh-server and
#                          procps): dash as /bin/sh, bash as root's shell, GNU coreutils,
#                          util-linux. The debootstrap result is cached as a tarball
#                          (~30-40 s once per machine, needs the Debian mirror), later builds
#                          only re-import it.
#
# Usage: docker/build-images.sh [ash|debian|all] [--force]     (default: all)
#
# Idempotent: every image carries a label `cairn.inputs` with a hash of everything it is made
# of (the scripts here, the copied binaries, the cached Debian tarball). If the image exists with
# the same hash, nothing is done.
#
# Environment:
#   CAIRN_TESTHOST_IMAGE   image repository (default cairn-testhost)
#   CAIRN_TESTHOST_CACHE   cache directory for the Debian base tarball
#                          (default ${XDG_CACHE_HOME:-~/.cache}/cairn-testhost); cache it in CI
#   CAIRN_DEBIAN_MIRROR    Debian mirror for debootstrap (default: the first .../debian URI in
#                          /etc/apt/sources.list*, else http://deb.debian.org/debian)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${CAIRN_TESTHOST_IMAGE:-cairn-testhost}
CACHE=${CAIRN_TESTHOST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn-testhost}
SUITE=bookworm
DEBIAN_INCLUDE=openssh-server,procps
# Bump when the way the Debian base is made changes (forces a new debootstrap).
DEBIAN_BASE_RECIPE="v1 $SUITE minbase $DEBIAN_INCLUDE slim"

die() { echo "build-images: $*" >&2; exit 1; }
note() { echo "build-images: $*" >&2; }

need() { command -v "$1" >/dev/null 2>&1 || die "missing '$1' on this machine ($2)"; }

TMPDIRS=()
cleanup() { local d; for d in "${TMPDIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT
mktempdir() { local d; d=$(mktemp -d "${TMPDIR:-/tmp}/cairn-testhost.XXXXXX"); TMPDIRS+=("$d"); echo "$d"; }

hash_files() { sha256sum "$@" | sha256sum | cut -c1-32; }

# Hash of the files every flavour is made of.
common_hash() { hash_files "$HERE/build-images.sh" "$HERE/host-init" "$HERE/sshd_config"; }

image_label() {
  docker image inspect -f '{{ index .Config.Labels "cairn.inputs" }}' "$1" 2>/dev/null || true
}

# import ROOTFS_DIR FLAVOUR HASH: tar the rootfs into a docker image, drop the old one.
import_rootfs() {
  local dir=$1 flavour=$2 hash=$3 image="$REPO:$2" old new
  old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
  tar --numeric-owner -C "$dir" -c . |
    docker import \
      --change 'CMD ["/sbin/cairn-host-init"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change "LABEL cairn.inputs=$hash" \
      --change "LABEL cairn.flavour=$flavour" \
      - "$image" >/dev/null
  new=$(docker image inspect -f '{{.Id}}' "$image")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then
    docker rmi "$old" >/dev/null 2>&1 || note "old $image ($old) still in use, left in place"
  fi
}

# Files shared by both flavours: init, sshd config, no host key (made at first boot).
install_common() {
  local r=$1 flavour=$2
  mkdir -p "$r/sbin" "$r/etc/ssh/authorized_keys.d" "$r/etc/cairn" "$r/var/log" "$r/run" "$r/tmp" "$r/root"
  install -m 0755 "$HERE/host-init" "$r/sbin/cairn-host-init"
  install -m 0644 "$HERE/sshd_config" "$r/etc/ssh/sshd_config"
  rm -f "$r"/etc/ssh/ssh_host_*
  echo "$flavour" > "$r/etc/cairn/flavour"
  chmod 755 "$r/etc/ssh/authorized_keys.d"
  chmod 1777 "$r/tmp"
  chmod 700 "$r/root"
}

# ---------------------------------------------------------------- ash flavour

ash_bins() {
  local b
  echo /usr/sbin/sshd
  echo /usr/lib/openssh/sftp-server
  echo /usr/bin/ssh-keygen
  # Newer OpenSSH (9.8+) splits sshd into helpers that sshd execs by path.
  for b in /usr/lib/openssh/sshd-session /usr/lib/openssh/sshd-auth; do
    [ -e "$b" ] && echo "$b"
  done
  return 0
}

# Every file copied into the ash rootfs: the binaries, busybox, and their ldd libraries.
ash_files() {
  local b
  { ash_bins; echo "$BUSYBOX"
    for b in $(ash_bins) "$BUSYBOX"; do
      ldd "$b" 2>/dev/null | grep -o '/[^ ]*' || true
    done
  } | sort -u
}

find_busybox() {
  local b
  for b in /bin/busybox /usr/bin/busybox; do
    if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then echo "$b"; return 0; fi
  done
  die "no static busybox found: install busybox-static"
}

build_ash() {
  need sshd "install openssh-server (only its files are used)"
  need ssh-keygen "install openssh-client"
  need ldd "install libc-bin"
  BUSYBOX=$(find_busybox)
  local files hash r f a
  files=$(ash_files)
  # shellcheck disable=SC2086  # one path per line, no spaces
  hash=$(printf '%s\n' "ash $(common_hash)" "$(hash_files $files)" | sha256sum | cut -c1-32)
  if [ "${FORCE:-0}" != 1 ] && [ "$(image_label "$REPO:ash")" = "$hash" ]; then
    note "$REPO:ash is up to date ($hash)"; return 0
  fi
  r=$(mktempdir)/rootfs
  mkdir -p "$r"
  (
    cd "$r"
    mkdir -p bin sbin usr/bin usr/sbin usr/lib/openssh etc/ssh var/log var/empty proc sys dev root home
    for f in $files; do cp -L --parents "$f" "$r"; done
    [ "$BUSYBOX" = /bin/busybox ] || cp -L "$BUSYBOX" bin/busybox
    for a in $(bin/busybox --list-full); do
      [ -e "$a" ] || [ -L "$a" ] || ln -s /bin/busybox "$a"
    done
    [ -e bin/sh ] || ln -s /bin/busybox bin/sh
    [ -e /etc/ssh/moduli ] && cp /etc/ssh/moduli etc/ssh/moduli
    cat > etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
sshd:x:100:65534:sshd privilege separation:/run/sshd:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
    cat > etc/group <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
    printf 'root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' > etc/shadow
    chmod 640 etc/shadow
    printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' > etc/nsswitch.conf
    printf '127.0.0.1 localhost\n' > etc/hosts
    printf '/bin/sh\n/bin/ash\n' > etc/shells
  )
  install_common "$r" ash
  import_rootfs "$r" ash "$hash"
  note "built $REPO:ash ($hash)"
}

# ------------------------------------------------------------- debian flavour

detect_mirror() {
  local f u
  if [ -n "${CAIRN_DEBIAN_MIRROR:-}" ]; then echo "$CAIRN_DEBIAN_MIRROR"; return; fi
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    u=$(grep -v '^[[:space:]]*#' "$f" | grep -Eo '(https?|file)://[^[:space:]]*/debian/?([[:space:]]|$)' |
        head -n1 | tr -d '[:space:]' || true)
    if [ -n "$u" ]; then echo "${u%/}"; return; fi
  done
  echo http://deb.debian.org/debian
}

debian_base() {
  local base="$CACHE/debian-$SUITE-base.tar" r mirror keyring=() t0
  if [ -s "$base" ] && [ -s "$base.recipe" ] && [ "$(cat "$base.recipe")" = "$DEBIAN_BASE_RECIPE" ] &&
     [ -s "$base.sha256" ]; then
    return 0
  fi
  need debootstrap "apt-get install -y debootstrap"
  [ "$(id -u)" = 0 ] || die "debootstrap needs root"
  [ -r /usr/share/keyrings/debian-archive-keyring.gpg ] &&
    keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
  [ ${#keyring[@]} -gt 0 ] || die "no /usr/share/keyrings/debian-archive-keyring.gpg: apt-get install -y debian-archive-keyring"
  mirror=$(detect_mirror)
  mkdir -p "$CACHE"
  r=$(mktempdir)/rootfs
  note "debootstrap $SUITE from $mirror (once per machine, ~30-40 s) ..."
  t0=$(date +%s)
  debootstrap --variant=minbase --include="$DEBIAN_INCLUDE" "${keyring[@]}" "$SUITE" "$r" "$mirror" \
    > "$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed, see $CACHE/debootstrap.log"
  if grep -q " ${r}[/ ]" /proc/mounts; then die "something is still mounted under $r"; fi
  note "debootstrap took $(( $(date +%s) - t0 )) s"
  # Slim: docs, man pages, locales, apt caches; docker provides /dev; no shared host key.
  rm -rf "${r:?}"/usr/share/doc/* "${r:?}"/usr/share/man/* "${r:?}"/usr/share/info/* \
         "${r:?}"/usr/share/locale/* "${r:?}"/var/cache/apt/* "${r:?}"/var/lib/apt/lists/* \
         "${r:?}"/var/cache/debconf/*-old "${r:?}"/var/log/* "${r:?}"/dev/* "${r:?}"/etc/ssh/ssh_host_*
  tar --numeric-owner -C "$r" -cf "$base.tmp" .
  sha256sum "$base.tmp" | cut -c1-64 > "$base.sha256"
  mv -f "$base.tmp" "$base"
  echo "$DEBIAN_BASE_RECIPE" > "$base.recipe"
  note "cached $base ($(du -h "$base" | cut -f1))"
}

build_debian() {
  local base="$CACHE/debian-$SUITE-base.tar" hash r
  debian_base
  hash=$(printf '%s\n' "debian $(common_hash)" "$(cat "$base.sha256")" | sha256sum | cut -c1-32)
  if [ "${FORCE:-0}" != 1 ] && [ "$(image_label "$REPO:debian")" = "$hash" ]; then
    note "$REPO:debian is up to date ($hash)"; return 0
  fi
  [ "$(id -u)" = 0 ] || die "unpacking the Debian rootfs needs root (file ownership)"
  r=$(mktempdir)/rootfs
  mkdir -p "$r"
  tar --numeric-owner -C "$r" -xf "$base"
  # root's dot files, for a fresh home filesystem (copied by cairn-host-init, never overwriting)
  mkdir -p "$r/etc/cairn/root-skel"
  cp -a "$r/root/." "$r/etc/cairn/root-skel/"
  install_common "$r" debian
  [ "$(readlink "$r/bin/sh")" = dash ] || die "Debian rootfs: /bin/sh is not dash"
  grep -q '^root:.*:/bin/bash$' "$r/etc/passwd" || die "Debian rootfs: root's shell is not bash"
  import_rootfs "$r" debian "$hash"
  note "built $REPO:debian ($hash)"
}

# ---------------------------------------------------------------------- main

FORCE=0
what=all
for arg in "$@"; do
  case $arg in
    ash|debian|all) what=$arg ;;
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (usage: build-images.sh [ash|debian|all] [--force])" ;;
  esac
done

need docker "install docker"
docker info >/dev/null 2>&1 || die "docker is installed but the engine is not reachable"

case $what in
  ash) build_ash ;;
  debian) build_debian ;;
  all) build_ash; build_debian ;;
esac
