# cairn.sh: host side of the cairn marker protocol v1; PROTOCOL.md is the spec.
# Installed once as DIR/bin/cairn-sh-SHA256 and run as
#   /bin/sh -c '. "$1"' cairn DIR/bin/cairn-sh-SHA256 MODE ARG...
# or, where it cannot be installed, streamed on stdin and run as
#   /bin/sh -c 'eval "$1"' cairn "<this script>" MODE ARG...
# (docs/HOST-HELPER.md). POSIX sh (bash, dash, busybox ash). Comments are whole lines
# (strippable). The whole script is one brace group: the shell parses all of it before it runs
# any of it, so a file cut short runs nothing.
{
CAIRN_SRC=$1
shift
# how the supervisor runs this script again: from its installed file (an absolute path), or
# from its text
# shellcheck disable=SC2016 # $1 of the new shell
case $CAIRN_SRC in
/*) CAIRN_RUN='. "$1"' ;;
*) CAIRN_RUN='eval "$1"' ;;
esac
MODE=$1
set -f
NL='
'
# STAGE: a dispatch's staging directory, not yet moved into place (die removes it); TAG:
# @@cairn-NONCE@@, which starts every protocol line; BOOT: the boot identity, once read
STAGE=
TAG=
BOOT=

# say WORDS: one protocol line, tagged with the dispatch's TAG: on stderr, except in a session
# (one framed stream on stdout)
SAY_FD=2
[ "$MODE" = session ] && SAY_FD=1
say() { printf '%s %s\n' "$TAG" "$*" >&"$SAY_FD"; }

# say_error TEXT: the protocol line "TAG error TEXT", with newlines turned into spaces
say_error() {
	m=$*
	while :; do
		case $m in
		*"$NL"*) m="${m%%"$NL"*} ${m#*"$NL"}" ;;
		*) break ;;
		esac
	done
	say error "$m"
}

# the supervisor reports on its verdict pipe, all others on the channel
die() {
	[ -n "$STAGE" ] && rm -rf "$STAGE"
	if [ "$MODE" = supervise ]; then
		printf '%s\nverdict refused\n' "$1"
	else
		say_error "$1"
		[ "$MODE" = dispatch ] && say verdict refused
		say end
	fi
	exit 1
}

# run a command or function; on failure die with its own message
run() { m=$("$@" 2>&1) || die "$m"; }
put() { printf '%s\n' "$2" >"$1"; }
num() { case $1 in '' | *[!0-9]* | 0?*) false ;; *) [ ${#1} -le 15 ] ;; esac; }
hex() { case $1 in *[!0-9a-f]*) false ;; *) [ ${#1} -eq "$2" ] ;; esac; }
bit() { case $1 in 0 | 1) true ;; *) false ;; esac; }
# fsync FILE...: flush these files (and directories) to disk; an old sync(1) without FILE
# arguments syncs everything
fsync() { sync "$@" 2>/dev/null || sync; }
# now: sets NOW to seconds since the epoch without a fork where possible: bash's
# EPOCHSECONDS, else boot time plus uptime from /proc (may read 1 s early), else date
BOOT_TIME=
now() {
	# shellcheck disable=SC3028 # bash's; unset (empty) in other shells
	NOW=${EPOCHSECONDS:-}
	[ -n "$NOW" ] && return 0
	if [ -z "$BOOT_TIME" ]; then
		while read -r n_k n_v; do
			[ "$n_k" = btime ] && BOOT_TIME=$n_v && break
		done 2>/dev/null </proc/stat
	fi
	if num "$BOOT_TIME" && read -r n_u _ 2>/dev/null </proc/uptime && num "${n_u%%.*}"; then
		NOW=$((BOOT_TIME + ${n_u%%.*}))
	else
		NOW=$(date +%s)
	fi
}
# wake: wake the watchers of F (a read-write open of the fifo never blocks; a session makes no
# fifo: its first watcher does)
wake() {
	[ -p "$F/wake" ] || return 0
	n=$NL$NL$NL$NL
	n=$n$n$n$n
	printf '%s' "$n$n$n$n" 1<>"$F/wake"
}
# size FILE: sets SIZE (busybox wc may pad with spaces)
size() { SIZE=$(wc -c <"$1") && SIZE=${SIZE##*[!0-9]}; }

# pst PID: STATE and STIME (field 22) from /proc/PID/stat; comm (field 2) may
# hold spaces and parentheses: use what follows the last ") "
pst() {
	read -r PROC_STAT 2>/dev/null <"/proc/$1/stat" || return 1
	pss
}
# pss: the same from a stat line already in PROC_STAT
pss() {
	PROC_STAT=${PROC_STAT##*") "}
	# shellcheck disable=SC2086 # split the numeric fields on purpose (noglob is on)
	set -- $PROC_STAT
	STATE=$1
	STIME=${20}
}
# boot identity: kernel boot ID / start time of PID 1
# (read once per process: a reboot ends every process that could ask again)
boot() {
	[ -n "$BOOT" ] && return 0
	read -r b <"${CAIRN_BOOT_ID_FILE:-/proc/sys/kernel/random/boot_id}" && pst 1 && BOOT=$b/$STIME
}
# parse_start RECORD: sets R_* from a started record; false if its version is not ours
parse_start() {
	R_v='' R_boot='' R_pid='' R_start=''
	for kv in $1; do
		case $kv in
		v=*) R_v=${kv#*=} ;;
		boot=*) R_boot=${kv#*=} ;;
		sup_pid=*) R_pid=${kv#*=} ;;
		sup_start=*) R_start=${kv#*=} ;;
		esac
	done
	[ "$R_v" = 1 ]
}
# ours PID START: PID names a live process (not a zombie) that started at START; a PID can
# be reused, its start time tells
ours() { pst "$1" && [ "$STIME" = "$2" ] && case $STATE in Z | X) false ;; esac; }
# liveness of the supervisor of the record last parsed: sets LIVENESS (alive, dead, rebooted)
alive() {
	if ! boot || [ "$BOOT" != "$R_boot" ]; then
		LIVENESS=rebooted
	# (F/lost: a host session, alive itself, lost this execution's waiter: PROTOCOL.md, Session)
	elif [ ! -e "$F/lost" ] && ours "$R_pid" "$R_start"; then
		LIVENESS=alive
	else
		LIVENESS=dead
	fi
}
# is the command's group leader (x/ID/pgid: PID, start time) still alive?
lead() { num "$LEADER_PID" && ours "$LEADER_PID" "$LEADER_START"; }

# Signals go only through these: every PID is checked to be a number > 1, so a
# bad value can never become kill -1 (everything) or kill 0 (our own group). The form
# is "kill -s SIG -- PID": a kill that is not the shell's builtin (procps-ng 4.0.2) reads
# "kill -TERM -123" as options and signals every process (kill(-1)); dash refuses "kill -0 --".
kill_pids() {
	k_=$1
	shift
	for q_; do
		num "$q_" && [ "$q_" -gt 1 ] && kill -s "$k_" -- "$q_" 2>/dev/null
	done
	true
}
# kill_group SIG: the command's process group (LEADER_PID LEADER_START, from F/pgid).
# While the leader lives, with that start time: its group, or the leader alone while the
# group does not exist yet. A PID that now names another process: nothing (ours is gone).
# No process by that PID: only the group, whose members keep the number from being reused.
kill_group() {
	num "$LEADER_PID" && [ "$LEADER_PID" -gt 1 ] || return 0
	if pst "$LEADER_PID"; then
		[ "$STIME" = "$LEADER_START" ] || return 0
		kill -s "$1" -- "-$LEADER_PID" 2>/dev/null || kill -s "$1" -- "$LEADER_PID" 2>/dev/null
	else
		kill -s "$1" -- "-$LEADER_PID" 2>/dev/null
	fi
	true
}
tick() { sleep 0.1 2>/dev/null || sleep 1; }
# sleep that can be cut short: TERM to the subshell running it also ends the sleep
nap() {
	sleep "$1" &
	NAP_PID=$!
	wait $NAP_PID
}

# watchdog: with TIMEOUT > 0, started in the background just before the command: TERM to its
# process group after TIMEOUT seconds (touching F/timedout), KILL 5 s later
watchdog() {
	NAP_PID=
	trap 'kill_pids TERM "$NAP_PID"; exit 0' TERM
	nap "$TIMEOUT"
	read -r LEADER_PID LEADER_START <"$F/pgid" || exit 0
	true >"$F/timedout"
	kill_group TERM
	nap 5
	kill_group KILL
}

# command: run in a subshell (exits with the command's status). Own session, cwd $HOME,
# default HUP/PIPE; the command file COMMAND_FILE is read by the login shell sh, with the
# secrets (SECRETS: export lines) in its environment. Its PID is recorded before the cancel
# flag is checked (cancel writes the flag, then reads the PID).
command_() {
	read -r PROC_STAT </proc/self/stat
	q=${PROC_STAT%% *}
	pss
	echo "$q $STIME" >"$F/pgid"
	[ -e "$F.cancel" ] && exit 130
	trap - HUP PIPE
	cd "${HOME:-/}" || exit 126
	CAIRN_EXECUTION_ID=$ID
	CAIRN_COMMAND_FILE=$COMMAND_FILE
	export CAIRN_EXECUTION_ID CAIRN_COMMAND_FILE
	# (out of SECRETS before they are set: a secret of any name, SECRETS too, reaches the command)
	set -- "$SECRETS"
	unset SECRETS
	[ -z "$1" ] || eval "$1"
	# shellcheck disable=SC2016 # expanded by the login shell, from its environment
	exec setsid "$sh" -c '. "$CAIRN_COMMAND_FILE"' <"/dev/null" >"$F/out" 2>"$F/err"
}

# rest FILE OFFSET [SIZE]: send FILE from OFFSET up to SIZE (default: its current size);
# sets OFFSET to the new offset
rest() {
	OFFSET=$2
	if num "$3"; then
		SIZE=$3
	else
		size "$1" 2>/dev/null || return 0
	fi
	[ "$SIZE" -gt "$2" ] || return 0
	if [ "$2" = 0 ]; then
		head -c "$SIZE" "$1" 2>/dev/null
	else
		tail -c +$(($2 + 1)) "$1" 2>/dev/null | head -c $((SIZE - $2))
	fi
	OFFSET=$SIZE
}

# heartbeat: wake the watcher every 2 s to re-check liveness; if the watcher
# is gone, kill what it started
# (alive by its start time: kill -0 would stay true for a reused PID, and this loop would
# go on for nobody)
heartbeat() {
	NAP_PID=
	trap 'kill_pids TERM "$NAP_PID"; exit 0' TERM
	WATCHER_START='' HEARTBEAT_START=''
	pst $$ && WATCHER_START=$STIME
	# this subshell's own start time: each helper it was given started before it, so a PID
	# that now names a process started later was reused (the helper had ended)
	read -r PROC_STAT </proc/self/stat && pss && HEARTBEAT_START=$STIME
	while [ -n "$WATCHER_START" ] && nap 2 && ours $$ "$WATCHER_START"; do
		echo >&4
	done
	for h_; do
		pst "$h_" && num "$HEARTBEAT_START" && [ "$STIME" -le "$HEARTBEAT_START" ] && kill_pids TERM "$h_"
	done
}

# stream OUT_OFF ERR_OFF WAIT: the body of watch (and of dispatch with ATTACH=1)
stream() {
	o=$1 r=$2 COUNTS_KNOWN=1
	if [ "$3" = 1 ] && [ ! -e "$F.done" ]; then
		alive
		# the supervisor moves the stage into place right after crossing the guard (a session
		# makes no wake fifo: the first watcher does)
		while [ "$LIVENESS" = alive ] && [ ! -p "$F/wake" ]; do
			[ -d "$F" ] && mkfifo "$F/wake" 2>/dev/null
			[ -p "$F/wake" ] && break
			tick
			alive
		done
		if [ "$LIVENESS" = alive ] && [ -p "$F/wake" ]; then
			# open wake first, then re-check: a finish after this point wakes us
			exec 4<>"$F/wake"
			[ -e "$F.done" ] || live
			exec 4>&-
		fi
	fi
	# liveness is decided before looking for the finish record
	alive
	d=
	[ -e "$F.done" ] && read -r d <"$F.done"
	if [ "$COUNTS_KNOWN" = 1 ]; then
		# a finished command's output ends at the sizes in its finish record
		zo='' ze=''
		for kv in $d; do
			case $kv in
			out=*) zo=${kv#*=} ;;
			err=*) ze=${kv#*=} ;;
			esac
		done
		rest "$F/out" "$o" "$zo" && o=$OFFSET
		rest "$F/err" "$r" "$ze" >&2 && r=$OFFSET
		say sizes "out=$o err=$r"
	fi
	say live "$LIVENESS"
	if [ -n "$d" ]; then
		say 'done' "$d"
	fi
}

# Follow out and err (tail -f) until the finish record appears or the supervisor
# is gone. tail -> fifo -> tee -> channel, and tee -> fifo -> wc: the count is
# exactly what reached the channel, so rest() continues from there.
live() {
	LIVE_FIFOS=$T/w$$
	# (noglob is on: name the files; stderr here is the command's own stream: a file that
	# cannot be removed, in a marker home made read-only, must not add bytes to it)
	wrm() { rm -f "$LIVE_FIFOS.o" "$LIVE_FIFOS.e" "$LIVE_FIFOS.co" "$LIVE_FIFOS.ce" "$LIVE_FIFOS.no" "$LIVE_FIFOS.ne" 2>/dev/null; }
	wrm
	mkfifo "$LIVE_FIFOS.o" "$LIVE_FIFOS.e" "$LIVE_FIFOS.co" "$LIVE_FIFOS.ce" "$LIVE_FIFOS.no" "$LIVE_FIFOS.ne" 2>/dev/null || {
		wrm
		return
	}
	# The counts come back through fifos opened read-write here (never blocking, never a
	# write to the disk, which may be full). If a count is lost, COUNTS_KNOWN=0: we no longer know
	# how far the channel got, so stream() sends nothing more and the client asks again from the
	# offsets it counted itself.
	exec 3<>"$LIVE_FIFOS.no" 9<>"$LIVE_FIFOS.ne"
	# We open the data fifos ourselves, so no open can block and each tee sees
	# EOF exactly when its tail dies (each tail holds the only write end).
	# shellcheck disable=SC2094 # a fifo: read-write, then read-only, on purpose
	exec 5<>"$LIVE_FIFOS.o" 6<"$LIVE_FIFOS.o" 7<>"$LIVE_FIFOS.e" 8<"$LIVE_FIFOS.e"
	tail -c +$((o + 1)) -f "$F/out" >&5 7>&- 2>/dev/null &
	f1=$!
	tail -c +$((r + 1)) -f "$F/err" >&7 5>&- 2>/dev/null &
	f2=$!
	exec 5>&- 7>&-
	wc -c <"$LIVE_FIFOS.co" >&3 2>/dev/null &
	w1=$!
	wc -c <"$LIVE_FIFOS.ce" >&9 2>/dev/null &
	w2=$!
	tee "$LIVE_FIFOS.co" <&6 2>/dev/null &
	t1=$!
	tee "$LIVE_FIFOS.ce" <&8 >&2 2>/dev/null &
	t2=$!
	exec 6<&- 8<&-
	heartbeat $f1 $f2 $t1 $t2 $w1 $w2 &
	h=$!
	while read -r _ <&4; do
		[ -e "$F.done" ] && break
		alive
		[ "$LIVENESS" = alive ] || break
		# a dead tee means the channel is gone
		kill -0 "$t1" "$t2" 2>/dev/null || break
	done
	kill_pids TERM "$h" "$f1" "$f2"
	wait $t1 $t2 $w1 $w2 $h
	# a sentinel after the count: a wc that died without writing cannot block the read
	echo x >&3
	echo x >&9
	read -r n <&3
	case $n in '' | *[!0-9]*) COUNTS_KNOWN=0 ;; *) o=$((o + n)) ;; esac
	read -r n <&9
	case $n in '' | *[!0-9]*) COUNTS_KNOWN=0 ;; *) r=$((r + n)) ;; esac
	exec 3>&- 9>&-
	wrm
}

# --- arguments: nothing from the caller is ever evaluated as code ---
case $3 in
*[!0-9a-f]* | '') TAG= ;;
*) [ ${#3} -eq 32 ] && TAG=@@cairn-$3@@ ;;
esac
[ -n "$TAG" ] || {
	echo "cairn: bad nonce" >&2
	exit 2
}
case $MODE in
hello) [ $# -eq 3 ] || { [ $# -eq 4 ] && hex "$4" 64; } ;;
dispatch) { [ $# -eq 8 ] || { [ $# -eq 9 ] && num "$9"; }; } && num "$5" && hex "$6" 64 && num "$7" && bit "$8" ;;
supervise) { [ $# -eq 8 ] || { [ $# -eq 9 ] && num "$9"; }; } && num "$5" && hex "$6" 64 && num "$7" && num "$8" ;;
watch) [ $# -eq 7 ] && num "$5" && num "$6" && bit "$7" ;;
cancel) [ $# -eq 5 ] && num "$5" ;;
gc) { [ $# -eq 5 ] || { [ $# -eq 6 ] && hex "$6" 64; }; } && num "$4" && num "$5" ;;
install) [ $# -eq 5 ] && hex "$4" 64 && num "$5" ;;
session) [ $# -eq 3 ] ;;
*) false ;;
esac || die "bad arguments for mode '$MODE'"
ID=$4
NONCE=$3
case $MODE in
hello | gc | session | install) ID= ;;
*)
	case $ID in '' | *[!A-Za-z0-9_-]*) die "bad execution ID" ;; esac
	[ ${#ID} -le 128 ] || die "bad execution ID"
	;;
esac
MARKER_DIR=$2
case $MARKER_DIR in
'' | *"$NL"*) die "bad marker directory" ;;
/*) ;;
*) [ -n "$HOME" ] || die "HOME is not set"
	MARKER_DIR=$HOME/$MARKER_DIR ;;
esac
# X and T: the marker home's x/ and tmp/ (as PROTOCOL.md names them); F: x/ID, the execution's
# records (F.start, F.done, F.cancel) and its directory (F/out, F/err, F/pgid ...). Short on
# purpose: the comments name every file by them.
X=$MARKER_DIR/x
T=$MARKER_DIR/tmp
F=$X/$ID
# No symbolic link anywhere on the marker path: a link could point the markers, and the
# writes that make them, at files elsewhere.
r=
q=
o=$IFS
IFS=/
for c in $MARKER_DIR; do
	[ -n "$c" ] || continue
	r=$r/$c
	[ -L "$r" ] && q=$r && break
done
IFS=$o
[ -L "$X" ] && q=$X
[ -L "$T" ] && q=$T
[ -L "$MARKER_DIR/bin" ] && q=$MARKER_DIR/bin
[ -z "$q" ] || die "the marker path $MARKER_DIR has a symbolic link at $q; refusing it (give --remote-dir the real path)"

# --- supervisor: started by dispatch, detached, never writes to the channel ---
if [ "$MODE" = supervise ]; then
	# the dispatcher may die (SIGPIPE/SIGHUP) at any time: that must not stop us
	trap '' HUP PIPE
	STAGE=$T/$ID.$8
	TIMEOUT=$7
	sh=${SHELL:-/bin/sh}
	[ -x "$sh" ] || die "login shell $sh is not executable"
	if [ ! -d "${HOME:-/}" ] || [ ! -x "${HOME:-/}" ]; then
		die "cannot cd to home ${HOME:-/}"
	fi
	SECRETS=
	if [ $# -eq 9 ]; then
		# exactly $9 bytes of `export NAME='value'` lines written by cairn, or refuse:
		# a cut connection must not start the command without its secrets
		SECRETS=$(dd bs=1 count="$9" 2>/dev/null && echo .)
		SECRETS=${SECRETS%.}
		[ "$(printf %s "$SECRETS" | wc -c)" -eq "$9" ] || die "stdin ended inside the secrets"
		exec </dev/null
	fi
	boot || die "cannot read the boot identity"
	pst $$ || die "cannot read /proc/$$/stat"
	read -r EPOCH _ <"$MARKER_DIR/epoch" || die "cannot read $MARKER_DIR/epoch"
	now
	put "$STAGE/start" "v=1 id=$ID len=$5 digest=$6 epoch=$EPOCH boot=$BOOT sup_pid=$$ sup_start=$STIME started_at=$NOW timeout=$TIMEOUT" ||
		die "cannot write $STAGE/start"
	# THE start guard: an exclusive link of the complete started record
	if ! m=$(ln "$STAGE/start" "$F.start" 2>&1); then
		[ -e "$F.start" ] || die "$m"
		echo "verdict exists"
		rm -rf "$STAGE"
		exit 0
	fi
	if ! m=$(mv "$STAGE" "$F" 2>&1); then
		# nothing ran: give the guard back rather than leave a start we cannot honour (a
		# home made read-only for a moment gets up to 20 tries, a second apart)
		i=0
		until rm -f "$F.start" 2>/dev/null && [ ! -e "$F.start" ]; do
			i=$((i + 1))
			[ "$i" -ge 20 ] && break
			sleep 1
		done
		if [ -e "$F.start" ]; then
			# the guard stays and no supervisor will honour it: say so without a verdict (the
			# dispatcher reports it started; the probe finds the supervisor gone, so the
			# client records interrupted, never a "never started" the host's records deny)
			printf 'the start guard was crossed, then the stage could not be moved into place (%s) and the guard could not be given back: the command did not start\n' "$m"
			exit 1
		fi
		fsync "$X"
		die "$m"
	fi
	STAGE=
	# one flush for the record and both names (the guard, the directory) before anything
	# runs; a crash before it completes leaves at worst a guard with an unreadable record
	# (reported as unknown), never a command that ran without its record
	fsync "$F/start" "$X"
	echo "verdict started"
	# Hold the verdict pipe open for up to 50 ms: most commands finish within that, and the
	# dispatcher then finds the finish record instead of setting up the live pipeline. The
	# sleep is released early only while it is still the same process (PID and start time).
	# A sleep without fractions fails at once: then no wait.
	sleep 0.05 2>/dev/null &
	HOLD_PID=$! HOLD_START=
	pst "$HOLD_PID" && HOLD_START=$STIME
	exec >/dev/null 2>&1
	w=
	if [ "$TIMEOUT" -gt 0 ]; then
		watchdog &
		w=$!
	fi
	COMMAND_FILE=$F/cmd
	(command_)
	c=$?
	if [ -n "$w" ]; then
		kill_pids TERM "$w"
		wait "$w"
	fi
	t=0 k=0
	[ -e "$F/timedout" ] && t=1
	[ -e "$F.cancel" ] && k=1
	# both sizes from one wc: "N path" lines (busybox pads N with spaces)
	m=$(wc -c "$F/out" "$F/err" 2>/dev/null)
	l=${m%%"$NL"*}
	l=${l#"${l%%[! ]*}"}
	o=${l%% *}
	m=${m#*"$NL"}
	l=${m%%"$NL"*}
	l=${l#"${l%%[! ]*}"}
	SIZE=${l%% *}
	if ! num "$o" || ! num "$SIZE"; then
		size "$F/out" && o=$SIZE && size "$F/err"
	fi
	now
	# written in place into the space reserved before the start
	# (its own newline, so that a reader stops there and not at the end of the padding);
	# a home that refuses the write (made read-only) is tried again each second for an hour,
	# while the client sees a live supervisor and waits; after that the supervisor gives up
	# and the execution reads as interrupted, never as a result the host does not hold
	i=0
	until printf 'v=1 id=%s status=%s finished_at=%s out=%s err=%s timed_out=%s cancelled=%s\n' \
		"$ID" "$c" "$NOW" "$o" "$SIZE" "$t" "$k" 2>/dev/null 1<>"$F/done.tmp"; do
		i=$((i + 1))
		[ "$i" -ge 3600 ] && exit 1
		sleep 1
	done
	# the outputs with the record: no record on disk states bytes the disk does not hold (an
	# output of 0 bytes has none to flush: the record states none)
	if [ "$o" != 0 ] && [ "$SIZE" != 0 ]; then
		fsync "$F/out" "$F/err" "$F/done.tmp"
	elif [ "$o" != 0 ]; then
		fsync "$F/out" "$F/done.tmp"
	elif [ "$SIZE" != 0 ]; then
		fsync "$F/err" "$F/done.tmp"
	else
		fsync "$F/done.tmp"
	fi
	until mv "$F/done.tmp" "$F.done" 2>/dev/null; do
		i=$((i + 1))
		[ "$i" -ge 3600 ] && exit 1
		sleep 1
	done
	fsync "$X"
	if [ -n "$HOLD_START" ] && pst "$HOLD_PID" && [ "$STIME" = "$HOLD_START" ]; then
		kill_pids TERM "$HOLD_PID"
	fi
	wake
	exit 0
fi

# --- every other mode: ensure the marker home and the epoch, say hello ---
if [ ! -d "$X" ] || [ ! -d "$T" ]; then
	run mkdir -p -m 700 "$MARKER_DIR"
	run mkdir -p "$X" "$T"
fi
if ! read -r EPOCH _ 2>/dev/null <"$MARKER_DIR/epoch"; then
	read -r u </proc/sys/kernel/random/uuid || die "cannot read /proc/sys/kernel/random/uuid"
	while :; do
		case $u in
		*-*) u=${u%%-*}${u#*-} ;;
		*) break ;;
		esac
	done
	now
	run put "$T/epoch.$$" "$u created=$NOW"
	fsync "$T/epoch.$$"
	# exclusive: of two racing first uses, one epoch wins
	ln "$T/epoch.$$" "$MARKER_DIR/epoch" 2>/dev/null
	rm -f "$T/epoch.$$"
	fsync "$MARKER_DIR"
	read -r EPOCH _ <"$MARKER_DIR/epoch" || die "cannot read $MARKER_DIR/epoch"
fi
# first contact (hello): the marker home must be private
if [ "$MODE" = hello ]; then
	case $(ls -ld "$MARKER_DIR") in
	d???------*) ;;
	*) die "the marker directory $MARKER_DIR is accessible by other users; fix it with: chmod 700 $MARKER_DIR" ;;
	esac
fi
# hstate FILE SHA: sets HELPER_STATE, the state of the native helper FILE (HOST-HELPER.md):
# absent, mismatch (not the file with that SHA-256), unrunnable (it does not run here: a home
# mounted noexec, another architecture), ok
hstate() {
	HELPER_STATE=absent
	[ -e "$1" ] || return 0
	HELPER_STATE=mismatch
	if command -v sha256sum >/dev/null 2>&1; then
		h_=$(sha256sum "$1" 2>/dev/null) || return 0
		[ "${h_%% *}" = "$2" ] || return 0
	fi
	h_=$("$1" "$2" selftest 2>/dev/null)
	case $?:$h_ in
	"0:cairn-host ok v=1") HELPER_STATE=ok ;;
	125:*) HELPER_STATE=mismatch ;;
	*) HELPER_STATE=unrunnable ;;
	esac
}
# hused FILE: whether a running process executes FILE (a supervisor or a session that a client
# of another version started with its helper): such a helper stays where it is (run with set +f)
hused() {
	for p_ in /proc/[0-9]*/exe; do
		# shellcheck disable=SC3013 # -ef: bash, dash and busybox have it
		[ "$p_" -ef "$1" ] && return 0
	done
	return 1
}
# rmhelpers KEEP: removes every DIR/bin/cairn-host-* but cairn-host-KEEP and those a running
# process executes; HELPERS_REMOVED: how many were removed
rmhelpers() {
	HELPERS_REMOVED=0
	set +f
	for f_ in "$MARKER_DIR"/bin/cairn-host-*; do
		if [ -e "$f_" ] && [ "$f_" != "$MARKER_DIR/bin/cairn-host-$1" ] && ! hused "$f_"; then
			rm -f "$f_" && HELPERS_REMOVED=$((HELPERS_REMOVED + 1))
			# (and the helper's seal of its own hash, HOST-HELPER.md)
			rm -f "$MARKER_DIR/bin/.${f_##*/}.seal"
		fi
	done
	set -f
}
# (hello with a helper's SHA-256: the host's architecture and that helper's state, once per
# connection)
HELLO_HELPER=
if [ "$MODE" = hello ] && [ $# -eq 4 ]; then
	hstate "$MARKER_DIR/bin/cairn-host-$4" "$4"
	HELLO_HELPER=" arch=$(uname -m 2>/dev/null || echo unknown) helper=$HELPER_STATE"
fi
boot || die "cannot read the boot identity"
now
say hello "v=1 epoch=$EPOCH boot=$BOOT now=$NOW$HELLO_HELPER"

case $MODE in
dispatch)
	COMMAND_LEN=$5 DIGEST=$6 TIMEOUT=$7 ATTACH=$8 SECRETS_LEN=${9:-0}
	if [ ! -e "$F.start" ]; then
		command -v setsid >/dev/null || die "setsid: command not found"
		STAGE=$T/$ID.$$
		run mkdir "$STAGE"
		# exactly COMMAND_LEN bytes from stdin, or refuse (a cut connection gives fewer)
		if [ "$SECRETS_LEN" -gt 0 ]; then
			# the secrets follow on stdin: not one byte more (busybox's head reads ahead)
			m=$(dd bs=1 count="$COMMAND_LEN" 2>&1 of="$STAGE/cmd") || die "$m"
		else
			m=$(head -c "$COMMAND_LEN" 2>&1 >"$STAGE/cmd") || die "$m"
		fi
		size "$STAGE/cmd"
		[ "$SIZE" = "$COMMAND_LEN" ] || die "stdin ended after $SIZE of $COMMAND_LEN bytes"
		# the stage; done.tmp reserves the space of the finish record (on failure, again
		# under run, for the host's own error text)
		prep() { true >"$STAGE/out" && true >"$STAGE/err" && printf '%512s\n' '' >"$STAGE/done.tmp"; }
		prep 2>/dev/null || run prep
		run mkfifo "$STAGE/wake"
		# the supervisor runs under the shell running us (busybox needs "sh")
		set -- /bin/sh
		# (-ef is not POSIX, but bash, dash and busybox have it; without it: readlink)
		# shellcheck disable=SC3013
		if ! [ "/proc/$$/exe" -ef /bin/sh ] 2>/dev/null; then
			sh=$(readlink "/proc/$$/exe" 2>/dev/null)
			if [ -x "$sh" ]; then
				case $sh in
				*/busybox) set -- "$sh" sh ;;
				/*) set -- "$sh" ;;
				esac
			fi
		fi
		# setsid twice: the second, a session leader, must fork (a portable setsid -f);
		# we only wait for EOF on the pipe, after the verdict
		if [ "$SECRETS_LEN" -gt 0 ]; then
			# secrets follow the command on stdin: the supervisor reads them itself, into
			# memory only (never a file), and hands them to the command's environment
			v=$(setsid setsid "$@" -c "$CAIRN_RUN" cairn "$CAIRN_SRC" supervise "$MARKER_DIR" "$NONCE" "$ID" "$COMMAND_LEN" "$DIGEST" "$TIMEOUT" $$ "$SECRETS_LEN" 2>&1)
		else
			v=$(setsid setsid "$@" -c "$CAIRN_RUN" cairn "$CAIRN_SRC" supervise "$MARKER_DIR" "$NONCE" "$ID" "$COMMAND_LEN" "$DIGEST" "$TIMEOUT" $$ </dev/null 2>&1)
		fi
		# error lines, then "verdict X" last
		VERDICT=
		case $v in
		*"verdict "*)
			VERDICT=${v##*verdict }
			v=${v%verdict *}
			;;
		esac
		v=${v%"$NL"}
		[ -n "$v" ] && say_error "$v"
		case $VERDICT in
		started | exists | refused) ;;
		*)
			# no verdict: the supervisor died; did it cross the guard? (records
			# are unique: they hold the supervisor's PID and start time)
			l=
			[ -d "$STAGE" ] && read -r l 2>/dev/null <"$STAGE/start"
			if [ -e "$F.start" ] && { [ ! -d "$STAGE" ] || { read -r d <"$F.start" && [ "$l" = "$d" ]; }; }; then
				VERDICT=started
			else
				VERDICT=refused
			fi
			;;
		esac
		[ "$VERDICT" = refused ] && rm -rf "$STAGE"
	else
		VERDICT=exists
	fi
	say verdict "$VERDICT"
	if [ "$VERDICT" != refused ] && read -r l <"$F.start"; then
		say start "$l"
		[ "$VERDICT" = started ] && [ "$ATTACH" = 1 ] && parse_start "$l" && stream 0 0 1
	fi
	;;
watch)
	if [ -e "$F.start" ]; then
		read -r l <"$F.start"
		say start "$l"
		if ! parse_start "$l"; then
			say_error "unsupported started record version '$R_v'"
		elif [ ! -d "$F" ] && [ -e "$F.done" ] && read -r d <"$F.done"; then
			# gc kept only the tombstone: the result is known, the output is gone
			say gone output
			say live dead
			say 'done' "$d"
		else
			stream "$5" "$6" "$7"
		fi
	else
		say absent
	fi
	;;
cancel)
	# the flag first: a supervisor that has not started the command yet will see it
	run touch "$F.cancel"
	if [ ! -e "$F.start" ]; then
		say absent
		CANCEL_RESULT=absent
	else
		read -r l <"$F.start"
		say start "$l"
		parse_start "$l" || die "unsupported started record version '$R_v'"
		alive
		if [ -e "$F.done" ]; then
			CANCEL_RESULT=finished
		elif [ "$LIVENESS" = rebooted ]; then
			CANCEL_RESULT=dead
		elif ! read -r LEADER_PID LEADER_START 2>/dev/null <"$F/pgid"; then
			CANCEL_RESULT=prevented
			[ "$LIVENESS" = alive ] || CANCEL_RESULT=dead
		elif lead; then
			kill_group TERM
			CANCEL_RESULT=signalled
			i=$(($5 * 10))
			while [ $i -gt 0 ] && [ ! -e "$F.done" ] && lead; do
				tick
				i=$((i - 1))
			done
			if [ ! -e "$F.done" ] && lead; then
				kill_group KILL
			fi
		else
			CANCEL_RESULT=finished
			[ "$LIVENESS" = alive ] || CANCEL_RESULT=dead
		fi
		# an alive supervisor records the outcome within moments
		i=30
		while [ $i -gt 0 ] && [ "$LIVENESS" = alive ] && [ ! -e "$F.done" ]; do
			tick
			i=$((i - 1))
			alive
		done
		say live "$LIVENESS"
		if [ -e "$F.done" ] && read -r d <"$F.done"; then
			say 'done' "$d"
		fi
	fi
	say cancel "$CANCEL_RESULT"
	;;
gc)
	# Finished executions only (a finish record exists): past OUTPUT_AGE seconds their output
	# directory goes, past TOMBSTONE_AGE their records too. The started record is removed last,
	# so the start guard holds until the very end. Running ones are never touched.
	now
	no=0 nt=0 nk=0
	set +f
	for f in "$X"/*.done; do
		[ -e "$f" ] || continue
		i=${f%.done}
		read -r d <"$f" || continue
		fa=${d##*finished_at=}
		fa=${fa%% *}
		num "$fa" || continue
		a=$((NOW - fa))
		if [ "$a" -ge "$5" ]; then
			rm -rf "$i" && rm -f "$i.cancel" "$i.cmd" "$f" && rm -f "$i.start" && nt=$((nt + 1))
		elif [ "$a" -ge "$4" ] && [ -d "$i" ]; then
			rm -rf "$i" && rm -f "$i.cmd" && no=$((no + 1))
		fi
	done
	for f in "$X"/*.start; do
		[ -e "$f" ] && [ ! -e "${f%.start}.done" ] && nk=$((nk + 1))
	done
	set -f
	# stages of dispatches that died before their verdict, a day old
	find "$T" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null
	fsync "$X"
	# native helpers of other versions (the client names the one it uses)
	GC_HELPERS=
	if [ $# -eq 6 ]; then
		rmhelpers "$6"
		GC_HELPERS=" removed_helpers=$HELPERS_REMOVED"
	fi
	say gc "removed_output=$no removed_tombstones=$nt unfinished=$nk$GC_HELPERS"
	;;
install)
	# the native helper, LEN bytes on stdin: written beside the others, checked (its SHA-256,
	# and that it runs here), then renamed into place, so that its name never holds anything
	# else (HOST-HELPER.md)
	HELPER_DIR=$MARKER_DIR/bin
	run mkdir -p -m 700 "$HELPER_DIR"
	f=$T/h.$$
	m=$(head -c "$5" 2>&1 >"$f") || {
		rm -f "$f"
		die "$m"
	}
	size "$f"
	[ "$SIZE" = "$5" ] || {
		rm -f "$f"
		die "stdin ended after $SIZE of $5 bytes"
	}
	run chmod 700 "$f"
	hstate "$f" "$4"
	if [ "$HELPER_STATE" = ok ]; then
		fsync "$f"
		run mv -f "$f" "$HELPER_DIR/cairn-host-$4"
		# a new version in place: the others go (HOST-HELPER.md)
		rmhelpers "$4"
		fsync "$HELPER_DIR"
	else
		rm -f "$f"
	fi
	say helper "$HELPER_STATE"
	;;
# SESSION ARM BEGINS: sent only with the session mode (the client leaves it out of every
# other exec, which keeps them small)
session)
	# One long-lived exec per connection that starts many dispatches, sharing the guard `ln`,
	# the flushes and the size count of those that arrive together (PROTOCOL.md, Session).
	command -v setsid >/dev/null || die "setsid: command not found"
	sh=${SHELL:-/bin/sh}
	[ -x "$sh" ] || die "login shell $sh is not executable"
	if [ ! -d "${HOME:-/}" ] || [ ! -x "${HOME:-/}" ]; then
		die "cannot cd to home ${HOME:-/}"
	fi
	# this shell is the supervisor of every command it starts: its PID and start time go
	# into their started records
	pst $$ || die "cannot read /proc/$$/stat"
	SESSION_START=$STIME
	trap '' HUP PIPE
	# (flushes name their files: never syncfs, which would wait for every other writer's dirty
	# data on the file system; PROTOCOL.md, Session)
	SESSION_DIR=$T/s$$
	EVENT_FIFO=$T/s$$.q
	GO_ON_FIFO=$T/s$$.k
	rm -rf "$SESSION_DIR" "$EVENT_FIFO" "$GO_ON_FIFO"
	run mkdir "$SESSION_DIR"
	run mkfifo "$EVENT_FIFO" "$GO_ON_FIFO"
	# EVENT_FIFO: every event for this shell, one line each (requests from the reader, exit
	# statuses from the waiters); GO_ON_FIFO: the reader waits here until a batch has been taken
	exec 4<>"$EVENT_FIFO" 5<>"$GO_ON_FIFO" 3<&0
	rm -f "$EVENT_FIFO" "$GO_ON_FIFO"
	# (an asynchronous list gets /dev/null as stdin unless it is given one: fd 3 is ours)
	(
		# the reader: requests from stdin, checked, command bytes into SESSION_DIR/ID.cmd
		# rd FILE: the next l lines of stdin into FILE (false if a write failed)
		rd() {
			{
				w_=0
				while [ "$l" -gt 0 ] && IFS= read -r t; do
					l=$((l - 1))
					if [ "$l" = 0 ] && [ "$u" = 1 ]; then
						printf '%s' "$t" || w_=1
					else
						printf '%s\n' "$t" || w_=1
					fi
				done
				[ "$w_" = 0 ]
			} >"$1"
		}
		n=0
		while read -r k a b c d l u x; do
			case $k in
			d)
				case $a in '' | *[!A-Za-z0-9_-]*) break ;; esac
				if [ ${#a} -gt 128 ] || ! num "$b" || ! hex "$c" 64 || ! num "$d" || ! num "$l" || ! bit "$u" || [ -n "$x" ]; then
					break
				fi
				n=$((n + 1))
				[ "$n" -le 64 ] || break
				# an ID twice in one session: the client is confused; stop rather than guess
				if [ -e "$SESSION_DIR/$a.cmd" ]; then
					echo "q execution $a was sent twice in one session; nothing more is read" >&4
					exit 0
				fi
				# the command: l lines, read by the shell itself (no process); with u=1 the
				# last newline was added for the transfer and is not part of the command
				f=r
				rd "$SESSION_DIR/$a.cmd" 2>/dev/null || f=w
				# (a file that could not be opened: read the lines all the same)
				[ "$l" -gt 0 ] && [ "$f" = w ] && rd /dev/null
				# then the line "e": a cut connection gives fewer lines and no "e"
				if [ "$l" != 0 ] || ! read -r t || [ "$t" != e ]; then
					rm -f "$SESSION_DIR/$a.cmd"
					echo q >&4
					exit 0
				fi
				[ "$f" = w ] && rm -f "$SESSION_DIR/$a.cmd"
				echo "$f $a $b $c $d" >&4
				;;
			g)
				echo g >&4
				n=0
				read -r _ <&5 || break
				;;
			*) break ;;
			esac
		done
		# EOF, or a request that is not well-formed: nothing more is read
		if [ -n "$k" ]; then
			echo "q a request line was not well-formed; nothing more is read" >&4
		else
			echo q >&4
		fi
	) <&3 >/dev/null 2>&1 &
	# (the reader's PID: if it is killed, nothing would ever say "q")
	# shellcheck disable=SC2034 # read through eval (hl r 0)
	PID_r0=$!
	exec </dev/null 3<&-
	# the ticker: a "t" every 2 s, so that a waiter that died without reporting is noticed;
	# it stops when this shell is gone
	(
		exec 5>&-
		NAP_PID=
		trap 'kill_pids TERM "$NAP_PID"; exit 0' TERM
		# (alive by its start time: a PID can be reused)
		while nap 2 && ours $$ "$SESSION_START"; do
			echo t >&4
		done
	) </dev/null >/dev/null 2>&1 &
	TICKER_PID=$!
	# Protocol lines are gathered and written together (fl) before output bytes and when all
	# queued events have been handled: one write, and one SSH packet, for many lines (nothing
	# below calls die, which would leave them unwritten).
	SAY_BUFFER=''
	say() { SAY_BUFFER="$SAY_BUFFER$TAG $*$NL"; }
	fl() {
		[ -n "$SAY_BUFFER" ] || return 0
		printf '%s' "$SAY_BUFFER"
		SAY_BUFFER=''
	}
	# REQUESTS: requests read since the last "g" (ID:LEN:DIGEST:TIMEOUT), REQUESTS_COUNT of
	# them; CONFIRMED: requests confirmed by a "g" and waiting for the next batch helper,
	# CONFIRMED_COUNT of them; READER_WAITS: the reader waits for its go-on; BATCH_RUNNING: a
	# batch helper is running, BATCH_UNREPORTED: its requests not reported on yet; EXITED: finished
	# commands (ID:STATUS); FINISH_UNREPORTED: those of the running finish helper not reported
	# yet; FINISH_RUNNING: a finish helper is running; UNANSWERED: commands started and not yet
	# answered; HELPERS: helpers running beside this shell (each one's PID in PID_b<N>, PID_f<N>,
	# the reader's in PID_r0); READER_GONE: the reader has stopped;
	# SENTINEL_QUEUED: this shell's sentinel is in the queue; WAITERS: the waiters running
	# (see start)
	REQUESTS='' REQUESTS_COUNT=0 CONFIRMED='' CONFIRMED_COUNT=0 READER_WAITS='' EXITED='' UNANSWERED=0 HELPERS=0
	READER_GONE='' SENTINEL_QUEUED='' nb=0 nf=0 nw=0 WAITERS='' p_='' FINISH_RUNNING=''
	BATCH_RUNNING='' BATCH_UNREPORTED='' FINISH_UNREPORTED=''
	# This shell only reads events, answers and starts waiters: the batch's files, links and
	# flushes, and a finish group's count, records, links and flushes, each run in a helper
	# subshell beside it, which reports back through the same queue, one short line per
	# execution (a write of at most PIPE_BUF bytes to a fifo is never interleaved):
	#   v ID VERDICT [MESSAGE]   the batch helper: exists, or refused (nothing ran)
	#   a ID TIMEOUT NOW         the batch helper, after the flush: ID's guard is ours, on disk
	#                            (its started record has started_at=NOW)
	#   y N                      the batch helper N has ended
	#   o ID OUT ERR STATUS NOW TIMED_OUT CANCELLED
	#                            the finish helper, after its flushes: ID's record is in place
	#   z N                      the finish helper N has ended
	# and from this shell itself: "s" (its sentinel), "u N ID" (waiter N may be gone), "x b|f N"
	# (helper N may be gone)
	# tell ID VERDICT MESSAGE: one line, at most 512 bytes of message, to this shell's queue
	# (the client keeps at most 64 executions in a session, so their lines in the queue at once
	# stay below a pipe's 64 KiB, which this shell's own sentinel write relies on)
	tell() {
		m_=$3
		while :; do
			case $m_ in
			*"$NL"*) m_="${m_%%"$NL"*} ${m_#*"$NL"}" ;;
			*) break ;;
			esac
		done
		while [ ${#m_} -gt 512 ]; do
			m_=${m_%????????????????????????????????????????????????????????????????}
		done
		echo "v $1 $2 $m_" >&4
	}
	# The records, built by one function each for the helper that writes them and for this
	# shell, which rebuilds them from a short report instead of reading them back (the shells
	# read a byte per system call). NOW: started_at, finished_at.
	# srec ID LEN DIGEST TIMEOUT: sets START_RECORD, the started record
	# unguard ID: remove a guard this batch crossed whose command could not be put in place,
	# with its stage and command; a home made read-only for a moment gets up to 20 tries, a
	# second apart (a "refused" while the guard stays would let the client record "never
	# started" beside a started record). False if the guard is still there.
	unguard() {
		n_=0
		until rm -rf "${X:?}/$1" "$X/$1.cmd" "$X/$1.start" 2>/dev/null && [ ! -e "$X/$1.start" ]; do
			n_=$((n_ + 1))
			[ "$n_" -ge 20 ] && return 1
			sleep 1
		done
	}
	srec() { START_RECORD="v=1 id=$1 len=$2 digest=$3 epoch=$EPOCH boot=$BOOT sup_pid=$$ sup_start=$SESSION_START started_at=$NOW timeout=$4"; }
	# drec ID STATUS OUT ERR TIMED_OUT CANCELLED: sets DONE_RECORD, the finish record
	drec() { DONE_RECORD="v=1 id=$1 status=$2 finished_at=$NOW out=$3 err=$4 timed_out=$5 cancelled=$6"; }
	# answer ID VERDICT [MESSAGE [RECORD]]: error, verdict, start (the started record given,
	# else the one on disk, if any), end
	answer() {
		[ -n "$3" ] && say "=$1" error "$3"
		say "=$1" verdict "$2"
		if [ -n "$4" ]; then
			say "=$1" start "$4"
		elif [ "$2" != refused ] && read -r l 2>/dev/null <"$X/$1.start"; then
			say "=$1" start "$l"
		fi
		[ "$2" = started ] || say "=$1" end
	}
	# (the batch helper) refuse the whole batch with the tool's message
	refuse() {
		for r in $REQUESTS; do
			i=${r%%:*}
			rm -f "$SESSION_DIR/$i.cmd"
			tell "$i" refused "$1"
		done
	}
	# (the batch helper) the batch in REQUESTS: stage (in BATCH_STAGE), cross the guards with
	# one ln, move into place with one mv, one flush; then "a" for each winner (GUARDED: the
	# requests whose guard this batch crossed)
	batch() {
		# stages live under SESSION_DIR/b, cleared every 64 batches (one rm, not one a batch; one batch
		# helper runs at a time)
		if [ $((nb % 64)) = 0 ]; then
			rm -rf "$SESSION_DIR/b"
		fi
		BATCH_STAGE=$SESSION_DIR/b/$nb
		set --
		for r in $REQUESTS; do set -- "$@" "$BATCH_STAGE/${r%%:*}"; done
		m=$(mkdir -p "$BATCH_STAGE" "$@" 2>&1) || {
			refuse "$m"
			return
		}
		# the stage of each; its finish record's space reserved now (a full disk later
		# cannot stop it being written)
		for f; do
			{ true >"$f/out" && true >"$f/err" && printf '%512s\n' '' >"$f/${f##*/}.done"; } 2>/dev/null || {
				refuse "cannot write in $f (disk full?)"
				return
			}
		done
		now
		set --
		for r in $REQUESTS; do
			i=${r%%:*} v=${r#*:}
			l=${v%%:*} v=${v#*:}
			srec "$i" "$l" "${v%%:*}" "${v#*:}"
			put "$BATCH_STAGE/$i.start" "$START_RECORD" 2>/dev/null || {
				refuse "cannot write $BATCH_STAGE/$i.start"
				return
			}
			set -- "$@" "$BATCH_STAGE/$i.start"
		done
		# THE start guards: exclusive links of the complete started records; a name that
		# exists fails and the others still go in (each is checked below)
		m=$(ln "$@" "$X/" 2>&1)
		set --
		GUARDED=''
		for r in $REQUESTS; do
			i=${r%%:*}
			# shellcheck disable=SC3013 # -ef: bash, dash and busybox have it
			if [ "$BATCH_STAGE/$i.start" -ef "$X/$i.start" ]; then
				GUARDED="$GUARDED $r"
				set -- "$@" "$BATCH_STAGE/$i" "$SESSION_DIR/$i.cmd"
			elif [ -e "$X/$i.start" ]; then
				rm -f "$SESSION_DIR/$i.cmd"
				tell "$i" exists
			else
				rm -f "$SESSION_DIR/$i.cmd"
				tell "$i" refused "$m"
			fi
		done
		[ $# -gt 0 ] && m=$(mv "$@" "$X/" 2>&1)
		set --
		REQUESTS=''
		for r in $GUARDED; do
			i=${r%%:*}
			if [ -d "$X/$i" ] && [ -e "$X/$i.cmd" ]; then
				REQUESTS="$REQUESTS $r"
				set -- "$@" "$X/$i.start"
			else
				# nothing ran: give the guard back rather than leave a start we cannot honour
				rm -f "$SESSION_DIR/$i.cmd"
				unguard "$i" || m="$m; the start guard could not be given back"
				tell "$i" refused "$m"
			fi
		done
		[ $# -gt 0 ] || return 0
		# one flush for every record and name before anything runs
		fsync "$X" "$@"
		for r in $REQUESTS; do
			echo "a ${r%%:*} ${r##*:} $NOW" >&4
		done
	}
	# start ID (timeout TIMEOUT) under waiter number nw (this shell keeps its PID in PID_w<nw> for the
	# reaping: the waiter reads nothing from /proc; WAITERS lists the waiters running, as nw:ID)
	start() {
		ID=$1 TIMEOUT=$2
		F=$X/$ID COMMAND_FILE=$X/$ID.cmd SECRETS=''
		nw=$((nw + 1))
		WAITERS="$WAITERS $nw:$ID"
		(
			# the waiter: the command's exit status
			w=
			if [ "$TIMEOUT" -gt 0 ]; then
				watchdog &
				w=$!
			fi
			(
				# the session's queues are not the command's business
				exec 4>&- 5>&-
				command_
			)
			c=$?
			if [ -n "$w" ]; then
				kill_pids TERM "$w"
				wait "$w"
			fi
			echo "f $ID $c $nw" >&4
		) </dev/null >/dev/null 2>&1 &
		eval "PID_w$nw=\$!"
		UNANSWERED=$((UNANSWERED + 1))
	}
	# (the finish helper) the commands in EXITED have exited: one wc for their sizes, their finish
	# records written in place, one flush, one ln into place, one flush of the names; then
	# "o" for each
	finish() {
		# one wc of the outputs that are not empty (a silent command costs none); V_ holds
		# ID:STATUS:WHICH (o: out counted, e: err counted)
		set --
		V_='' L_='' R_=''
		for r in $EXITED; do
			F=$X/${r%%:*}
			e_=-
			[ -s "$F/out" ] && set -- "$@" "$F/out" && e_=o
			[ -s "$F/err" ] && set -- "$@" "$F/err" && e_=${e_}e
			V_="$V_ $r:$e_"
		done
		m=''
		[ $# -gt 0 ] && m=$(wc -c "$@" 2>/dev/null)
		now
		D_=''
		# (the outputs stay in the list: flushed with the records, so that no record on disk
		# states bytes the disk does not hold)
		for r in $V_; do
			ID=${r%%:*} r=${r#*:}
			c=${r%%:*} e_=${r#*:}
			F=$X/$ID
			# "N path" lines in order (busybox pads N with spaces)
			o=0 z=0
			case $e_ in
			*o*)
				o=''
				l=${m%%"$NL"*}
				m=${m#*"$NL"}
				l=${l#"${l%%[! ]*}"}
				[ "${l#* }" = "$F/out" ] && o=${l%% *}
				;;
			esac
			case $e_ in
			*e)
				z=''
				l=${m%%"$NL"*}
				m=${m#*"$NL"}
				l=${l#"${l%%[! ]*}"}
				[ "${l#* }" = "$F/err" ] && z=${l%% *}
				;;
			esac
			if ! num "$o" || ! num "$z"; then
				size "$F/out" && o=$SIZE && size "$F/err" && z=$SIZE
			fi
			t=0 k=0
			[ -e "$F/timedout" ] && t=1
			[ -e "$F.cancel" ] && k=1
			drec "$ID" "$c" "$o" "$z" "$t" "$k"
			# a record the home refuses (made read-only) is not reported: the session gives
			# it to the next finish helper, which writes it again (see "z")
			if printf '%s\n' "$DONE_RECORD" 2>/dev/null 1<>"$F/$ID.done"; then
				# kept for the reports below: "ID OUT ERR STATUS NOW TIMED_OUT CANCELLED", one
				# line each (x: a size unknown); this shell rebuilds the record from them
				D_="$D_$ID ${o:-x} ${z:-x} $c $NOW $t $k$NL"
				L_="$L_ $ID"
				set -- "$@" "$F/$ID.done"
			else
				R_=1
			fi
		done
		fsync "$@"
		set --
		for ID in $L_; do
			set -- "$@" "$X/$ID/$ID.done"
		done
		[ $# -gt 0 ] && ln "$@" "$X/" 2>/dev/null
		fsync "$X"
		while [ -n "$D_" ]; do
			l=${D_%%"$NL"*}
			D_=${D_#*"$NL"}
			# only a record whose name is in place is reported
			if [ -e "$X/${l%% *}.done" ]; then
				echo "o $l" >&4
			else
				R_=1
			fi
		done
		# what was refused is tried again by the next finish helper, a second from now
		[ -n "$R_" ] && sleep 1
	}
	# answer ID (OUT ERR "STATUS NOW TIMED_OUT CANCELLED": from the finish helper): wake the
	# watchers, output, record
	finished() {
		ID=$1 o=$2 z=$3
		F=$X/$ID
		# the record as the helper wrote it
		# shellcheck disable=SC2086 # four words on purpose (noglob is on)
		set -- $4
		NOW=$2
		[ "$o" = x ] && o=''
		[ "$z" = x ] && z=''
		drec "$ID" "$1" "$o" "$z" "$3" "$4"
		d=$DONE_RECORD
		wake
		# (a record whose name did not go into place is not reported)
		[ -e "$F.done" ] || d=""
		# output up to 1 MiB a stream goes inline, framed by its length; beyond that the
		# client reads it with watch
		if num "$o" && [ "$o" -gt 0 ] && [ "$o" -le 1048576 ]; then
			say "=$ID" out "$o"
			fl
			head -c "$o" "$F/out"
		else
			o=0
		fi
		if num "$z" && [ "$z" -gt 0 ] && [ "$z" -le 1048576 ]; then
			say "=$ID" err "$z"
			fl
			head -c "$z" "$F/err"
		else
			z=0
		fi
		say "=$ID" sizes "out=$o err=$z"
		[ -n "$d" ] && say "=$ID" 'done' "$d"
		say "=$ID" end
		UNANSWERED=$((UNANSWERED - 1))
	}
	# wl N ID: waiter N of ID is no longer running (only an entry that is there is taken out)
	wl() {
		case $WAITERS in
		*" $1:$2 "* | *" $1:$2") WAITERS="${WAITERS%%" $1:$2"*}${WAITERS#*" $1:$2"}" ;;
		esac
	}
	# waiter number $1 (PID p_) of execution $2 ended without reporting (killed): the exit status
	# is lost. F/lost makes every reader's liveness check say "dead", as for a dead supervisor
	# (the command itself may still run); the client hears "live dead" and no finish record.
	lost() {
		unset "PID_w$1"
		wait "$p_" 2>/dev/null
		wl "$1" "$2"
		F=$X/$2
		now
		put "$F/lost" "v=1 id=$2 lost_at=$NOW waiter_pid=$p_" 2>/dev/null || true >"$F/lost"
		wake
		say "=$2" live dead
		say "=$2" end
		UNANSWERED=$((UNANSWERED - 1))
	}
	# drop NAME ID: take ID's entry (ID:...) out of the list in the variable NAME; x_ is what
	# followed "ID:" in it (empty if there was none)
	drop() {
		o_='' x_=''
		eval "o_=\$$1"
		case $o_ in
		*" $2:"*)
			h_=${o_%%" $2:"*} t_=${o_#*" $2:"}
			x_=${t_%% *}
			case $t_ in
			*" "*) t_=" ${t_#* }" ;;
			*) t_='' ;;
			esac
			eval "$1=\$h_\$t_"
			;;
		esac
	}
	# hl b|f N: helper N (batch or finish) is running; if it has ended (a zombie) or is gone,
	# ask again behind whatever it may have written (a "x" comes after its "y" or "z"); the
	# same for the reader (hl r 0) and its "q"
	hl() {
		eval "p_=\$PID_$1$2"
		if ! pst "$p_" || [ "$STATE" = Z ]; then
			echo "x $1 $2" >&4
		fi
	}
	# The batch helper N ended without its "y" (killed: someone's kill, the OOM killer). Its
	# requests not reported on (BATCH_UNREPORTED) are settled here. First a fence: its stage
	# is renamed, and each request's command file removed from the session directory, so that
	# a link or move it had begun (its child may outlive it) can no longer put anything in
	# place. Then, for each: this batch's guard (the very file it staged: an earlier
	# execution of the same ID, even in this session, is another's) with its stage and
	# command in place is flushed and started (REQUESTS_TO_START), as the helper would have;
	# this batch's guard without them is given back (nothing ran); another's guard is
	# "exists"; no guard, nothing ran.
	rebatch() {
		BATCH_STAGE=$SESSION_DIR/b/$1
		if [ -d "$BATCH_STAGE" ] && mv "$BATCH_STAGE" "$BATCH_STAGE.x" 2>/dev/null; then
			BATCH_STAGE=$BATCH_STAGE.x
		fi
		REQUESTS_TO_START=''
		set --
		for r in $BATCH_UNREPORTED; do
			i=${r%%:*}
			rm -f "$SESSION_DIR/$i.cmd"
			# shellcheck disable=SC3013 # -ef: bash, dash and busybox have it
			if [ "$BATCH_STAGE/$i.start" -ef "$X/$i.start" ]; then
				if [ -d "$X/$i" ] && [ -e "$X/$i.cmd" ]; then
					REQUESTS_TO_START="$REQUESTS_TO_START $r"
					set -- "$@" "$X/$i.start"
					continue
				fi
				if ! unguard "$i"; then
					answer "$i" refused "the host's batch helper was killed; nothing ran; the start guard could not be given back"
					continue
				fi
			elif [ -e "$X/$i.start" ]; then
				answer "$i" exists
				continue
			fi
			answer "$i" refused "the host's batch helper was killed; nothing ran"
		done
		BATCH_UNREPORTED=''
		[ $# -gt 0 ] && fsync "$X" "$@"
		for r in $REQUESTS_TO_START; do
			answer "${r%%:*}" started
			start "${r%%:*}" "${r##*:}"
		done
	}
	# helper PID (named by its report): reap it
	reap() {
		eval "p_=\$PID_$1"
		unset "PID_$1"
		wait "$p_" 2>/dev/null
		HELPERS=$((HELPERS - 1))
	}
	while :; do
		if [ -n "$READER_GONE" ] && [ "$UNANSWERED" -eq 0 ] && [ "$HELPERS" -eq 0 ] && [ -z "$SENTINEL_QUEUED" ]; then
			break
		fi
		read -r k a b c d <&4 || break
		case $k in
		r)
			REQUESTS="$REQUESTS $a:$b:$c:$d"
			REQUESTS_COUNT=$((REQUESTS_COUNT + 1))
			;;
		w) answer "$a" refused "cannot store the command in $SESSION_DIR (disk full?)" ;;
		g)
			# confirmed: these go with the next batch helper; the reader may read on
			# while fewer than 64 wait here
			CONFIRMED="$CONFIRMED$REQUESTS" REQUESTS=''
			CONFIRMED_COUNT=$((CONFIRMED_COUNT + REQUESTS_COUNT)) REQUESTS_COUNT=0
			if [ "$CONFIRMED_COUNT" -lt 64 ]; then
				echo k >&5
			else
				READER_WAITS=1
			fi
			;;
		f)
			EXITED="$EXITED $a:$b"
			eval "p_=\$PID_w$c"
			unset "PID_w$c"
			wait "$p_" 2>/dev/null
			wl "$c" "$a"
			;;
		t)
			# a waiter that has ended (a zombie) or is gone: ask again behind whatever it
			# may have written (a "u" comes after its "f", if it wrote one)
			for r in $WAITERS; do
				eval "p_=\$PID_w${r%%:*}"
				if ! pst "$p_" || [ "$STATE" = Z ]; then
					echo "u ${r%%:*} ${r#*:}" >&4
				fi
			done
			[ -n "$BATCH_RUNNING" ] && hl b "$nb"
			[ -z "$READER_GONE" ] && hl r 0
			[ -n "$FINISH_RUNNING" ] && hl f "$nf"
			;;
		u)
			eval "p_=\${PID_w$a:-}"
			[ -n "$p_" ] && lost "$a" "$b"
			;;
		q)
			READER_GONE=1
			[ -n "$a" ] && say_error "$a $b $c $d"
			;;
		s) SENTINEL_QUEUED='' ;;
		v)
			drop BATCH_UNREPORTED "$a"
			answer "$a" "$b" "$c${d:+ $d}"
			;;
		a)
			# (x_: LEN:DIGEST:TIMEOUT of the request; c: the batch's NOW)
			drop BATCH_UNREPORTED "$a"
			START_RECORD=''
			if [ -n "$x_" ]; then
				NOW=$c
				l=${x_#*:}
				srec "$a" "${x_%%:*}" "${l%%:*}" "$b"
			fi
			answer "$a" started "" "$START_RECORD"
			start "$a" "$b"
			;;
		o)
			drop FINISH_UNREPORTED "$a"
			finished "$a" "$b" "$c" "$d"
			;;
		y)
			reap "b$a"
			BATCH_RUNNING='' BATCH_UNREPORTED=''
			;;
		z)
			reap "f$a"
			# (what it did not report, a record the home refused, goes to the next one)
			FINISH_RUNNING='' EXITED="$EXITED$FINISH_UNREPORTED" FINISH_UNREPORTED=''
			;;
		x)
			# a helper ended without its last report: settle what it left (a finish group
			# goes to the next finish helper, which writes the records again in place)
			p_=''
			case $a in b | f) num "$b" && eval "p_=\${PID_$a$b:-}" ;; esac
			# the reader, killed before its "q": read no more, as after one
			if [ "$a" = r ] && [ -z "$READER_GONE" ]; then
				READER_GONE=1
				say_error "the session's reader was killed; nothing more is read"
			fi
			if [ -n "$p_" ]; then
				reap "$a$b"
				if [ "$a" = b ]; then
					BATCH_RUNNING=''
					rebatch "$b"
				else
					FINISH_RUNNING=''
					EXITED="$EXITED$FINISH_UNREPORTED" FINISH_UNREPORTED=''
				fi
			fi
			;;
		esac
		# Take what is queued now as one batch: a sentinel through our own queue comes back
		# after every line written before it. Then write what was gathered.
		if [ "$k" != s ]; then
			[ -n "$SENTINEL_QUEUED" ] || {
				echo s >&4
				SENTINEL_QUEUED=1
			}
			continue
		fi
		fl
		# (one finish helper at a time: what ends meanwhile waits for the next)
		if [ -n "$EXITED" ] && [ -z "$FINISH_RUNNING" ]; then
			FINISH_RUNNING=1
			nf=$((nf + 1))
			(
				exec 5>&-
				finish
				echo "z $nf" >&4
			) </dev/null >/dev/null 2>&1 &
			eval "PID_f$nf=\$!"
			HELPERS=$((HELPERS + 1))
			FINISH_UNREPORTED=$EXITED EXITED=''
		fi
		# (one batch helper at a time: what is confirmed meanwhile goes into the next)
		if [ -n "$CONFIRMED" ] && [ -z "$BATCH_RUNNING" ]; then
			BATCH_RUNNING=1
			nb=$((nb + 1))
			# (batch takes REQUESTS; what REQUESTS holds now is not confirmed yet and stays:
			# UNCONFIRMED keeps it meanwhile)
			UNCONFIRMED=$REQUESTS REQUESTS=$CONFIRMED
			(
				exec 5>&-
				batch
				echo "y $nb" >&4
			) </dev/null >/dev/null 2>&1 &
			eval "PID_b$nb=\$!"
			HELPERS=$((HELPERS + 1))
			BATCH_UNREPORTED=$CONFIRMED REQUESTS=$UNCONFIRMED CONFIRMED='' CONFIRMED_COUNT=0
			if [ -n "$READER_WAITS" ]; then
				READER_WAITS=''
				echo k >&5
			fi
		fi
	done
	kill_pids TERM "$TICKER_PID"
	# requests never followed by "g" were not started
	rm -rf "$SESSION_DIR"
	# the last line, with what is still gathered (say gathers here)
	say end
	fl
	exit 0
	;;
# SESSION ARM ENDS
esac
say end
}
