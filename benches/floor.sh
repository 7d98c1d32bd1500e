# floor.sh DIR TOTAL K [WAITERS [KEEP]]: the cheapest work any POSIX sh implementation of the marker contract
# must do for TOTAL dispatches of `true`, K at a time, timed on the host as one exec. It is
# deliberately optimistic, so that a rate it cannot reach is out of reach for the real protocol:
# - no request is read and no reply written (the SSH channel costs nothing here);
# - K dispatches share ONE start guard `ln` (POSIX `ln FILE... DIR`), ONE flush of their
#   started records and names, ONE `wc` of their outputs that are not empty (none for `true`),
#   ONE flush of their finish records with those outputs, ONE `ln` of those into place and
#   ONE flush of the directory; a flush is `sync FILE...` of the files and directory it must
#   make durable, as in cairn (not syncfs, which also waits for every other writer's dirty
#   data on the file system: RESULTS.md measures it);
# - each command costs only what the contract cannot share: a fork (the supervisor must learn
#   its exit status), `setsid` (its own session, for cancel and timeouts) and the login shell
#   that runs it (as for the plain exec it is compared with); the supervisor waits for them in
#   start order, which a real one cannot (commands end in any order: it needs a waiter each).
# With WAITERS=1 each command runs under a waiter subshell that stores its exit status as it
# ends, as a supervisor that learns each status when it happens must (one more fork each):
# the floor for a supervisor in POSIX sh, which has no "wait for any child".
# With KEEP=1 DIR is left in place for the caller to remove later: on a file system that keeps
# recently deleted inodes out of new files (ext4 without a journal) the deletions would slow
# whatever creates files next (RESULTS.md measures it).
# Prints "TOTAL START END" (seconds since the epoch, from GNU date +%s.%N) when done.
d=$1 n=$2 k=$3 wt=${4:-0} keep=${5:-0}
set -f
rm -rf "$d"
mkdir -p "$d/x" "$d/s" || exit 1
printf 'true\n' >"$d/cmd"
# one: the command of stage $f, in the subshell that calls it
one() {
	cd "${HOME:-/}" || exit 126
	# shellcheck disable=SC2016 # expanded by the login shell
	exec setsid "${SHELL:-/bin/sh}" -c '. "$0"' "$d/cmd" </dev/null >"$f.out" 2>"$f.err"
}
t0=$(date +%s.%N)
i=0
while [ "$i" -lt "$n" ]; do
	set --
	j=0
	while [ "$j" -lt "$k" ]; do
		f=$d/s/e$i.$j
		printf 'v=1 id=e%s.%s len=5 sup_pid=%s\n' "$i" "$j" "$$" >"$f.start"
		: >"$f.out"
		: >"$f.err"
		set -- "$@" "$f"
		j=$((j + 1))
	done
	s=
	for f; do s="$s $f.start"; done
	# shellcheck disable=SC2086 # the list of staged records (noglob is on)
	ln $s "$d/x/" || exit 1
	# shellcheck disable=SC2086
	sync $s "$d/x" || exit 1
	p=
	for f; do
		if [ "$wt" = 1 ]; then
			(
				(one)
				echo "$?" >"$f.status"
			) &
		else
			(one) &
		fi
		p="$p $!"
	done
	for q in $p; do
		wait "$q" || exit 1
	done
	w=
	for f; do
		[ -s "$f.out" ] && w="$w $f.out"
		[ -s "$f.err" ] && w="$w $f.err"
	done
	# shellcheck disable=SC2086
	[ -z "$w" ] || wc -c $w >/dev/null || exit 1
	r=
	for f; do
		printf 'v=1 status=0 out=0 err=0\n' >"$f.done"
		r="$r $f.done"
	done
	# (the outputs that are not empty with the records that count them)
	# shellcheck disable=SC2086
	sync $w $r || exit 1
	# shellcheck disable=SC2086
	ln $r "$d/x/" || exit 1
	sync "$d/x" || exit 1
	i=$((i + k))
done
t1=$(date +%s.%N)
[ "$keep" = 1 ] || rm -rf "$d"
echo "$n $t0 $t1"
