#!/usr/bin/env bash
# Docker test hosts for cairn, and the faults its tests inject into them.
#
# Usage: docker/hosts.sh [--prefix NAME] COMMAND [ARGS...]
#
#   up N [--flavour ash|debian] [--subnet A.B.C.0/24] [--shared-host-key]
#                         start N hosts h1..hN (builds the image if needed); with
#                         --shared-host-key all hosts of the set present one host key (a
#                         cloned image), else each has its own
#   down                  remove containers, network, home filesystems and state
#   list                  print the hosts file (alias IP container)
#   ssh HOST [CMD...]     OpenSSH to a host with the generated ssh_config
#   exec HOST CMD...      docker exec (for test assertions); exec-i passes stdin too
#
#   cut HOST / restore HOST             link down / up (host side of the veth: blackhole)
#   isolate HOST / unisolate HOST       this machine loses / regains its route to HOST (an
#                                       `unreachable` route): the client cannot connect to it,
#                                       the other hosts (a bastion) still reach it on the bridge
#   reboot HOST                         docker kill + docker start, waits for sshd
#   restart-sshd HOST                   kill sshd by its pid file, start it again
#   stop-sshd HOST / start-sshd HOST    the two halves of restart-sshd
#   hang HOST / unhang HOST             docker pause / unpause
#   fill-disk HOST / unfill-disk HOST   fill the home filesystem (holding ~/.cairn) to 100% / free it
#   readonly-markers HOST [--dirs-only] / writable-markers HOST
#                                       chattr +i on ~/.cairn and everything in it / undo
#   wipe-markers HOST                   rm -rf ~/.cairn (the marker home), as an operator or a
#                                       re-imaging would; the host keeps running
#
# HOST is an alias (h3), a number (3), a container name (cairn-h3) or an IP address.
#
# Environment:
#   CAIRN_TESTHOST_PREFIX      default prefix (default: cairn); --prefix wins
#   CAIRN_TESTHOST_STATE_ROOT  where state dirs live (default: docker/.state); state is ROOT/PREFIX
#   CAIRN_TESTHOST_SUBNET      subnet for `up` (default: 172.29.X.0/24, X derived from the prefix)
#   CAIRN_TESTHOST_HOME_SIZE   size of each host's home filesystem (default: 32M)
#   CAIRN_TESTHOST_TIMEOUT     bound, in seconds, of every wait (default: 60)
#   CAIRN_TESTHOST_IMAGE       image repository (default: cairn-testhost)
#   CAIRN_TESTHOST_PARALLEL    containers started at once by `up` (default: 8)
#
# Each host's home (/root, holding ~/.cairn) is a small ext4 image, loop-mounted on this machine
# at STATE/hN/home and bind-mounted into the container: it survives reboots (docker kill + start)
# and can be filled without touching the machine's disk. That, chattr, and the veth link need
# root: the script uses `sudo -n` when not run as root.
#
# Sourcing (bash): `source docker/hosts.sh` defines the cmd_* functions without running anything.

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${CAIRN_TESTHOST_IMAGE:-cairn-testhost}
PREFIX=${CAIRN_TESTHOST_PREFIX:-cairn}
STATE_ROOT=${CAIRN_TESTHOST_STATE_ROOT:-$HERE/.state}
HOME_SIZE=${CAIRN_TESTHOST_HOME_SIZE:-32M}
TIMEOUT=${CAIRN_TESTHOST_TIMEOUT:-60}
PARALLEL=${CAIRN_TESTHOST_PARALLEL:-8}
FILL_PREFIX=.testhost-fill   # files created in the home filesystem by fill-disk

die() { echo "hosts.sh: $*" >&2; exit 1; }
note() { echo "hosts.sh: $*" >&2; }

# Run as root: directly, or through sudo without a password prompt.
priv() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

state_dir() { echo "$STATE_ROOT/$PREFIX"; }
net_name() { echo "$PREFIX-net"; }

