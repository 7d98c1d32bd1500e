#!/usr/bin/env bash
# Fleet benchmark: the same short command on N Docker test hosts with the same
# parallelism, side by side in one run: `cairn run --hosts` with the native host helper and with
# the sh script (CAIRN_HOST_HELPER=never), parallel-ssh (Debian `pssh`), and an
# Ansible ad-hoc command (`pip install ansible-core`; `-m raw`, the ash hosts have no Python).
# Rounds are interleaved (cairn, pssh, ansible, cairn, …); the table prints medians and ratios.
#
# Usage: benches/fleet.sh [--hosts N] [--parallel P] [--rounds R] [--command CMD] [--keep]
#   CAIRN_BIN   the cairn binary (default: cargo build --release, target/release/cairn)
# Needs: a Docker engine and root or `sudo -n` (docker/hosts.sh), parallel-ssh, ansible.
# Every wait is bounded (timeout 300 per fleet run).
set -euo pipefail

N=50
P=32
R=5
CMD='uname -n'
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) N=$2; shift 2 ;;
    --parallel) P=$2; shift 2 ;;
    --rounds) R=$2; shift 2 ;;
    --command) CMD=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "usage: $0 [--hosts N] [--parallel P] [--rounds R] [--command CMD] [--keep]" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOSTS_SH="$REPO/docker/hosts.sh"
PREFIX="benchfleet$$"
export CAIRN_TESTHOST_STATE_ROOT=${CAIRN_TESTHOST_STATE_ROOT:-$REPO/target/tmp/bench-fleet}
S="$CAIRN_TESTHOST_STATE_ROOT/$PREFIX"
WORK=$(mktemp -d)

PSSH=$(command -v parallel-ssh || command -v pssh || true)
ANSIBLE=$(command -v ansible || true)
[ -n "$PSSH" ] || { echo "fleet.sh: parallel-ssh not found (apt-get install -y pssh)" >&2; exit 1; }
[ -n "$ANSIBLE" ] || { echo "fleet.sh: ansible not found (pip install ansible-core)" >&2; exit 1; }

if [ -n "${CAIRN_BIN:-}" ]; then
  CAIRN=$CAIRN_BIN
else
  (cd "$REPO" && cargo build --release --bin cairn >&2)
  CAIRN=$REPO/target/release/cairn
fi
"$CAIRN" run --help | grep -q -- --hosts || { echo "fleet.sh: $CAIRN has no --hosts" >&2; exit 1; }

