#!/usr/bin/env bash
# shellcheck disable=SC2016,SC2030,SC2031 # checks are eval'd strings (single quotes on purpose); W is rebound per subshell on purpose
# remote-script-local.sh: exercise the host side locally (no SSH): remote-scripts/cairn.sh under
# bash, dash and busybox ash, and the native helper (remote-scripts/cairn-host.rs) with the same
# cases, where they are not about the script's own processes.
# Each exec gets stdin from a file and its stdout/stderr captured, exactly as over SSH.
# Usage: tests/remote-script-local.sh [bash|dash|busybox|helper ...]    (default: all; helper
# needs CAIRN_HOST_HELPER_BIN, the built helper, and CAIRN_HOST_HELPER_SHA256, its hash)
set -u
# Run in a private PID namespace when we can: whatever the script under test
# signals, it cannot reach a process outside this test run.
if [ -z "${CAIRN_TEST_NS:-}" ] && unshare --pid --fork --mount-proc true 2>/dev/null; then
	CAIRN_TEST_NS=1 exec unshare --pid --fork --mount-proc "$0" "$@"
fi
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cat "$HERE/../remote-scripts/cairn.sh")
NONCE=0123456789abcdef0123456789abcdef
B="@@cairn-$NONCE@@"
DG=$(printf '%064d' 0)
PASS=0
FAIL=0
ROOT=$(mktemp -d /tmp/cairn-test.XXXXXX)
mkdir -p "$ROOT/bb" && ln -s "$(command -v busybox)" "$ROOT/bb/sh"
HELPER='' HSHA=${CAIRN_HOST_HELPER_SHA256:-}
if [ -n "${CAIRN_HOST_HELPER_BIN:-}" ]; then
	mkdir -p "$ROOT/hbin" && cp "$CAIRN_HOST_HELPER_BIN" "$ROOT/hbin/cairn-host" && chmod 755 "$ROOT/hbin" "$ROOT/hbin/cairn-host"
	HELPER=$ROOT/hbin/cairn-host
fi
# hc: HC, the words that start the host side under test (the script under $SH, with SRCPRE
# before it; or the helper with its hash)
hc() {
	if [ "$SHN" = helper ]; then
		HC=("$HELPER" "$HSHA")
	else
		# shellcheck disable=SC2206 # $SH is two words for busybox
		HC=($SH -c 'eval "$1"' cairn "${SRCPRE:-}$SRC")
	fi
}

ok() { PASS=$((PASS + 1)); echo "  ok   $SHN: $1"; }
bad() {
	FAIL=$((FAIL + 1))
	echo "  FAIL $SHN: $1"
	{ echo "--- protocol:"; cat "$W/p"; echo "--- stdout (head):"; head -c 300 "$W/o"; echo; } 2>/dev/null | sed 's/^/       /'
}
# check DESC CMD...: pass if CMD succeeds
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
ms() { echo $(($(date +%s%N) / 1000000)); }

# cx STDIN MODE ARG...: one exec of the script. stdout -> $W/o, stderr -> $W/e,
# protocol lines (without B) -> $W/p, raw stderr bytes (protocol lines removed) -> $W/r.
# AS: a command prefix to run it as another user (setpriv ...); SRCPRE: shell text put before
# the script (function definitions standing in for tools; busybox runs its own applets, never
# a tool found through PATH, but a function comes first in every shell, and the script passes
# its own text, prefix included, to every shell it starts)
cx() {
	local in=$1
	shift
	hc
	# shellcheck disable=SC2086,SC2016
	if [ -n "${PIPE:-}" ]; then
		# stdin a pipe, as over SSH (a file would let a tool seek back what it read ahead)
		# shellcheck disable=SC2086,SC2016
		# shellcheck disable=SC2002 # the pipe is the point
		cat "$in" | timeout 30 ${AS:-} env PATH="${CXPATH:-$PATH}" "${HC[@]}" "$@" >"$W/o" 2>"$W/e"
	else
		# shellcheck disable=SC2086,SC2016
		timeout 30 ${AS:-} env PATH="${CXPATH:-$PATH}" "${HC[@]}" "$@" <"$in" >"$W/o" 2>"$W/e"
	fi
	RC=$?
	perl -0777 -e '$b = shift; $_ = <STDIN>; open P, ">", shift; open R, ">", shift;
		print P "$1\n" while /\Q$b\E ([^\n]*)\n/g; s/\Q$b\E[^\n]*\n//g; print R $_' \
		"$B" "$W/p" "$W/r" <"$W/e"
}
# disp ID CMDFILE TIMEOUT ATTACH [LEN]
disp() { cx "$2" dispatch .cairn "$NONCE" "$1" "${5:-$(wc -c <"$2")}" "$DG" "$3" "$4"; }
has() { grep -qxF -- "$1" "$W/p"; }
hasre() { grep -qE -- "$1" "$W/p"; }
ended() { [ "$(tail -n 1 "$W/p")" = end ]; }
same() { printf '%b' "$2" >"$W/exp" && cmp -s "$W/exp" "$1"; }
field() { sed -n "s/^$1 .*\<$2=\([^ ]*\).*/\1/p" "$W/p" | head -n 1; }
mkcmd() { printf '%s' "$1" >"$W/cmd.$2"; echo "$W/cmd.$2"; }
# running PID: PID names a process that has not ended (a zombie has)
running() { local st; st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null | tail -n 1) && [ -n "$st" ] && [ "$st" != Z ]; }
# poll N CMD...: run CMD until it succeeds, every 20 ms, N times at most (false if it never did)
poll() {
	local n=$1 i=0
	shift
	until "$@"; do
		[ $i -lt "$n" ] || return 1
		sleep 0.02
		i=$((i + 1))
	done
}
# gone PID: wait (at most 5 s) until PID names nothing, not even a zombie
gone() {
	# shellcheck disable=SC2034 # read by the eval in poll
	local g=$1
	poll 250 eval '[ ! -e "/proc/$g" ]'
}
# sup ID: sets sp to the supervisor's PID in ID's started record (false while there is none)
sup() { sp=$(sed -n 's/.* sup_pid=\([0-9]*\) .*/\1/p' "$X/$1.start" 2>/dev/null) && [[ $sp =~ ^[0-9]+$ ]]; }
# kid PID TEST: sets kp to the child of PID for which "TEST CHILD" succeeds (false if none)
kid() {
	local q
	kp=''
	for q in $(pgrep -P "$1"); do "$2" "$q" && kp=$q; done
	[ -n "$kp" ]
}
# naps PID: PID is napping (a ticker's or a heartbeat's "sleep 2" is its child)
naps() { pgrep -P "$1" -fx 'sleep 2' >/dev/null; }
# napping_under PID: PID or one of its descendants naps
napping_under() {
	local q
	naps "$1" && return 0
	for q in $(pgrep -P "$1"); do napping_under "$q" && return 0; done
	return 1
}
# piped PID: PID's stdin is a pipe (a session's reader: its other children have /dev/null)
piped() { [[ $(readlink "/proc/$1/fd/0") == pipe:* ]]; }
# pidat PID: start a decoy (setsid sleep 45) under PID, which must be free; sets DECOY. PID reuse
# forced: only in this run's own PID namespace, where the next PID is ours to set (ns_last_pid)
pidat() {
	local i=0
	DECOY=
	[ -n "${CAIRN_TEST_NS:-}" ] || return 1
	while [ $i -lt 5 ] && [ "$DECOY" != "$1" ]; do
		[ -n "$DECOY" ] && kill -9 "$DECOY" && wait "$DECOY"
		echo $(($1 - 1)) >/proc/sys/kernel/ns_last_pid || return 1
		setsid sleep 45 &
		DECOY=$!
		i=$((i + 1))
	done 2>/dev/null
	[ "$DECOY" = "$1" ]
}
# anc PID PARENT: the ancestor of PID (or PID itself) whose parent is PARENT
anc() {
	local q=$1 pp i
	for i in 1 2 3 4; do
		pp=$(ps -o ppid= -p "$q" 2>/dev/null | tr -d ' ')
		[[ $pp =~ ^[0-9]+$ ]] || return 1
		[ "$pp" = "$2" ] && echo "$q" && return 0
		q=$pp
	done
	return 1
}
# unpid PID...: end decoys (each checked to be a number > 1)
unpid() { local q; for q; do [[ $q =~ ^[0-9]+$ ]] && [ "$q" -gt 1 ] && { kill -9 "$q" && wait "$q"; } 2>/dev/null; done; true; }
# a session request for ID with command TEXT and TIMEOUT (default 0)
# (the text has no newline: one line, flagged as without its own newline)
sreq() { printf 'd %s %s %s %s 1 1\n%s\ne\n' "$1" "$(printf '%s' "$2" | wc -c)" "$DG" "${3:-0}" "$2"; }
# sreqf ID FILE: a session request for the command in FILE, byte for byte
sreqf() {
	local n u=0
	n=$(tr -cd '\n' <"$2" | wc -c)
	if [ -s "$2" ] && [ "$(tail -c 1 "$2" | od -An -c | tr -d ' ')" != '\n' ]; then
		u=1
		n=$((n + 1))
	fi
	printf 'd %s %s %s 0 %s %s\n' "$1" "$(wc -c <"$2")" "$DG" "$n" "$u"
	cat "$2"
	[ "$u" = 1 ] && echo
	echo e
}
# sline TEXT: the session printed protocol line TEXT (on stdout)
sline() { grep -aqxF -- "$B $1" "$W/o"; }
# frame ID out|err: the bytes the session framed for ID's stream
frame() {
	perl -0777 -e '$b = shift; $k = shift; $_ = <STDIN>; while (/\Q$b\E \Q$k\E (\d+)\n/g) { print substr($_, pos($_), $1) }' "$B" "=$1 $2" <"$W/o"; }