require_docker() {
  command -v docker >/dev/null 2>&1 || die "docker is not installed: these tests need a Docker engine"
  docker info >/dev/null 2>&1 || die "docker is installed but the engine is not reachable (is dockerd running, may this user use it?)"
}

# ------------------------------------------------------------------ addresses

ip2int() {
  local a b c d
  IFS=. read -r a b c d <<< "$1"
  echo $(( (a << 24) | (b << 16) | (c << 8) | d ))
}

# cidr_overlap A/n B/m: true if the two ranges share an address.
cidr_overlap() {
  local a=${1%/*} an=${1#*/} b=${2%/*} bn=${2#*/} as ae bs be
  [ "$an" = "$1" ] && an=32
  [ "$bn" = "$2" ] && bn=32
  as=$(( $(ip2int "$a") & (0xffffffff << (32 - an)) & 0xffffffff )); ae=$(( as + (1 << (32 - an)) - 1 ))
  bs=$(( $(ip2int "$b") & (0xffffffff << (32 - bn)) & 0xffffffff )); be=$(( bs + (1 << (32 - bn)) - 1 ))
  [ "$as" -le "$be" ] && [ "$bs" -le "$ae" ]
}

default_subnet() {
  local x
  x=$(printf '%s' "$PREFIX" | cksum | cut -d' ' -f1)
  echo "172.29.$(( x % 200 + 20 )).0/24"
}

# Fail unless SUBNET collides with no docker network and no route of this machine.
check_subnet_free() {
  local subnet=$1 other
  [[ $subnet =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.0/24$ ]] || die "subnet must look like A.B.C.0/24, got '$subnet'"
  while read -r other; do
    [ -n "$other" ] || continue
    [[ $other == *:* ]] && continue
    cidr_overlap "$subnet" "$other" &&
      die "subnet $subnet overlaps docker network subnet $other; choose another with --subnet or CAIRN_TESTHOST_SUBNET"
  done < <(docker network ls -q | xargs -r docker network inspect -f '{{range .IPAM.Config}}{{println .Subnet}}{{end}}')
  while read -r other rest; do
    # Typed routes (`unreachable A.B.C.D`, as `isolate` adds) name the range second.
    case $other in unreachable|blackhole|prohibit|throw) other=${rest%% *} ;; esac
    [ "$other" = default ] && continue
    cidr_overlap "$subnet" "$other" &&
      die "subnet $subnet overlaps route '$other' of this machine; choose another with --subnet or CAIRN_TESTHOST_SUBNET"
  done < <(ip -4 route show 2>/dev/null)
  return 0
}

# ---------------------------------------------------------------- host lookup

load_state() {
  local s; s=$(state_dir)
  [ -f "$s/env" ] || die "no hosts up for prefix '$PREFIX' (no $s/env); run: docker/hosts.sh up N"
  # shellcheck source=/dev/null
  . "$s/env"
}

# resolve HOST: sets H_ALIAS, H_IP, H_NAME, H_DIR from the hosts file.
resolve() {
  local want=$1 alias ip name s
  load_state
  s=$(state_dir)
  [[ $want =~ ^[0-9]+$ ]] && want=h$want
  while read -r alias ip name; do
    if [ "$want" = "$alias" ] || [ "$want" = "$ip" ] || [ "$want" = "$name" ]; then
      H_ALIAS=$alias; H_IP=$ip; H_NAME=$name; H_DIR=$s/$alias
      return 0
    fi
  done < "$s/hosts"
  die "unknown host '$1' (prefix '$PREFIX'; see $s/hosts)"
}

container_state() { docker inspect -f '{{.State.Status}}' "$1" 2>/dev/null || echo missing; }

# ---------------------------------------------------------------- bounded waits

# ssh_banner IP: prints the first 7 bytes sshd sends ("SSH-2.0") or nothing.
ssh_banner() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/22" && head -c 7 <&3' _ "$1" 2>/dev/null || true
}

# wait_ssh IP [SECONDS]: until sshd answers with its banner, else fail loudly.
wait_ssh() {
  local ip=$1 limit=${2:-$TIMEOUT} t0=$SECONDS
  until [ "$(ssh_banner "$ip")" = SSH-2.0 ]; do
    [ $(( SECONDS - t0 )) -lt "$limit" ] || die "sshd on $ip did not answer within $limit s"
    sleep 0.1
  done
}

