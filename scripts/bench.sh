#!/usr/bin/env bash
# Side-by-side benchmark: worktreefs against plain git on the same disk, in one run.
#
#   scripts/bench.sh [--files N] [--repo PATH] [--runs R] [--keep]
#
# Generates a synthetic repository of N files (default 100000; cached under
# $BENCH_DIR, default /tmp/worktreefs-bench) or uses --repo PATH, mounts worktreefs with its
# own state directory, and measures, alternating the two sides in each round:
#   create:  `worktreefs new` vs `git worktree add`
#   status:  `git status` in a fresh view vs in a real checkout: first run, warm, and
#            with the kernel's caches dropped before each side (root only)
#   leases:  reading $READ_FILES files (default 20000) in a mount with process-lease
#            tracking vs one without (--no-lease-tracking): the ratio is on/off
# Prints each median and the ratio. Always unmounts, even on failure.
set -euo pipefail
trap 'echo "bench.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

FILES=100000
REPO=""
RUNS=5
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES="$2"; shift 2 ;;
    --repo) REPO="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/worktreefs-bench}
mkdir -p "$BENCH_DIR"
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.com
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.com

echo "building worktreefs (release)..." >&2
(cd "$top" && cargo build --release --quiet)
BIN="$top/target/release/worktreefs"

if [ -z "$REPO" ]; then
  REPO="$BENCH_DIR/repo-$FILES"
  if [ ! -f "$REPO/.bench-complete" ]; then
    echo "generating a synthetic repository of $FILES files in $REPO..." >&2
    rm -rf "$REPO"
    git init -q -b main "$REPO"
    python3 "$top/scripts/gen_repo.py" "$FILES" | git -C "$REPO" fast-import --quiet
    git -C "$REPO" gc -q --aggressive --prune=now 2>/dev/null || git -C "$REPO" repack -adq
    touch "$REPO/.bench-complete"
  fi
fi
REPO=$(cd "$REPO" && pwd)
nfiles=$(git -C "$REPO" ls-tree -r --name-only HEAD | wc -l)

RUN_DIR=$(mktemp -d "$BENCH_DIR/run.XXXXXX")
STATE="$RUN_DIR/state"
MNT="$RUN_DIR/mnt"
CHECKOUTS="$RUN_DIR/checkouts"
mkdir -p "$MNT" "$CHECKOUTS"
export WORKTREEFS_STATE_DIR="$STATE"