cleanup() {
  if [ "$KEEP" = 0 ]; then "$HOSTS_SH" --prefix "$PREFIX" down >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "fleet.sh: bringing up $N ash hosts ($PREFIX)…" >&2
CAIRN_TESTHOST_PARALLEL=${CAIRN_TESTHOST_PARALLEL:-16} timeout 900 "$HOSTS_SH" --prefix "$PREFIX" up "$N" --flavour ash >&2

ALIASES=$(seq 1 "$N" | sed 's/^/h/' | paste -sd, -)
seq 1 "$N" | sed 's/^/h/' > "$WORK/pssh-hosts"
{
  echo "[fleet]"
  seq 1 "$N" | sed 's/^/h/'
  echo
  echo "[fleet:vars]"
  echo "ansible_ssh_common_args='-F $S/ssh_config'"
  echo "ansible_user=root"
} > "$WORK/inventory.ini"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

run_cairn() {
  timeout 300 "$CAIRN" run --journal "$WORK/journal.db" -F "$S/ssh_config" \
    --known-hosts "$S/known_hosts" --hosts "$ALIASES" --parallel "$P" --json -- "$CMD" \
    > "$WORK/cairn.out" 2> "$WORK/cairn.err"
}
# the same with the host side in sh (no native helper), side by side
run_cairn_sh() {
  CAIRN_HOST_HELPER=never timeout 300 "$CAIRN" run --journal "$WORK/journal-sh.db" -F "$S/ssh_config" \
    --known-hosts "$S/known_hosts" --hosts "$ALIASES" --parallel "$P" --json -- "$CMD" \
    > "$WORK/cairn-sh.out" 2> "$WORK/cairn-sh.err"
}
run_pssh() {
  timeout 300 "$PSSH" -h "$WORK/pssh-hosts" -p "$P" -t 120 -x "-F $S/ssh_config" "$CMD" \
    > "$WORK/pssh.out" 2> "$WORK/pssh.err"
}
run_ansible() {
  ANSIBLE_HOST_KEY_CHECKING=True ANSIBLE_NOCOLOR=1 ANSIBLE_LOCAL_TEMP="$WORK/ansible-tmp" \
    timeout 300 "$ANSIBLE" fleet -i "$WORK/inventory.ini" -f "$P" -m raw -a "$CMD" \
    > "$WORK/ansible.out" 2> "$WORK/ansible.err"
}

# One warm-up of each (ansible's first start compiles its Python; not measured).
run_cairn || { echo "fleet.sh: cairn warm-up failed:" >&2; tail -5 "$WORK/cairn.err" "$WORK/cairn.out" >&2; exit 1; }
run_cairn_sh || { echo "fleet.sh: cairn (sh) warm-up failed:" >&2; tail -5 "$WORK/cairn-sh.err" "$WORK/cairn-sh.out" >&2; exit 1; }
run_pssh || { echo "fleet.sh: pssh warm-up failed:" >&2; tail -5 "$WORK/pssh.out" "$WORK/pssh.err" >&2; exit 1; }
run_ansible || { echo "fleet.sh: ansible warm-up failed:" >&2; tail -5 "$WORK/ansible.out" "$WORK/ansible.err" >&2; exit 1; }

declare -a TC TS TP TA
for r in $(seq 1 "$R"); do
  t=$(now); run_cairn || { echo "fleet.sh: cairn run $r failed" >&2; exit 1; }; TC+=("$(elapsed "$t")")
  t=$(now); run_cairn_sh || { echo "fleet.sh: cairn (sh) run $r failed" >&2; exit 1; }; TS+=("$(elapsed "$t")")
  t=$(now); run_pssh || { echo "fleet.sh: pssh run $r failed" >&2; exit 1; }; TP+=("$(elapsed "$t")")
  t=$(now); run_ansible || { echo "fleet.sh: ansible run $r failed" >&2; exit 1; }; TA+=("$(elapsed "$t")")
  echo "fleet.sh: round $r: cairn ${TC[-1]}s  cairn (sh) ${TS[-1]}s  pssh ${TP[-1]}s  ansible ${TA[-1]}s" >&2
done
ok=$(grep '"type":"host"' "$WORK/cairn.out" | grep -c '"exit_code":0,' || true)
[ "$ok" = "$N" ] || { echo "fleet.sh: cairn: only $ok of $N hosts ok" >&2; exit 1; }
ok=$(grep '"type":"host"' "$WORK/cairn-sh.out" | grep -c '"exit_code":0,' || true)
[ "$ok" = "$N" ] || { echo "fleet.sh: cairn (sh): only $ok of $N hosts ok" >&2; exit 1; }

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
MC=$(median "${TC[@]}"); MS=$(median "${TS[@]}"); MP=$(median "${TP[@]}"); MA=$(median "${TA[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo
echo "Machine: nproc $(nproc); $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg); cairn $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree); $($PSSH --version 2>&1 | head -1 | sed 's/^/parallel-ssh /'); $($ANSIBLE --version 2>/dev/null | head -1); date $(date -u +%Y-%m-%dT%H:%MZ)"
echo "$N ash hosts, --parallel/-p/-f $P, command \`$CMD\`, $R interleaved rounds after one warm-up each; wall time of the whole fleet run, medians"
echo
echo "| tool | median wall time | cairn (helper) ÷ tool | cairn (sh) ÷ tool | target | met (helper) |"
echo "|---|---|---|---|---|---|"
echo "| cairn run --hosts (native helper) | ${MC} s | — | — | — | — |"
echo "| cairn run --hosts, CAIRN_HOST_HELPER=never (sh) | ${MS} s | $(ratio "$MC" "$MS") | — | — | — |"
rp=$(ratio "$MC" "$MP"); ra=$(ratio "$MC" "$MA")
mp=$(awk -v r="$rp" 'BEGIN { print (r <= 0.3) ? "yes" : "**no**" }')
ma=$(awk -v r="$ra" 'BEGIN { print (r <= 0.1) ? "yes" : "**no**" }')
echo "| parallel-ssh | ${MP} s | ${rp} | $(ratio "$MS" "$MP") | ≤ 0.3 | $mp |"
echo "| ansible ad-hoc (raw) | ${MA} s | ${ra} | $(ratio "$MS" "$MA") | ≤ 0.1 | $ma |"
echo
echo "all rounds: cairn ${TC[*]}; cairn (sh) ${TS[*]}; pssh ${TP[*]}; ansible ${TA[*]}"