run_shell() {
	case $SHN in
	bash) SH=$(command -v bash); export SHELL=$SH ;;
	dash) SH=$(command -v dash); export SHELL=$SH ;;
	busybox) SH="$(command -v busybox) sh"; export SHELL=$ROOT/bb/sh ;;
	helper) SH=''; export SHELL; SHELL=$(command -v dash) ;;
	esac
	export HOME=$ROOT/$SHN/home
	W=$ROOT/$SHN/w
	mkdir -p "$HOME" "$W"
	X=$HOME/.cairn/x
	local t0 c e1 e2 id r sup pg

	cx /dev/null hello .cairn "$NONCE"
	e1=$(field hello epoch)
	cx /dev/null hello .cairn "$NONCE"
	e2=$(field hello epoch)
	check "hello twice: same epoch ($e1)" test -n "$e1" -a "$e1" = "$e2" -a "$RC" = 0 -a "$(head -n 1 "$W/p" | cut -c1-9)" = "hello v=1"

	c=$(mkcmd 'printf "out\n"; printf "err1\n" >&2; printf "tail"; printf "e2" >&2; exit 3' a)
	disp a1 "$c" 0 1
	check "attach: exact stdout" same "$W/o" 'out\ntail'
	check "attach: exact stderr" same "$W/r" 'err1\ne2'
	check "attach: verdict, sizes, status 3, end" eval 'has "verdict started" && has "sizes out=8 err=7" && [ "$(field done status)" = 3 ] && [ "$(field done out)" = 8 ] && ended'
	check "attach: started record fields" eval 'hasre "^start v=1 id=a1 len=[0-9]+ digest=$DG epoch=$e1 boot=[^ ]+/[0-9]+ sup_pid=[0-9]+ sup_start=[0-9]+ started_at=[0-9]+ timeout=0$"'

	c=$(mkcmd 'echo x >>"$HOME/counter"' c)
	disp c1 "$c" 0 1
	disp c1 "$c" 0 1
	check "same ID again: exists, ran once" eval 'has "verdict exists" && hasre "^start v=1 id=c1 " && ! hasre "^done" && ended && [ "$(wc -l <"$HOME/counter")" = 1 ]'

	# (the command goes on only when the test says: the checks below see it running)
	c=$(mkcmd 'printf abc; printf XYZ >&2; while [ ! -e "$HOME/go-d1" ]; do sleep 0.05; done; printf def; printf UVW >&2' d)
	disp d1 "$c" 0 0
	check "ATTACH=0 returns while the command runs" eval 'has "verdict started" && ! hasre "^sizes" && ended && [ ! -e "$X/d1.done" ]'
	poll 250 eval '[ "$(cat "$X/d1/out" "$X/d1/err" 2>/dev/null)" = abcXYZ ]'
	cx /dev/null watch .cairn "$NONCE" d1 0 0 0
	check "watch WAIT=0 while running: alive, partial output, no done" eval 'has "live alive" && ! hasre "^done" && same "$W/o" abc && same "$W/r" XYZ && has "sizes out=3 err=3" && ended'
	touch "$HOME/go-d1"
	cx /dev/null watch .cairn "$NONCE" d1 1 2 1
	check "watch WAIT=1 from offsets 1/2: exact rest" eval 'same "$W/o" bcdef && same "$W/r" ZUVW && has "sizes out=6 err=6" && [ "$(field done status)" = 0 ] && ended'
	cx /dev/null watch .cairn "$NONCE" d1 0 0 0
	check "watch WAIT=0 after finish: everything" eval 'same "$W/o" abcdef && same "$W/r" XYZUVW && hasre "^done v=1 id=d1 status=0 " && ended'
	cx /dev/null watch .cairn "$NONCE" nosuch 0 0 1
	check "watch unknown ID: absent" eval 'has absent && ended'

	c=$(mkcmd 'echo hi' s)
	disp s1 "$c" 0 1 100
	check "short stdin: refused, no start record, no stage" eval 'has "verdict refused" && hasre "^error .*7 of 100" && [ ! -e "$X/s1.start" ] && [ -z "$(ls "$HOME/.cairn/tmp")" ] && ended'

	# hostile payload: quotes, $(...), backticks, backslashes, non-UTF-8, tabs, newlines
	printf '%s' "'\"\$(touch \$HOME/pwned)\`touch \$HOME/pwned2\` \\\\ \$HOME "$'\377\376 \303\251 *' >"$W/hp"
	printf '\n\tline2 ; exit 9' >>"$W/hp"
	{ printf "cat <<'EOT'\n"; cat "$W/hp"; printf '\nEOT\necho end\n\n\n'; } >"$W/cmd.h"
	{ cat "$W/hp"; printf '\nend\n'; } >"$W/exp.h"
	disp h1 "$W/cmd.h" 0 1
	check "hostile bytes: command file identical" cmp -s "$W/cmd.h" "$X/h1/cmd"
	check "hostile bytes: output identical, nothing interpolated" eval 'cmp -s "$W/o" "$W/exp.h" && [ ! -e "$HOME/pwned" ] && [ ! -e "$HOME/pwned2" ] && [ "$(field done status)" = 0 ]'

	{ printf "printf %%s '"; head -c 1048576 /dev/zero | tr '\0' x; printf "' | wc -c\n"; } >"$W/cmd.big"
	disp b1 "$W/cmd.big" 0 1
	check "1 MB argument" eval '[ "$(tr -d " \n" <"$W/o")" = 1048576 ] && cmp -s "$W/cmd.big" "$X/b1/cmd" && [ "$(field done status)" = 0 ]'

	# Only the classic signals 1-31 count: a caller may have set realtime signals to ignore,
	# which no shell can undo, and which no command relies on.
	c=$(mkcmd 'echo "$CAIRN_EXECUTION_ID"; pwd; grep SigIgn /proc/self/status; cut -d" " -f1,5,6 /proc/$$/stat' v)
	disp env1 "$c" 0 1
	check "command env: ID, cwd HOME, no ignored signals, own session" eval '[ "$(sed -n 1p "$W/o")" = env1 ] && [ "$(sed -n 2p "$W/o")" = "$HOME" ] && [ $((0x$(sed -n "s/^SigIgn:[[:space:]]*//p" "$W/o") & 0x7fffffff)) = 0 ] && sed -n 4p "$W/o" | grep -qE "^([0-9]+) \1 \1$"'

	c=$(mkcmd 'sleep 30' k)
	disp k1 "$c" 0 0
	sup=$(field start sup_pid)
	(W=$W/bg && mkdir -p "$W" && cx /dev/null watch .cairn "$NONCE" k1 0 0 1 && echo "$RC" >"$W/rc") &
	r=$!
	# (the watcher is under way once its heartbeat naps)
	if [ "$SHN" = helper ]; then sleep 0.5; else poll 250 napping_under "$r"; fi
	[[ $sup =~ ^[0-9]+$ ]] && [ "$sup" -gt 1 ] && kill -9 "$sup"
	wait $r
	cp "$W/bg/p" "$W/p"
	check "kill -9 supervisor during watch: dead, no done, the watcher ended by itself" eval 'has "live dead" && ! hasre "^done" && ended && [ "$(cat "$W/bg/rc")" != 124 ]'
	cx /dev/null watch .cairn "$NONCE" k1 0 0 1
	check "watch after supervisor death: dead at once" eval 'has "live dead" && ! hasre "^done" && ended'
	read -r pg _ <"$X/k1/pgid" && [[ $pg =~ ^[0-9]+$ ]] && [ "$pg" -gt 1 ] && kill -9 -- "-$pg"

	# a watcher killed while it streams: its heartbeat ends the helpers it started (tails, tees,
	# wcs), and neither the watcher's PID nor an ended helper's, both reused here by decoys,
	# keeps it going or gets a signal (the heartbeat is stopped while the PIDs are reused)
	if [ "$SHN" = helper ]; then
		echo "  n/a  $SHN: the watcher's tails and heartbeat (the helper's watcher is one process)"
	else
	c=$(mkcmd 'sleep 30' hw)
	disp hw1 "$c" 0 0
	# (the shell's "Killed" notice for the watcher is not this test's business)
	(W=$W/hw && mkdir -p "$W" && cx /dev/null watch .cairn "$NONCE" hw1 0 0 1) 2>/dev/null &
	r=$!
	# (all four, each a single number: the heartbeat starts after both tails)
	wp='' f1='' f2='' hp='' d1='' d2=''
	hw() {
		f1=$(pgrep -fx "tail -c [+]1 -f $X/hw1/out")
		f2=$(pgrep -fx "tail -c [+]1 -f $X/hw1/err")
		[[ $f1 =~ ^[0-9]+$ ]] || return 1
		wp=$(ps -o ppid= -p "$f1" | tr -d ' ')
		kid "$wp" naps && hp=$kp
		[[ "$wp $f1 $f2 $hp" =~ ^[0-9]+\ [0-9]+\ [0-9]+\ [0-9]+$ ]]
	}
	poll 250 hw
	if hw && [ "$wp" -gt 1 ] && [ "$f1" -gt 1 ] && [ "$f2" -gt 1 ] && [ "$hp" -gt 1 ]; then
		kill -STOP "$hp"
		kill -9 "$wp" "$f1"
		gone "$wp" && gone "$f1" && pidat "$wp" && d1=$DECOY && pidat "$f1" && d2=$DECOY
		kill -CONT "$hp"
		# (the heartbeat ends right after its signals: the tail it signalled may take a moment
		# longer on a busy machine)
		poll 500 eval '! running "$hp" && ! running "$f2"'
	fi
	f0=$FAIL
	check "watch: watcher killed, its PID and a helper's reused: the heartbeat ends the other helpers and signals neither decoy" eval '[ -n "$d1" ] && [ -n "$d2" ] && ! running "$hp" && ! running "$f2" && running "$d1" && running "$d2"'
	[ "$FAIL" = "$f0" ] || echo "       watcher $wp, tails $f1 $f2, heartbeat $hp, decoys '$d1' '$d2'; running: $(for q in "$hp" "$f2" "$d1" "$d2"; do running "$q" && printf '%s ' "$q"; done)"
	unpid "$d1" "$d2"
	wait $r
	read -r pg _ <"$X/hw1/pgid" && [[ $pg =~ ^[0-9]+$ ]] && [ "$pg" -gt 1 ] && kill -9 -- "-$pg"
	fi

	echo boot-A >"$W/boot"
	c=$(mkcmd 'true' r)
	CAIRN_BOOT_ID_FILE=$W/boot disp r1 "$c" 0 1
	echo boot-B >"$W/boot"
	CAIRN_BOOT_ID_FILE=$W/boot cx /dev/null watch .cairn "$NONCE" r1 0 0 0
	check "boot ID changed: rebooted" eval 'has "live rebooted" && ended'

	c=$(mkcmd 'sleep 30; echo not-reached' t)
	disp t1 "$c" 1 1
	check "timeout: TERM" eval 'hasre "^done .* status=143 .* timed_out=1 cancelled=0" && [ ! -s "$W/o" ]'
	c=$(mkcmd "trap '' TERM; sleep 25; echo not-reached" t2)
	disp t2 "$c" 1 1
	check "timeout: TERM ignored, then KILL" eval 'hasre "^done .* status=137 .* timed_out=1" && [ ! -s "$W/o" ]'

	c=$(mkcmd 'true' tq)
	disp t3 "$c" 37 1
	sleep 0.5
	check "timeout set, quick command: status 0, watchdog gone" eval 'hasre "^done .* status=0 .* timed_out=0" && ! pgrep -fx "sleep 37" >/dev/null'

	# the watchdog signals only its own command: when the PID in the pgid record names another
	# process (its start time differs: the PID was reused), that process and its group are left
	# alone. Here a decoy, leader of its own group, stands in for the reused PID.
	c=$(mkcmd 'sleep 2' tr)
	disp t4 "$c" 1 0
	poll 250 test -s "$X/t4/pgid"
	read -r _ gs <"$X/t4/pgid"
	# a start time in clock ticks: the decoy must not start in the command's own tick
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		setsid sleep 41 &
		decoy=$!
		[ "$(cut -d' ' -f22 "/proc/$decoy/stat" 2>/dev/null)" != "$gs" ] && break
		kill "$decoy"
		sleep 0.02
	done
	echo "$decoy $gs" >"$X/t4/pgid"
	cx /dev/null watch .cairn "$NONCE" t4 0 0 1
	check "timeout: a pgid record naming another process signals nothing" eval 'hasre "^done .* status=0 " && kill -0 "$decoy" 2>/dev/null'
	[[ $decoy =~ ^[0-9]+$ ]] && [ "$decoy" -gt 1 ] && { kill -9 "$decoy" && wait "$decoy"; } 2>/dev/null

	c=$(mkcmd 'sleep 30' n)
	disp n1 "$c" 0 0
	poll 250 test -s "$X/n1/pgid"
	cx /dev/null cancel .cairn "$NONCE" n1 2
	check "cancel while running" eval 'has "cancel signalled" && hasre "^done .* status=143 .* cancelled=1" && ended'
	cx /dev/null cancel .cairn "$NONCE" n1 2
	check "cancel after finish: finished" eval 'has "cancel finished" && ended'
	c=$(mkcmd 'echo x >>"$HOME/counter2"' n2)
	cx /dev/null cancel .cairn "$NONCE" n2 2
	check "cancel before dispatch: absent" eval 'has absent && has "cancel absent" && ended'
	disp n2 "$c" 0 1
	check "... then dispatch: started, not run, cancelled=1 status=130" eval 'has "verdict started" && hasre "^done .* status=130 .* cancelled=1" && [ ! -e "$HOME/counter2" ]'

	c=$(mkcmd 'sleep 1; echo survived' p)
	hc
	timeout 10 "${HC[@]}" dispatch .cairn "$NONCE" p1 "$(wc -c <"$c")" "$DG" 0 1 <"$c" 2>&1 | head -c 10 >/dev/null
	cx /dev/null watch .cairn "$NONCE" p1 0 0 1
	check "dispatcher killed by SIGPIPE: supervisor carries on" eval 'same "$W/o" "survived\n" && [ "$(field done status)" = 0 ]'
	timeout -s HUP 0.5 "${HC[@]}" dispatch .cairn "$NONCE" p2 "$(wc -c <"$c")" "$DG" 0 1 <"$c" >/dev/null 2>&1
	cx /dev/null watch .cairn "$NONCE" p2 0 0 1
	check "dispatcher killed by SIGHUP: supervisor carries on" eval 'same "$W/o" "survived\n" && [ "$(field done status)" = 0 ]'
	if [ "$SHN" = helper ]; then
		echo "  n/a  $SHN: setsid missing (the helper calls setsid(2) itself)"
	elif [ "$SHN" != busybox ]; then
		mkdir -p "$ROOT/nosetsid"
		for t in mkdir ln mv cat wc tail head sync mkfifo date sleep rm tee readlink touch; do
			ln -sf "$(command -v $t)" "$ROOT/nosetsid/$t"
		done
		c=$(mkcmd 'true' m)
		CXPATH=$ROOT/nosetsid disp m1 "$c" 0 1
		check "setsid missing: error, refused, no start record" eval 'hasre "^error .*setsid" && has "verdict refused" && [ ! -e "$X/m1.start" ] && ended'
	else
		echo "  n/a  $SHN: setsid missing (setsid is an applet of this busybox: it cannot be missing)"
	fi

	c=$(mkcmd 'true' u)
	cx "$c" dispatch /proc/cairn-nope "$NONCE" u1 4 "$DG" 0 1
	check "unwritable DIR: tool's error, refused" eval 'hasre "^error .*mkdir.*cairn-nope" && has "verdict refused" && ended'
	echo >"$HOME/afile"
	cx /dev/null watch afile/sub "$NONCE" u1 0 0 1
	check "DIR under a file: watch gives error" eval 'hasre "^error .*[Nn]ot a directory" && ended'
	# root may write where the mode bits say no: as root, this runs as the unprivileged
	# account 65534 in a home of its own
	if [ "$(id -u)" = 0 ]; then
		UH=$ROOT/$SHN/uhome UAS="setpriv --reuid=65534 --regid=65534 --clear-groups" UN=65534
		mkdir -p "$UH" && chown 65534:65534 "$UH" && chmod 711 "$ROOT" "$ROOT/$SHN"
		$UAS mkdir -p "$UH/.cairn/x" && chmod 500 "$UH/.cairn/x"
	else
		UH=$HOME UAS='' UN=$(id -u)
		chmod 500 "$X"
	fi
	HOME=$UH AS=$UAS disp u2 "$c" 0 1
	check "unwritable x/ (uid $UN): refused with message" eval 'hasre "^error " && has "verdict refused" && [ ! -e "$UH/.cairn/x/u2.start" ] && ended'
	chmod 700 "$UH/.cairn/x"

	for id in '../x' '' "$(printf '%0129d' 7)" 'a b' 'é'; do
		disp "$id" "$c" 0 1
		check "bad ID '${id:0:12}': refused by the script" eval 'has "error bad execution ID" && has "verdict refused" && ended && [ ! -e "$HOME/.cairn/x.start" ]'
	done
	cx "$c" dispatch .cairn "$NONCE" g1 4 "$DG" 010 1
	check "bad number (leading zero) refused" eval 'has "verdict refused" && [ ! -e "$X/g1.start" ]'
	cx /dev/null hello .cairn NOTANONCE
	check "bad nonce: plain refusal" eval '[ "$RC" = 2 ] && grep -q "bad nonce" "$W/e"'

	# secrets after the command, through a pipe: the dispatcher must not read past the command
	printf 'echo "$CAIRN_T"' >"$W/sc"
	printf "export CAIRN_T='s3cret'\n" >"$W/ss"
	cat "$W/sc" "$W/ss" >"$W/scs"
	PIPE=1 cx "$W/scs" dispatch .cairn "$NONCE" sec1 "$(wc -c <"$W/sc")" "$DG" 0 1 "$(wc -c <"$W/ss")"
	check "secrets through a pipe: the command gets them" eval 'has "verdict started" && same "$W/o" "s3cret\n" && ended'

	# session: one exec, many dispatches
	{
		sreq s1 'printf "o\000x"; printf e >&2; exit 4'
		sreq s2 'echo x >>"$HOME/scount"'
		sreq c1 'echo never'
		echo g
		sreq s3 'sleep 5' 1
		echo g
	} >"$W/sin"
	t0=$(ms)
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	cp "$W/o" "$W/o1"
	# s2 again, in a later session
	{
		sreq s2 'echo x >>"$HOME/scount"'
		echo g
	} >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	cat "$W/o" >>"$W/o1"
	mv "$W/o1" "$W/o"
	check "session: hello first, end last" eval 'head -n 1 "$W/o" | grep -qF "$B hello v=1 " && [ "$(tail -n 1 "$W/o")" = "$B end" ] && [ "$RC" = 0 ]'
	check "session: s1 started, exact stdout and stderr bytes, status 4" eval 'sline "=s1 verdict started" && [ "$(frame s1 out | od -An -c | tr -d " ")" = "o\\0x" ] && [ "$(frame s1 err)" = e ] && grep -aq "$B =s1 done v=1 id=s1 status=4 .* out=3 err=1 " "$W/o" && sline "=s1 end"'
	check "session: a crossed guard (earlier dispatch c1, s2 again) is not started again" eval 'sline "=c1 verdict exists" && [ "$(grep -ac "$B =s2 verdict exists" "$W/o")" = 1 ] && [ "$(wc -l <"$HOME/scount")" = 1 ] && [ ! -e "$X/c1.cmd" ]'
	check "session: records in place, the session shell as supervisor" eval 'grep -q "^v=1 id=s1 status=4 " "$X/s1.done" && grep -q "sup_pid=[0-9]" "$X/s1.start" && [ "$(cat "$X/s1.cmd")" = "printf \"o\\000x\"; printf e >&2; exit 4" ] && [ -d "$X/s1" ]'
	# (the session shell rebuilds both records from its helpers' short reports)
	recsame() {
		local i
		for i; do
			[ "$(grep -a "^$B =$i start " "$W/o" | head -n 1 | cut -d" " -f4-)" = "$(cat "$X/$i.start")" ] || return 1
			[ "$(grep -a "^$B =$i done " "$W/o" | cut -d" " -f4-)" = "$(head -n 1 "$X/$i.done")" ] || return 1
		done
	}
	check "session: each start and done line is the record on disk, byte for byte" recsame s1 s2 s3
	check "session: timeout enforced (TERM after 1 s)" eval 'grep -aq "$B =s3 done v=1 id=s3 status=143 .* timed_out=1 " "$W/o"'
	check "session: nothing left in tmp" eval '[ -z "$(ls "$HOME/.cairn/tmp" | grep "^s")" ]'
	{
		sreq s4 'true'
		printf 'd s5 10 %s 0 3 0\nabc\n' "$DG"
	} >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	check "session: a request cut inside its command, or never confirmed by g, is not started" eval '[ ! -e "$X/s5.start" ] && [ ! -e "$X/s4.start" ] && ! grep -aq "=s[45] " "$W/o" && [ "$(tail -n 1 "$W/o")" = "$B end" ] && [ -z "$(ls "$HOME/.cairn/tmp" | grep "^s")" ]'
	{
		sreq z1 'true'
		sreq z1 'true'
		echo g
	} >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	check "session: an ID sent twice stops the reader, nothing of it started" eval 'grep -aq "$B error execution z1 was sent twice in one session" "$W/o" && [ "$(tail -n 1 "$W/o")" = "$B end" ] && [ ! -e "$X/z1.start" ]'
	printf 'd ../x 4 %s 0 1 1\ntrue\ne\ng\n' "$DG" >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	check "session: a bad request line stops the session, nothing started" eval 'grep -aq "$B error a request line was not well-formed" "$W/o" && [ "$(tail -n 1 "$W/o")" = "$B end" ] && [ ! -e "$HOME/.cairn/x.start" ]'
	# commands byte for byte: a last line without a newline, blank lines, backslashes, tabs,
	# leading spaces, quotes, non-ASCII (each prints its own command file)
	printf 'cat "$CAIRN_COMMAND_FILE"\n#  lead\t\\\\ back \\n '"'"'q'"'"' "d" \303\251 $x' >"$W/y1"
	printf 'cat "$CAIRN_COMMAND_FILE"\n\n  \n#\\\n' >"$W/y2"
	printf 'printf ""' >"$W/y3"
	: >"$W/y4"
	{
		sreqf y1 "$W/y1"
		sreqf y2 "$W/y2"
		sreqf y3 "$W/y3"
		sreqf y4 "$W/y4"
		echo g
	} >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	for id in y1 y2 y3 y4; do
		check "session: command $id stored and run byte for byte" eval 'cmp -s "$X/$id.cmd" "$W/$id" && grep -aq "$B =$id done v=1 id=$id status=0 " "$W/o"'
	done
	check "session: a command's output is its command file, exactly" eval 'frame y1 out >"$W/f1" && cmp -s "$W/f1" "$W/y1" && frame y2 out >"$W/f2" && cmp -s "$W/f2" "$W/y2"'
	# a session makes no wake fifo: a watcher of a running command makes it and is woken by
	# the finish (a missed wake would leave it to its heartbeat, its "sleep 2", made a minute
	# long here by a stand-in: past the watcher's bound, so a missed wake fails the check)
	sreq s6 'while [ ! -e "$HOME/go-s6" ]; do sleep 0.05; done' >"$W/sin6"
	echo g >>"$W/sin6"
	hc
	# shellcheck disable=SC2002
	(cat "$W/sin6" | timeout 30 env PATH="${CXPATH:-$PATH}" "${HC[@]}" session .cairn "$NONCE" >"$W/so6" 2>&1) &
	r=$!
	poll 200 test -d "$X/s6"
	# shellcheck disable=SC2016 # expanded by the script's shell
	(W=$W/w6 && mkdir -p "$W" && SRCPRE='sleep() { if [ "$1" = 2 ]; then command sleep 60; else command sleep "$@"; fi; }
' cx /dev/null watch .cairn "$NONCE" s6 0 0 1 && echo "$RC" >"$W/rc") &
	q=$!
	poll 250 test -p "$X/s6/wake"
	touch "$HOME/go-s6"
	wait "$q"
	wait "$r"
	cp "$W/w6/p" "$W/p"
	check "session: a watcher makes the wake fifo and is woken by the finish" eval 'hasre "^done v=1 id=s6 status=0 " && [ -p "$X/s6/wake" ] && [ "$(cat "$W/w6/rc")" = 0 ]'
	{
		i=0
		while [ $i -lt 40 ]; do
			sreq "m$i" 'echo x >>"$HOME/mcount"; echo "$CAIRN_EXECUTION_ID"'
			i=$((i + 1))
			[ $((i % 8)) = 0 ] && echo g
		done
	} >"$W/sin"
	PIPE=1 cx "$W/sin" session .cairn "$NONCE"
	check "session: 40 dispatches in 5 batches, each ran once with its own output" eval '[ "$(wc -l <"$HOME/mcount")" = 40 ] && [ "$(grep -ac "$B =m[0-9]* done .* status=0 " "$W/o")" = 40 ] && [ "$(frame m17 out)" = m17 ]'
	# requests confirmed while a batch helper runs go into the next batch, and one read but not
	# confirmed yet when that batch starts stays for the one after (sync slowed to 0.4 s, so the
	# first helper is still running when the others arrive; busybox runs its own sync)
	mkdir -p "$ROOT/slowsync"
	printf '#!/bin/sh\nsleep 0.4\nexec %s "$@"\n' "$(command -v sync)" >"$ROOT/slowsync/sync"
	chmod +x "$ROOT/slowsync/sync"
	hc
	{
		sreq jb1 'echo jb1'
		echo g
		sreq jb2 'echo jb2'
		echo g
		sreq jb3 'echo jb3'
		sleep 1.5
		echo g
	} | timeout 30 env PATH="$ROOT/slowsync:$PATH" "${HC[@]}" session .cairn "$NONCE" >"$W/o" 2>"$W/e"
	check "session: requests that arrive while a batch is being started are started after it, each once" eval 'grep -aq "$B =jb1 done v=1 id=jb1 status=0 " "$W/o" && grep -aq "$B =jb2 done v=1 id=jb2 status=0 " "$W/o" && grep -aq "$B =jb3 done v=1 id=jb3 status=0 " "$W/o" && [ "$(frame jb3 out)" = jb3 ] && [ "$(tail -n 1 "$W/o")" = "$B end" ]'
	# a waiter killed before it could report: within a tick or two the session says "live dead"
	# and no finish record for it, finishes its other execution as usual and ends; a watch then
	# says "dead" too (the command itself is left running, as after any supervisor's death:
	# killed here)
	if [ "$SHN" = helper ]; then
		echo "  n/a  $SHN: killed waiters, ticker, reader and batch or finish helpers (the helper's are threads of the session process)"
	else
	rm -f "$HOME/lwcount"
	# shellcheck disable=SC2086 # $SH is two words for busybox
	{
		sreq lw1 'echo x >>"$HOME/lwcount"; sleep 20'
		sreq lw2 'echo lw2'
		echo g
		poll 250 test -s "$X/lw1/pgid"
		read -r pg _ <"$X/lw1/pgid"
		wp=$(ps -o ppid= -p "$pg" | tr -d ' ')
		[[ $wp =~ ^[0-9]+$ ]] && [ "$wp" -gt 1 ] && kill -9 "$wp"
		sleep 5
	} | timeout 30 $SH -c 'eval "$1"' cairn "$SRC" session .cairn "$NONCE" >"$W/o" 2>"$W/e"
	cp "$W/o" "$W/o.lw"
	cx /dev/null watch .cairn "$NONCE" lw1 0 0 0
	# (the block above ran in a pipeline's subshell: its pg is not this shell's)
	pg=
	read -r pg _ <"$X/lw1/pgid"
	[[ $pg =~ ^[0-9]+$ ]] && [ "$pg" -gt 1 ] && kill -9 -- "-$pg" 2>/dev/null
	check "session: a killed waiter is reported dead, without a finish record; the rest goes on" eval 'grep -aqxF "$B =lw1 live dead" "$W/o.lw" && ! grep -aq "$B =lw1 done" "$W/o.lw" && grep -aq "$B =lw2 done v=1 id=lw2 status=0 " "$W/o.lw" && [ "$(tail -n 1 "$W/o.lw")" = "$B end" ] && [ -e "$X/lw1/lost" ] && [ ! -e "$X/lw1.done" ] && [ "$(wc -l <"$HOME/lwcount")" = 1 ] && has "live dead" && ! hasre "^done"'
	# the session shell killed and its PID reused by a decoy (its ticker stopped meanwhile): the
	# ticker ends all the same, rather than tick on for the decoy
	rm -f "$W/tk"
	# (in a subshell: the shell's "Killed" notice for the session is not this test's business)
	# shellcheck disable=SC2086 # $SH is two words for busybox
	({
		sreq tk1 'sleep 20'
		echo g
		sp='' tp=''
		# (the ticker: the session shell's child that naps)
		poll 250 eval 'sup tk1 && kid "$sp" naps' && tp=$kp
		if [[ "$sp $tp" =~ ^[0-9]+\ [0-9]+$ ]] && [ "$sp" -gt 1 ] && [ "$tp" -gt 1 ]; then
			kill -STOP "$tp"
			kill -9 "$sp"
			dk=''
			gone "$sp" && pidat "$sp" && dk=$DECOY
			kill -CONT "$tp"
			poll 500 eval '! running "$tp"'
			echo "$tp $dk" >"$W/tk"
		fi
	} | timeout 30 $SH -c 'eval "$1"' cairn "$SRC" session .cairn "$NONCE" >"$W/o" 2>"$W/e") 2>/dev/null
	tp='' dk=''
	read -r tp dk <"$W/tk"
	check "session: shell killed, its PID reused: the ticker ends and leaves the decoy alone" eval '[[ $tp =~ ^[0-9]+$ ]] && [ -n "$dk" ] && ! running "$tp" && running "$dk"'
	unpid "$dk"
	pg=''
	read -r pg _ <"$X/tk1/pgid"
	[[ $pg =~ ^[0-9]+$ ]] && [ "$pg" -gt 1 ] && kill -9 -- "-$pg" 2>/dev/null

	# the reader killed (stdin stays open): the session reads no more, says so, finishes what
	# it started and ends by itself; a request sent after the kill is never run
	rm -f "$HOME/rkcount" "$W/rk"
	# (in a subshell: the shell's notices are not this test's business)
	# shellcheck disable=SC2086 # $SH is two words for busybox
	({
		sreq rk1 'sleep 1; echo rk1'
		echo g
		sp='' rp=''
		# (the reader: the session shell's child whose stdin is still the pipe)
		poll 250 eval 'sup rk1 && kid "$sp" piped' && rp=$kp
		[[ $rp =~ ^[0-9]+$ ]] && [ "$rp" -gt 1 ] && kill -9 "$rp" && echo killed >"$W/rk"
		sleep 0.3
		sreq rk2 'echo rk2 >>"$HOME/rkcount"'
		echo g
		sleep 6
	} | timeout 30 $SH -c 'eval "$1"' cairn "$SRC" session .cairn "$NONCE" >"$W/o" 2>"$W/e") 2>/dev/null
	check "session: reader killed: nothing more read, the rest finished, the session ends by itself" eval '[ -s "$W/rk" ] && grep -aq "$B error the session.s reader was killed" "$W/o" && grep -aq "$B =rk1 done v=1 id=rk1 status=0 " "$W/o" && [ "$(frame rk1 out)" = rk1 ] && ! grep -aq "=rk2 " "$W/o" && [ ! -e "$HOME/rkcount" ] && [ ! -e "$X/rk2.start" ] && [ "$(tail -n 1 "$W/o")" = "$B end" ]'

	# A helper killed (someone's kill, the OOM killer) before its last report: the session
	# notices at its next tick and settles what the helper left. The batch helper of hka is
	# killed in its flush (hka is started all the same, once); that of hkb while its `ln` of the
	# guards is slow (hkb is refused, nothing runs, and the `ln` that outlives the helper finds
	# its stage fenced off: no guard is left behind); the finish helper of hkc in its first flush
	# (the finish is recorded and reported all the same). Slow tools through PATH, and for
	# busybox, which runs its own applets whatever PATH says, through functions put before the
	# script that call them.
	HKPRE=''
	[ "$SHN" = busybox ] && HKPRE="sync() { '$ROOT/hk/sync' \"\$@\"; }; ln() { '$ROOT/hk/ln' \"\$@\"; }
"
	{
		mkdir -p "$ROOT/hk"
		printf '#!/bin/sh\ncase "$*" in *hka.start* | *hkc/hkc.done*) sleep 1 ;; esac\nexec %s "$@"\n' "$(command -v sync)" >"$ROOT/hk/sync"
		printf '#!/bin/sh\ncase "$*" in *hkb.start* | *hkd.start*) sleep 3 ;; esac\nexec %s "$@"\n' "$(command -v ln)" >"$ROOT/hk/ln"
		chmod +x "$ROOT/hk/sync" "$ROOT/hk/ln"
		rm -f "$HOME/hkcount" "$W/hk"
		# shellcheck disable=SC2086 # $SH is two words for busybox
		({
			sreq hk0 'true'
			echo g
			sp=''
			poll 250 sup hk0
			for h in 'hka:sync .*hka[.]start' 'hkb:ln .*hkb[.]start' 'hkc:sync .*hkc/hkc[.]done'; do
				sreq "${h%%:*}" "echo ${h%%:*}; echo ${h%%:*} >>\"\$HOME/hkcount\""
				echo g
				q=''
				poll 500 eval 'q=$(pgrep -f "$ROOT/hk/${h#*:}" | head -n 1) && [ -n "$q" ]'
				hp=$(anc "$q" "$sp") && [ "$hp" -gt 1 ] && kill -9 "$hp" && echo "${h%%:*}" >>"$W/hk"
			done
			# an ID sent again in the same session after its execution has ended: the second
			# batch's helper killed in its ln must not take the first execution's guard, which
			# names this session too, for its own (it would start the command again)
			sreq hkd 'echo hkd >>"$HOME/hkcount"'
			echo g
			poll 500 test -e "$X/hkd.done"
			sreq hkd 'echo hkd >>"$HOME/hkcount"'
			echo g
			q=''
			poll 500 eval 'q=$(pgrep -f "$ROOT/hk/ln .*hkd[.]start" | head -n 1) && [ -n "$q" ]'
			hp=$(anc "$q" "$sp") && [ "$hp" -gt 1 ] && kill -9 "$hp" && echo hkd >>"$W/hk"
		} | timeout 40 env PATH="$ROOT/hk:$PATH" $SH -c 'eval "$1"' cairn "$HKPRE$SRC" session .cairn "$NONCE" >"$W/o" 2>"$W/e") 2>/dev/null
		# the ln that outlived its helper has ended
		poll 250 eval '! pgrep -f "$ROOT/hk/ln" >/dev/null'
		check "session: three helpers killed (batch in its flush, batch in its ln, finish in its flush), each noticed" eval '[ "$(cat "$W/hk" 2>/dev/null | tr "\n" " ")" = "hka hkb hkc hkd " ] && [ "$(tail -n 1 "$W/o")" = "$B end" ]'
		check "session: batch helper killed in its flush: the request is started all the same, once" eval 'grep -aqxF "$B =hka verdict started" "$W/o" && grep -aq "$B =hka done v=1 id=hka status=0 " "$W/o" && [ "$(frame hka out)" = hka ] && [ "$(grep -c hka "$HOME/hkcount")" = 1 ]'
		check "session: batch helper killed in its ln: refused, nothing ran, no guard left behind" eval 'grep -aqxF "$B =hkb verdict refused" "$W/o" && grep -aq "$B =hkb error .*batch helper was killed" "$W/o" && ! grep -q hkb "$HOME/hkcount" && [ ! -e "$X/hkb.start" ] && [ ! -e "$X/hkb" ]'
		check "session: finish helper killed in its flush: the finish is recorded and reported all the same" eval 'grep -aq "$B =hkc done v=1 id=hkc status=0 " "$W/o" && [ "$(frame hkc out)" = hkc ] && [ -e "$X/hkc.done" ] && [ "$(grep -c hkc "$HOME/hkcount")" = 1 ]'
		check "session: an ID sent again, its batch helper killed: the first execution's guard stays another's (exists), never run again" eval '[ "$(grep -c "$B =hkd verdict started" "$W/o")" = 1 ] && grep -aqxF "$B =hkd verdict exists" "$W/o" && [ "$(grep -c hkd "$HOME/hkcount")" = 1 ]'
		c=$(mkcmd 'echo hkb; echo hkb >>"$HOME/hkcount"' hkb)
		disp hkb "$c" 0 1
		check "... and the refused ID is free: a new dispatch of it runs once" eval 'has "verdict started" && [ "$(field done status)" = 0 ] && [ "$(grep -c hkb "$HOME/hkcount")" = 1 ]'
	}
	fi

	# a session's flushes name their files, never the whole file system: syncfs would wait for
	# every other writer's dirty data (a logging sync through PATH; for busybox, which runs its
	# own, through a function put before the script)
	if [ "$SHN" = helper ]; then
		echo "  n/a  $SHN: the flushes through sync(1) (the helper calls fdatasync(2) on the same files)"
	else
	LSPRE=''
	[ "$SHN" = busybox ] && LSPRE="sync() { '$ROOT/logsync/sync' \"\$@\"; }
"
	{
		mkdir -p "$ROOT/logsync"
		printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>"%s"\nexec %s "$@"\n' "$ROOT/$SHN/synclog" "$(command -v sync)" >"$ROOT/logsync/sync"
		chmod +x "$ROOT/logsync/sync"
		rm -f "$ROOT/$SHN/synclog"
		# shellcheck disable=SC2086 # $SH is two words for busybox
		{
			sreq fl1 'echo fl1'
			sreq fl2 'true'
			echo g
		} | timeout 30 env PATH="$ROOT/logsync:$PATH" $SH -c 'eval "$1"' cairn "$LSPRE$SRC" session .cairn "$NONCE" >"$W/o" 2>"$W/e"
		# shellcheck disable=SC2034 # used in the check below
		L=$ROOT/$SHN/synclog
		check "session: flushes name the started records, the finish records and x; none is a syncfs" eval 'grep -aq "$B =fl1 done v=1 id=fl1 status=0 " "$W/o" && grep -aq "$B =fl2 done v=1 id=fl2 status=0 " "$W/o" && ! grep -q -- "^-" "$L" && grep -q "^$X $X/fl1.start $X/fl2.start\$" "$L" && grep -q "$X/fl1/fl1.done" "$L" && grep -q "$X/fl2/fl2.done" "$L" && grep -qx "$X" "$L"'
		# a finish record is flushed with the output it counts (an empty output has nothing)
		check "session: the output that was written is flushed with its finish record" eval 'grep -q "^$X/fl1/out .*$X/fl1/fl1.done" "$L" && ! grep -q "$X/fl2/out" "$L"'
		rm -f "$L"
		c=$(mkcmd 'echo fl3; echo e3 >&2' fl3)
		SRCPRE=$LSPRE CXPATH=$ROOT/logsync:$PATH disp fl3 "$c" 0 1
		check "dispatch: the outputs are flushed with the finish record" eval 'hasre "^done v=1 id=fl3 status=0 .*out=4 err=3" && grep -qx "$X/fl3/out $X/fl3/err $X/fl3/done.tmp" "$L"'
	}
	fi

	sleep 2.5
	r=$(pgrep -af "$ROOT/$SHN" | grep -v pgrep)
	check "no stray processes left" test -z "$r"
	[ -n "$r" ] && echo "$r" | cut -c1-150
}