cleanup() {
  set +e
  if grep -q " $MNT fuse" /proc/mounts; then
    "$BIN" unmount >/dev/null 2>&1 || umount -l "$MNT"
  fi
  for d in "$CHECKOUTS"/*; do
    [ -d "$d" ] && git -C "$REPO" worktree remove --force "$d" >/dev/null 2>&1
  done
  # worktreefs entries are locked (and their cleanup is not this script's job): drop
  # them, then every branch this run made.
  for d in "$REPO"/.git/worktrees/wtfs-bench-*; do
    [ -d "$d" ] && rm -rf "$d"
  done
  git -C "$REPO" worktree prune
  for b in $(git -C "$REPO" for-each-ref --format='%(refname:short)' 'refs/heads/bench-*'); do
    git -C "$REPO" branch -q -D "$b" >/dev/null 2>&1
  done
  # The fsmonitor include worktreefs added (what `worktreefs repo remove` would undo).
  gd=$(git -C "$REPO" rev-parse --absolute-git-dir)
  git -C "$REPO" config --remove-section "includeIf.gitdir:$gd/worktrees/wtfs-*" >/dev/null 2>&1
  rm -rf "$gd/worktreefs"
  if [ "$KEEP" = 0 ]; then rm -rf "$RUN_DIR"; fi
}
trap cleanup EXIT

"$BIN" repo add "$REPO" --name bench >/dev/null
# A long grace period: the worktrees measured here must not start cleanup between rows.
"$BIN" mount "$MNT" --linger 3600 >/dev/null

now_ns() { date +%s%N; }
# time_cmd OUTFILE CMD...: appends the wall time in ms of CMD to OUTFILE.
time_cmd() {
  local out="$1"; shift
  local t0 t1
  t0=$(now_ns)
  if ! "$@" >/dev/null 2>"$RUN_DIR/last-error"; then
    echo "bench.sh: '$*' failed:" >&2
    cat "$RUN_DIR/last-error" >&2
    exit 1
  fi
  t1=$(now_ns)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", (b - a) / 1000000 }' >> "$out"
}
median() { sort -n "$1" | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

echo "repository: $REPO ($nfiles files), $RUNS runs per row, $(nproc) cores" >&2

# First worktree at this commit builds the index once (cached afterwards): report it apart.
time_cmd "$RUN_DIR/create-first" "$BIN" new bench/bench-first

for i in $(seq 1 "$RUNS"); do
  time_cmd "$RUN_DIR/create-wtfs" "$BIN" new "bench/bench-$i"
  time_cmd "$RUN_DIR/create-git" git -C "$REPO" worktree add -q -b "bench-git-$i" "$CHECKOUTS/wt-$i" HEAD
done

# git status: one fresh view and one real checkout per round, each measured on first use
# and again warm.
for i in $(seq 1 "$RUNS"); do
  time_cmd "$RUN_DIR/status-wtfs-first" git -C "$MNT/bench/bench-$i" status --porcelain
  time_cmd "$RUN_DIR/status-git-first" git -C "$CHECKOUTS/wt-$i" status --porcelain
  time_cmd "$RUN_DIR/status-wtfs" git -C "$MNT/bench/bench-$i" status --porcelain
  time_cmd "$RUN_DIR/status-git" git -C "$CHECKOUTS/wt-$i" status --porcelain
done

# Cold caches: the kernel's page, dentry and inode caches dropped before each side (the
# daemon keeps its own memory). Needs root.
cold=0
if [ -w /proc/sys/vm/drop_caches ]; then
  cold=1
  for i in $(seq 1 "$RUNS"); do
    sync; echo 3 > /proc/sys/vm/drop_caches
    time_cmd "$RUN_DIR/status-wtfs-cold" git -C "$MNT/bench/bench-$i" status --porcelain
    sync; echo 3 > /proc/sys/vm/drop_caches
    time_cmd "$RUN_DIR/status-git-cold" git -C "$CHECKOUTS/wt-$i" status --porcelain
  done
fi

clean=$(git -C "$MNT/bench/bench-1" status --porcelain | wc -l)
reads=$(cat "$MNT/.control/stats")

# Removing a clean worktree: worktreefs' cleanup (inspection from the upper layer and the
# object database, then removal) against `git worktree remove` of a checkout. bench-1 is
# kept for the rows below.
for i in $(seq 2 "$RUNS"); do
  time_cmd "$RUN_DIR/remove-wtfs" "$BIN" reclaim "bench/bench-$i"
  time_cmd "$RUN_DIR/remove-git" git -C "$REPO" worktree remove "$CHECKOUTS/wt-$i"
done
# An unmount releases every lease and cleans up what is clean: an untracked file keeps
# bench-1 (retained) across the remounts below.
sh -c "echo keep > \"$MNT/bench/bench-1/.bench-keep\""

# What process-lease tracking costs a read-heavy run: the same files read in a fresh mount
# with tracking and without (--no-lease-tracking), alternating, blob cache warm.
READ_FILES=${READ_FILES:-20000}
# (Not `ls-tree | head`: with pipefail, head closing the pipe early fails the script.)
git -C "$REPO" ls-tree -r --name-only HEAD > "$RUN_DIR/alltracked"
sed -n "1,${READ_FILES}p" "$RUN_DIR/alltracked" > "$RUN_DIR/readlist"
read_all() { (cd "$MNT/bench/bench-1" && xargs -a "$RUN_DIR/readlist" cat > /dev/null); }
remount() { "$BIN" unmount >/dev/null; "$BIN" mount "$MNT" --linger 3600 "$@" >/dev/null; }
read_all  # fill the blob cache
for i in $(seq 1 "$RUNS"); do
  remount
  time_cmd "$RUN_DIR/read-tracked" read_all
  remount --no-lease-tracking
  time_cmd "$RUN_DIR/read-untracked" read_all
done
remount

printf '\n%-34s %12s %12s %10s\n' "row" "worktreefs" "git" "ratio"
row() {
  local name="$1" a b
  a=$(median "$2"); b=$(median "$3")
  printf '%-34s %10s ms %10s ms %10s\n' "$name" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", a / b }')"
}
row "create a worktree" "$RUN_DIR/create-wtfs" "$RUN_DIR/create-git"
printf '%-34s %10s ms\n' "create, first at a commit" "$(median "$RUN_DIR/create-first")"
row "git status, fresh (first run)" "$RUN_DIR/status-wtfs-first" "$RUN_DIR/status-git-first"
row "git status, fresh (warm)" "$RUN_DIR/status-wtfs" "$RUN_DIR/status-git"
row "read $(wc -l < "$RUN_DIR/readlist") files, leases on vs off" "$RUN_DIR/read-tracked" "$RUN_DIR/read-untracked"
[ -s "$RUN_DIR/remove-wtfs" ] && row "remove a clean worktree" "$RUN_DIR/remove-wtfs" "$RUN_DIR/remove-git"
if [ "$cold" = 1 ]; then
  row "git status, kernel caches dropped" "$RUN_DIR/status-wtfs-cold" "$RUN_DIR/status-git-cold"
else
  echo "git status, kernel caches dropped: skipped (needs root to write /proc/sys/vm/drop_caches)"
fi
echo
echo "fresh view clean: $([ "$clean" = 0 ] && echo yes || echo "NO ($clean lines)")"
echo "daemon counters: $reads"