# wait_status CONTAINER STATUS [SECONDS]
wait_status() {
  local c=$1 want=$2 limit=${3:-$TIMEOUT} t0=$SECONDS st
  while st=$(container_state "$c"); [ "$st" != "$want" ]; do
    [ $(( SECONDS - t0 )) -lt "$limit" ] || die "container $c is '$st', not '$want', after $limit s"
    sleep 0.05
  done
}

# ------------------------------------------------------------------------- up

cmd_up() {
  local n="" flavour=ash subnet=${CAIRN_TESTHOST_SUBNET:-} s net base gw image i ip name t0 pubkey
  local shared_key=0
  while [ $# -gt 0 ]; do
    case $1 in
      --flavour) [ $# -ge 2 ] || die "--flavour needs a value"; flavour=$2; shift 2 ;;
      --flavour=*) flavour=${1#*=}; shift ;;
      --subnet) [ $# -ge 2 ] || die "--subnet needs a value"; subnet=$2; shift 2 ;;
      --subnet=*) subnet=${1#*=}; shift ;;
      --shared-host-key) shared_key=1; shift ;;
      [0-9]*) n=$1; shift ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 240 ]; then die "up: N must be 1..240"; fi
  case $flavour in ash|debian) ;; *) die "up: flavour must be ash or debian" ;; esac
  require_docker
  for c in ssh-keygen ssh-keyscan ssh mkfs.ext4 timeout ip; do
    command -v "$c" >/dev/null 2>&1 || die "up: '$c' is missing on this machine"
  done
  priv true 2>/dev/null || die "up: needs root (or passwordless sudo) to loop-mount the home filesystems"
  [ -n "$subnet" ] || subnet=$(default_subnet)
  t0=$(now)
  s=$(state_dir); net=$(net_name); image="$REPO:$flavour"
  if [ -e "$s" ] || docker network inspect "$net" >/dev/null 2>&1 ||
     [ -n "$(docker ps -aq --filter "label=cairn.testhost=$PREFIX")" ]; then
    die "prefix '$PREFIX' is already up (state $s); run: docker/hosts.sh --prefix $PREFIX down"
  fi
  "$HERE/build-images.sh" "$flavour" >&2 || die "up: building $image failed"
  check_subnet_free "$subnet"
  base=${subnet%.0/24}; gw=$base.1

  mkdir -p "$s"
  ssh-keygen -q -t ed25519 -N '' -C "cairn-testhost-client@$PREFIX" -f "$s/id_ed25519"
  pubkey=$(cat "$s/id_ed25519.pub")
  : > "$s/hosts"
  for i in $(seq 1 "$n"); do
    printf 'h%s %s %s\n' "$i" "$base.$(( 10 + i ))" "$PREFIX-h$i" >> "$s/hosts"
  done
  cat > "$s/env" <<EOF