SHELLS=${*:-bash dash busybox${HELPER:+ helper}}
for SHN in $SHELLS; do
	echo "== $SHN"
	run_shell
done

# rough cost of a dispatch ATTACH=1 of `true` under dash
case " $SHELLS " in
*" dash "*)
SHN=dash SH=dash W=$ROOT/dash/w HOME=$ROOT/dash/home SHELL=$(command -v dash)
c=$(mkcmd true perf)
p0=$(cat /proc/sys/kernel/ns_last_pid)
t0=$(ms)
for i in $(seq 1 20); do disp "perf$i" "$c" 0 1; done
t1=$(ms)
p1=$(cat /proc/sys/kernel/ns_last_pid)
echo "dash: dispatch ATTACH=1 of true: $(((t1 - t0) / 20)) ms each, ~$(((p1 - p0) / 20)) PIDs each (incl. timeout + perl of this driver)"
;;
esac
if [ -n "$HELPER" ]; then
	SHN=helper W=$ROOT/helper/w HOME=$ROOT/helper/home
	mkdir -p "$W" "$HOME"
	c=$(mkcmd true perf)
	p0=$(cat /proc/sys/kernel/ns_last_pid)
	t0=$(ms)
	for i in $(seq 1 20); do disp "perf$i" "$c" 0 1; done
	t1=$(ms)
	p1=$(cat /proc/sys/kernel/ns_last_pid)
	echo "helper: dispatch ATTACH=1 of true: $(((t1 - t0) / 20)) ms each, ~$(((p1 - p0) / 20)) PIDs each (incl. timeout + perl of this driver)"
fi

echo "$PASS passed, $FAIL failed"
rm -rf "$ROOT"
[ "$FAIL" = 0 ]
