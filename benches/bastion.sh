#!/usr/bin/env bash
# Bastion benchmark (issue 18): one short command on 20 Docker test hosts that this machine
# cannot route to, reached through one bastion, side by side in one run: `cairn run --hosts`
# (one connection to the bastion, a channel per target), a shell loop of `ssh -J` started in
# parallel (a connection to the bastion per target), and parallel-ssh (Debian `pssh`) with
# ProxyJump from the ssh_config when it is installed. Rounds are interleaved; the table prints
# medians, ratios and the connections each made to the bastion.
#
# Usage: benches/bastion.sh [--targets N] [--rounds R] [--command CMD] [--keep]
#   CAIRN_BIN   the cairn binary (default: cargo build --release, target/release/cairn)
# Needs: a Docker engine and root or `sudo -n` (docker/hosts.sh). Every run is bounded
# (timeout 300).
set -euo pipefail

N=20
R=5
CMD='uname -n'
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) N=$2; shift 2 ;;
    --rounds) R=$2; shift 2 ;;
    --command) CMD=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "usage: $0 [--targets N] [--rounds R] [--command CMD] [--keep]" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOSTS_SH="$REPO/docker/hosts.sh"
PREFIX="benchjump$$"
export CAIRN_TESTHOST_STATE_ROOT=${CAIRN_TESTHOST_STATE_ROOT:-$REPO/target/tmp/bench-bastion}
S="$CAIRN_TESTHOST_STATE_ROOT/$PREFIX"
WORK=$(mktemp -d)
PSSH=$(command -v parallel-ssh || command -v pssh || true)

if [ -n "${CAIRN_BIN:-}" ]; then
  CAIRN=$CAIRN_BIN
else
  (cd "$REPO" && cargo build --release --bin cairn >&2)
  CAIRN=$REPO/target/release/cairn
fi

cleanup() {
  if [ "$KEEP" = 0 ]; then "$HOSTS_SH" --prefix "$PREFIX" down >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "bastion.sh: bringing up 1 bastion and $N ash targets ($PREFIX)…" >&2
CAIRN_TESTHOST_PARALLEL=${CAIRN_TESTHOST_PARALLEL:-16} timeout 900 "$HOSTS_SH" --prefix "$PREFIX" up "$((N + 1))" --flavour ash >&2
TARGETS=$(seq 2 "$((N + 1))" | sed 's/^/h/')
for t in $TARGETS; do "$HOSTS_SH" --prefix "$PREFIX" isolate "$t" >&2; done
BASTION_IP=$(awk '$1 == "h1" { print $2 }' "$S/hosts")
{
  echo "Host $(echo "$TARGETS" | paste -sd' ' -)"
  echo "  ProxyJump h1"
  cat "$S/ssh_config"
} > "$WORK/config"
echo "$TARGETS" > "$WORK/pssh-hosts"
ALIASES=$(echo "$TARGETS" | paste -sd, -)

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
# Most established connections from here to the bastion while "$@" runs.
PEAK=0
peak() {
  "$@" & local pid=$! most=0 n
  while kill -0 "$pid" 2>/dev/null; do
    n=$(ss -Htn state established dst "$BASTION_IP:22" | grep -c . || true)
    [ "$n" -gt "$most" ] && most=$n
    sleep 0.05
  done
  wait "$pid" || { echo "bastion.sh: $1 failed:" >&2; tail -5 "$WORK"/*.err >&2 || true; exit 1; }
  PEAK=$most
}

run_cairn() {
  timeout 300 "$CAIRN" run --journal "$WORK/journal.db" -F "$WORK/config" \
    --known-hosts "$S/known_hosts" --hosts "$ALIASES" --parallel "$N" --json -- "$CMD" \
    > "$WORK/cairn.out" 2> "$WORK/cairn.err"
}
run_loop() {
  local t
  for t in $TARGETS; do
    timeout 300 ssh -F "$WORK/config" "$t" "$CMD" > "$WORK/loop-$t.out" 2>&1 &
  done
  wait
}
run_pssh() {
  timeout 300 "$PSSH" -h "$WORK/pssh-hosts" -p "$N" -t 120 -x "-F $WORK/config" "$CMD" \
    > "$WORK/pssh.out" 2> "$WORK/pssh.err"
}

run_cairn || { echo "bastion.sh: cairn warm-up failed:" >&2; tail -5 "$WORK/cairn.err" >&2; exit 1; }
run_loop
[ -z "$PSSH" ] || run_pssh || { echo "bastion.sh: pssh warm-up failed" >&2; exit 1; }

declare -a TC TL TP
PC=0 PL=0 PP=0
for r in $(seq 1 "$R"); do
  t=$(now); peak run_cairn; TC+=("$(elapsed "$t")"); [ "$PEAK" -gt "$PC" ] && PC=$PEAK
  t=$(now); peak run_loop; TL+=("$(elapsed "$t")"); [ "$PEAK" -gt "$PL" ] && PL=$PEAK
  if [ -n "$PSSH" ]; then
    t=$(now); peak run_pssh; TP+=("$(elapsed "$t")"); [ "$PEAK" -gt "$PP" ] && PP=$PEAK
  fi
  echo "bastion.sh: round $r: cairn ${TC[-1]}s  ssh -J loop ${TL[-1]}s${PSSH:+  pssh ${TP[-1]}s}" >&2
done
ok=$(grep '"type":"host"' "$WORK/cairn.out" | grep -c '"exit_code":0,' || true)
[ "$ok" = "$N" ] || { echo "bastion.sh: cairn: only $ok of $N targets ok" >&2; exit 1; }
for t in $TARGETS; do grep -qx "$t" "$WORK/loop-$t.out" || { echo "bastion.sh: ssh -J $t failed: $(cat "$WORK/loop-$t.out")" >&2; exit 1; }; done

median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
MC=$(median "${TC[@]}"); ML=$(median "${TL[@]}")

echo
echo "Machine: nproc $(nproc); $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg); cairn $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?'); $(ssh -V 2>&1); date $(date -u +%Y-%m-%dT%H:%MZ)"
echo "$N ash targets behind one bastion (no route from this machine to the targets), command \`$CMD\`, all targets at once, $R interleaved rounds after one warm-up each; wall time of the whole run, medians; peak established connections to the bastion"
echo
echo "| tool | median wall time | cairn ÷ tool | connections to the bastion |"
echo "|---|---|---|---|"
echo "| cairn run --hosts | ${MC} s | — | $PC |"
echo "| ssh -J, one per target, in parallel | ${ML} s | $(ratio "$MC" "$ML") | $PL |"
if [ -n "$PSSH" ]; then
  MP=$(median "${TP[@]}")
  echo "| parallel-ssh (ProxyJump from ssh_config) | ${MP} s | $(ratio "$MC" "$MP") | $PP |"
fi
echo
echo "all rounds: cairn ${TC[*]}; ssh -J loop ${TL[*]}${PSSH:+; pssh ${TP[*]}}"