PREFIX=$PREFIX
FLAVOUR=$flavour
SUBNET=$subnet
NETWORK=$net
COUNT=$n
SHARED_HOST_KEY=$shared_key
EOF

  docker network create --driver bridge --subnet "$subnet" --gateway "$gw" \
    --label "cairn.testhost=$PREFIX" "$net" >/dev/null || die "up: cannot create network $net ($subnet)"

  # Per host: its ed25519 host key (kept in the state dir, mounted read-only, so it survives
  # reboots and known_hosts is known before boot) and a small ext4 home image, loop-mounted here.
  # With --shared-host-key every host gets a copy of one key, as hosts cloned from one image do.
  : > "$s/known_hosts"
  if [ "$shared_key" = 1 ]; then
    ssh-keygen -q -t ed25519 -N '' -C "cairn-testhost@$PREFIX-shared" -f "$s/shared_host_ed25519_key"
  fi
  while read -r alias ip _; do
    mkdir -p "$s/$alias"
    if [ "$shared_key" = 1 ]; then
      cp "$s/shared_host_ed25519_key" "$s/$alias/ssh_host_ed25519_key"
      cp "$s/shared_host_ed25519_key.pub" "$s/$alias/ssh_host_ed25519_key.pub"
    else
      ssh-keygen -q -t ed25519 -N '' -C "cairn-testhost@$alias" -f "$s/$alias/ssh_host_ed25519_key"
    fi
    printf '%s %s\n' "$ip" "$(cut -d' ' -f1,2 < "$s/$alias/ssh_host_ed25519_key.pub")" >> "$s/known_hosts"
    mkdir -p "$s/$alias/home"
    truncate -s "$HOME_SIZE" "$s/$alias/home.img"
    mkfs.ext4 -q -F -b 4096 -m 0 -L "$alias-home" "$s/$alias/home.img" || die "up: mkfs.ext4 failed for $alias"
    priv mount -o loop "$s/$alias/home.img" "$s/$alias/home" || die "up: cannot loop-mount $s/$alias/home.img"
    priv chmod 700 "$s/$alias/home"
  done < "$s/hosts"

  local t_fs t_run t_scan
  t_fs=$(since "$t0")
  # Start containers, $PARALLEL at a time (dockerd is the bottleneck, not the hosts).
  local batch=0
  while read -r alias ip name; do
    docker run -d --name "$name" --hostname "$alias" \
      --network "$net" --ip "$ip" \
      --label "cairn.testhost=$PREFIX" \
      --tmpfs /run:rw,mode=755,nosuid,nodev \
      --tmpfs /tmp:rw,mode=1777,nosuid,nodev,exec \
      -v "$s/$alias/home:/root" \
      -v "$s/$alias/ssh_host_ed25519_key:/etc/ssh/ssh_host_ed25519_key:ro" \
      -v "$s/$alias/ssh_host_ed25519_key.pub:/etc/ssh/ssh_host_ed25519_key.pub:ro" \
      -e "AUTHORIZED_KEYS=$pubkey" \
      --stop-timeout 5 \
      "$image" > "$s/$alias/run.log" 2>&1 || echo "$alias" >> "$s/run-failed" &
    batch=$(( batch + 1 ))
    [ $(( batch % PARALLEL )) -eq 0 ] && wait
  done < "$s/hosts"
  wait
  if [ -s "$s/run-failed" ]; then
    while read -r alias; do cat "$s/$alias/run.log" >&2; done < "$s/run-failed"
    die "up: $(wc -l < "$s/run-failed") container(s) failed to start; clean up with: docker/hosts.sh --prefix $PREFIX down"
  fi

  t_run=$(since "$t0")

  {
    echo "# cairn test hosts, prefix $PREFIX, flavour $flavour, network $net ($subnet)"
    echo "# use: ssh -F $s/ssh_config h1"
    while read -r alias ip _; do printf 'Host %s\n  HostName %s\n' "$alias" "$ip"; done < "$s/hosts"
    cat <<EOF
Host *
  User root
  IdentityFile $s/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $s/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  UpdateHostKeys no
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
EOF
  } > "$s/ssh_config"

  # Ready = every host accepts an OpenSSH login with the client key and the known host key.
  # Each host is retried until the deadline (bounded: ConnectTimeout and an overall timeout).
  local bad
  # shellcheck disable=SC2016  # expanded by the inner sh
  bad=$(awk '{print $1}' "$s/hosts" | timeout "$(( TIMEOUT + 10 ))" xargs -P 16 -I{} sh -c '
          end=$(( $(date +%s) + $3 ))
          until ssh -F "$1" "$2" true </dev/null >/dev/null 2>"$4/$2/login.err"; do
            [ "$(date +%s)" -lt "$end" ] || { echo "$2"; exit 0; }
            sleep 0.2
          done' _ "$s/ssh_config" {} "$TIMEOUT" "$s" || echo "(timeout)")
  if [ -n "$bad" ]; then
    die "up: no ssh login within $TIMEOUT s on: $(echo "$bad" | tr '\n' ' ')(see $s/HOST/login.err and: docker/hosts.sh exec HOST cat /var/log/sshd.log); clean up with: docker/hosts.sh --prefix $PREFIX down"
  fi
  t_scan=$(since "$t0")

  note "$n $flavour host(s) up in $(since "$t0") s (network, keys, homes: $t_fs s; containers started: $t_run s; all logins ok: $t_scan s), network $net ($subnet), state $s"
  cat <<EOF
Hosts (alias IP container): $s/hosts
Connect with OpenSSH:
  ssh -F $s/ssh_config h1
  ssh -F $s/ssh_config h1 'uname -n; cat /etc/cairn/flavour'
EOF
}

# ----------------------------------------------------------------------- down

cmd_down() {
  local s ids net mp tries
  require_docker
  s=$(state_dir); net=$(net_name)
  ids=$(docker ps -aq --filter "label=cairn.testhost=$PREFIX")
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086
    docker ps -q --filter status=paused --filter "label=cairn.testhost=$PREFIX" | xargs -r docker unpause >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    docker rm -f $ids >/dev/null || die "down: cannot remove containers"
  fi
  if docker network inspect "$net" >/dev/null 2>&1; then
    docker network rm "$net" >/dev/null || die "down: cannot remove network $net"
  fi
  if [ -f "$s/isolated" ]; then
    # (an address may be listed twice, or its route already gone: neither stops the rest)
    while read -r ip; do
      if [ -n "$ip" ]; then priv ip route del unreachable "$ip/32" 2>/dev/null || true; fi
    done < "$s/isolated"
  fi
  if [ -d "$s" ]; then
    for mp in "$s"/h*/home; do
      [ -d "$mp" ] || continue
      tries=0
      while mountpoint -q "$mp"; do
        priv umount "$mp" 2>/dev/null && break
        tries=$(( tries + 1 ))
        [ "$tries" -lt 50 ] || die "down: cannot unmount $mp"
        sleep 0.1
      done
    done
    if grep -q " $s/" /proc/mounts; then die "down: something is still mounted under $s, not removing it"; fi
    rm -rf "$s"
  fi
  rmdir "$STATE_ROOT" 2>/dev/null || true
  note "prefix '$PREFIX' is down"
}

cmd_list() { load_state; cat "$(state_dir)/hosts"; }

cmd_ssh() {
  [ $# -ge 1 ] || die "usage: ssh HOST [CMD...]"
  resolve "$1"; shift
  exec ssh -F "$(state_dir)/ssh_config" "$H_ALIAS" "$@"
}

cmd_exec() {
  [ $# -ge 2 ] || die "usage: exec HOST CMD..."
  resolve "$1"; shift
  docker exec "$H_NAME" "$@"
}

cmd_exec_i() {
  [ $# -ge 2 ] || die "usage: exec-i HOST CMD..."
  resolve "$1"; shift
  docker exec -i "$H_NAME" "$@"
}

# ----------------------------------------------------------------- link faults

# host_veth CONTAINER: the host-side veth of the container's eth0.
host_veth() {
  local pid peer dev
  pid=$(docker inspect -f '{{.State.Pid}}' "$1")
  if [ -z "$pid" ] || [ "$pid" = 0 ]; then die "container $1 is not running"; fi
  peer=$(priv nsenter -t "$pid" -n ip -o link show eth0 | sed -n 's/^[0-9]*: eth0@if\([0-9]*\):.*/\1/p')
  [ -n "$peer" ] || die "cannot find the veth peer of $1's eth0"
  dev=$(ip -o link show | awk -F': ' -v i="$peer" '$1 == i { sub(/@.*/, "", $2); print $2 }')
  [ -n "$dev" ] || die "no host interface with index $peer for $1"
  # Only a port of this set's own bridge is ever taken down: an index that names anything
  # else (the machine's own uplink, say) is refused, never touched.
  local id bridge
  id=$(docker network inspect -f '{{.Id}}' "$(net_name)") || die "cannot inspect network $(net_name)"
  bridge=br-${id:0:12}
  [ "$(basename "$(readlink "/sys/class/net/$dev/master" 2>/dev/null)")" = "$bridge" ] ||
    die "interface $dev (index $peer) is not a port of $bridge, the bridge of $(net_name): refused"
  echo "$dev"
}

# The container keeps its interface, address and routes (its eth0 only loses carrier): packets
# in both directions are dropped, an established TCP connection blackholes and is not reset.
cmd_cut() {
  [ $# -eq 1 ] || die "usage: cut HOST"
  resolve "$1"
  local dev; dev=$(host_veth "$H_NAME")
  priv ip link set dev "$dev" down || die "cut: cannot set $dev down"
  note "cut $H_ALIAS ($H_IP): $dev down"
}

cmd_restore() {
  [ $# -eq 1 ] || die "usage: restore HOST"
  resolve "$1"
  local dev t0=$SECONDS; dev=$(host_veth "$H_NAME")
  priv ip link set dev "$dev" up || die "restore: cannot set $dev up"
  until ip -o link show dev "$dev" | grep -q 'state UP'; do
    [ $(( SECONDS - t0 )) -lt "$TIMEOUT" ] || die "restore: $dev is not up after $TIMEOUT s"
    sleep 0.05
  done
  note "restored $H_ALIAS ($H_IP): $dev up"
}

# An `unreachable` route for the host's address on this machine: connecting from here fails at
# once (No route to host), while the other containers still reach it on their bridge. `down`
# removes the routes it recorded.
cmd_isolate() {
  [ $# -eq 1 ] || die "usage: isolate HOST"
  resolve "$1"
  priv ip route replace unreachable "$H_IP/32" || die "isolate: cannot add a route for $H_IP"
  grep -qxF "$H_IP" "$(state_dir)/isolated" 2>/dev/null || echo "$H_IP" >> "$(state_dir)/isolated"
  note "isolated $H_ALIAS ($H_IP): no route from this machine"
}

cmd_unisolate() {
  [ $# -eq 1 ] || die "usage: unisolate HOST"
  resolve "$1"
  priv ip route del unreachable "$H_IP/32" 2>/dev/null || true
  note "unisolated $H_ALIAS ($H_IP)"
}

# ---------------------------------------------------------------- host faults

cmd_reboot() {
  [ $# -eq 1 ] || die "usage: reboot HOST"
  resolve "$1"
  local t0 st; t0=$(now)
  st=$(container_state "$H_NAME")
  [ "$st" = paused ] && { docker unpause "$H_NAME" >/dev/null || die "reboot: cannot unpause $H_NAME"; }
  if [ "$st" = running ] || [ "$st" = paused ]; then
    docker kill "$H_NAME" >/dev/null 2>&1 || true
  fi
  wait_status "$H_NAME" exited
  docker start "$H_NAME" >/dev/null || die "reboot: cannot start $H_NAME"
  wait_ssh "$H_IP"
  note "rebooted $H_ALIAS ($H_IP) in $(since "$t0") s"
}

cmd_stop_sshd() {
  [ $# -eq 1 ] || die "usage: stop-sshd HOST"
  resolve "$1"
  # Only the listener dies: running sessions are separate processes and go on.
  docker exec "$H_NAME" sh -c '
    pid=$(cat /run/sshd.pid 2>/dev/null) || { echo "no /run/sshd.pid" >&2; exit 1; }
    kill "$pid" 2>/dev/null
    i=0
    while [ -e "/proc/$pid" ] && ! grep -q "^[0-9]* ([^)]*) Z" "/proc/$pid/stat" 2>/dev/null; do
      i=$((i + 1)); [ "$i" -le 100 ] || { echo "sshd $pid did not exit in 10 s" >&2; exit 1; }
      sleep 0.1
    done
    rm -f /run/sshd.pid' || die "stop-sshd: failed on $H_ALIAS"
}

cmd_start_sshd() {
  [ $# -eq 1 ] || die "usage: start-sshd HOST"
  resolve "$1"
  docker exec "$H_NAME" /usr/sbin/sshd -E /var/log/sshd.log || die "start-sshd: sshd failed on $H_ALIAS"
  wait_ssh "$H_IP"
}

cmd_restart_sshd() {
  [ $# -eq 1 ] || die "usage: restart-sshd HOST"
  local t0; t0=$(now)
  cmd_stop_sshd "$1"
  cmd_start_sshd "$1"
  note "restarted sshd on $H_ALIAS in $(since "$t0") s"
}

cmd_hang() {
  [ $# -eq 1 ] || die "usage: hang HOST"
  resolve "$1"
  # The freezer gives up ("unable to freeze") while a task sits in uninterruptible sleep, as a
  # `sync` on a slow disk does: try again, at most 10 times over about 2 s.
  local i=0 err
  until err=$(docker pause "$H_NAME" 2>&1 >/dev/null); do
    [ "$(container_state "$H_NAME")" = paused ] && return 0
    i=$(( i + 1 ))
    [ "$i" -lt 10 ] || die "hang: cannot pause $H_NAME: $err"
    sleep 0.2
  done
}

cmd_unhang() {
  [ $# -eq 1 ] || die "usage: unhang HOST"
  resolve "$1"
  docker unpause "$H_NAME" >/dev/null || die "unhang: cannot unpause $H_NAME"
}

# ---------------------------------------------------------------- disk faults

home_mount() {
  local mp="$H_DIR/home"
  mountpoint -q "$mp" || die "$H_ALIAS: its home filesystem is not mounted at $mp"
  echo "$mp"
}

cmd_fill_disk() {
  [ $# -eq 1 ] || die "usage: fill-disk HOST"
  resolve "$1"
  local mp avail; mp=$(home_mount)
  avail=$(( $(stat -f -c '%a * %S' "$mp") ))
  if [ "$avail" -gt 65536 ]; then
    priv fallocate -l $(( avail - 65536 )) "$mp/$FILL_PREFIX.0" 2>/dev/null || true
  fi
  # Then byte by byte-ish until the filesystem refuses (bounded by its size).
  priv dd if=/dev/zero of="$mp/$FILL_PREFIX.1" bs=4096 2>/dev/null || true
  # A supervisor still running may free a file meanwhile (a rename over an older record): fill
  # what it freed, a bounded number of times, as the fill's own last step does.
  local try
  for try in 2 3 4 5 6; do
    priv dd if=/dev/zero of="$mp/$FILL_PREFIX.$try" bs=1 2>/dev/null || true
    priv sync -f "$mp"
    avail=$(stat -f -c '%a' "$mp")
    [ "$avail" = 0 ] && break
  done
  [ "$avail" = 0 ] || die "fill-disk: $avail blocks still free on $mp"
  note "filled $H_ALIAS's home ($mp, $(df -h --output=size "$mp" | tail -n1 | tr -d ' '))"
}

cmd_unfill_disk() {
  [ $# -eq 1 ] || die "usage: unfill-disk HOST"
  resolve "$1"
  local mp; mp=$(home_mount)
  priv rm -f "$mp/$FILL_PREFIX".*
  priv sync -f "$mp"
}

# root ignores mode bits, but not the immutable attribute: with `chattr +i` on the directory
# nothing can be created, renamed or removed in it, and on a file it cannot be written, even by
# root (the containers lack CAP_LINUX_IMMUTABLE, so they cannot undo it). --dirs-only leaves
# existing files writable (running jobs keep appending) and only forbids new entries.
markers_dir() {
  local mp; mp=$(home_mount)
  # a home cairn has not made yet is made as cairn makes it: private (0700), or the next hello
  # refuses it for good ("accessible by other users")
  [ -d "$mp/.cairn" ] || priv mkdir -m 700 "$mp/.cairn"
  echo "$mp/.cairn"
}

cmd_readonly_markers() {
  [ $# -ge 1 ] || die "usage: readonly-markers HOST [--dirs-only]"
  resolve "$1"
  local d types=(-type d -o -type f); d=$(markers_dir)
  [ "${2:-}" = --dirs-only ] && types=(-type d)
  chattr_all +i "$d" "${types[@]}" || die "readonly-markers: chattr failed under $d"
}

# chattr FLAG on every entry of TYPES under DIR. The host is live: a file found may be renamed or
# removed before chattr reaches it. Such a miss is not a failure; another pass takes what is there
# now (frozen directories take no new entries, so it settles). Any other error fails at once.
chattr_all() {
  local flag=$1 dir=$2 err; shift 2
  err=$(mktemp)
  for _ in 1 2 3 4 5; do
    if priv find "$dir" \( "$@" \) -exec chattr "$flag" {} + 2>"$err"; then
      rm -f "$err"; return 0
    fi
    if grep -v -e 'No such file or directory' "$err" | grep -q .; then
      cat "$err" >&2; rm -f "$err"; return 1
    fi
  done
  cat "$err" >&2; rm -f "$err"; return 1
}

cmd_writable_markers() {
  [ $# -eq 1 ] || die "usage: writable-markers HOST"
  resolve "$1"
  local d; d=$(markers_dir)
  chattr_all -i "$d" -type d -o -type f || die "writable-markers: chattr failed under $d"
}

# The whole marker home goes (epoch, records, output), from outside the container: works while
# the host runs, is hung or is down. Running supervisors lose their files; the next cairn
# invocation creates a new home with a new epoch.
cmd_wipe_markers() {
  [ $# -eq 1 ] || die "usage: wipe-markers HOST"
  resolve "$1"
  local mp; mp=$(home_mount)
  [ -e "$mp/.cairn" ] || { note "wipe-markers: $H_ALIAS has no marker home"; return 0; }
  # A supervisor still running on the host (an earlier execution's) may create an entry while
  # rm walks the tree, and rm then fails with "Directory not empty"; an operator would run rm
  # again, so this does too, a bounded number of times. Once rm succeeds the home was gone at
  # that moment: a supervisor that recreates it afterwards is the host's doing, not the wipe's.
  local try
  for try in 1 2 3 4 5 6 7 8 9; do
    priv rm -rf "$mp/.cairn" 2>/dev/null && break
    note "wipe-markers: try $try: $mp/.cairn rm failed, trying again"
    sleep 0.1
  done
  [ ! -e "$mp/.cairn" ] || priv rm -rf "$mp/.cairn" \
    || die "wipe-markers: cannot remove $mp/.cairn after 10 tries (readonly-markers still on? run writable-markers $H_ALIAS)"
  priv sync -f "$mp"
  note "wiped the marker home of $H_ALIAS ($mp/.cairn)"
}

# ----------------------------------------------------------------------- main

usage() { sed -n '2,/^# Sourcing/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

main() {
  set -euo pipefail
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
      --prefix=*) PREFIX=${1#*=}; shift ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || { usage; exit 2; }
  local cmd=$1; shift
  # --prefix is also accepted after the command (not inside a command line for exec or ssh).
  local args=()
  case $cmd in exec|exec-i|ssh) args=("$@"); set -- ;; esac
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
      --prefix=*) PREFIX=${1#*=}; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [[ $PREFIX =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ ]] || die "bad prefix '$PREFIX'"
  set -- "${args[@]+"${args[@]}"}"
  case $cmd in
    up|down|list|ssh|exec|cut|restore|reboot|hang|unhang|isolate|unisolate) "cmd_$cmd" "$@" ;;
    exec-i) cmd_exec_i "$@" ;;
    restart-sshd) cmd_restart_sshd "$@" ;;
    stop-sshd) cmd_stop_sshd "$@" ;;
    start-sshd) cmd_start_sshd "$@" ;;
    fill-disk) cmd_fill_disk "$@" ;;
    unfill-disk) cmd_unfill_disk "$@" ;;
    readonly-markers) cmd_readonly_markers "$@" ;;
    writable-markers) cmd_writable_markers "$@" ;;
    wipe-markers) cmd_wipe_markers "$@" ;;
    -h|--help|help) usage ;;
    *) die "unknown command '$cmd' (see docker/hosts.sh --help)" ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
