#!/usr/bin/env bash
# Side-by-side benchmark: worktreefs against plain git on the same disk, in one run.
#
#   scripts/bench.sh [--files N] [--repo PATH] [--runs R] [--keep] [--quick]
#
# Generates a synthetic repository of N files (default 100000; cached under
# $BENCH_DIR, default /tmp/worktreefs-bench) or uses --repo PATH, mounts worktreefs with its
# own state directory, and measures, alternating the two sides in each round:
#   create:  `worktreefs new` vs `git worktree add`
#   status:  `git status` in a fresh view vs in a real checkout: first run, warm, and
#            with the kernel's caches dropped before each side (root only)
#   leases:  reading $READ_FILES files (default 20000) in a mount with process-lease
#            tracking vs one without (--no-lease-tracking): the ratio is on/off
#   yield:   over io_uring, an uncached stat loop, that warm read and Python writing 2,000
#            small files in a mount whose queue threads yield their CPU to the caller vs
#            one with --yield-cpu off: the ratio is on/off
#   files:   against a real checkout on the same disk, and against kernel overlayfs and
#            fuse-overlayfs over a checkout where they are available: git status after
#            touching 100 files, reading every file cold and warm, a metadata walk,
#            writing 10,000 small files, sequential write and read of $SEQ_MB MiB, a
#            compile of a generated C project (make -j2), eight worktrees used at once
#   deps:    `npm ci` of a typical web app's lockfile (470 packages, npm cache filled once)
#            and `pip install --no-index` of 42 pinned wheels (a wheelhouse downloaded
#            once), in a view against a checkout (scripts/bench-data)
#   checkout: `git checkout` to a commit that differs in $CHECKOUT_FILES files (default
#            4000) and back, in a view against a checkout
#   checkpoints: taking one (the daemon's time); a rewind of 1,000 changed files; writing
#            10,000 small files, and rewriting $CP_BIG upper files of 1 MiB in place, each
#            with a checkpoint taken before against a view with none; reading every file
#            and a find with 50 checkpoints kept against none; the disk a checkpoint uses;
#            what syncing each record would cost
#   memory:  the daemon's peak RSS with $RSS_WORKTREES worktrees, 10% of each one's files read;
#            ten warm worktrees against ten plain ones of as many files, after a find
#   warm:    `new --warm` with $WARM_FILES inherited files (30,000, 300 MB) against a plain
#            `new`, `cp -a` and `cp --reflink=auto` of them; the first build in a warm view
#            against a cold one
# --quick: 2,000 files, one run per row, 128 MiB, 10 worktrees for the memory row (about
# four minutes). Prints each median and the ratio. Always unmounts, even on failure.
set -euo pipefail
trap 'echo "bench.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

FILES=100000
REPO=""
RUNS=5
KEEP=0
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES="$2"; shift 2 ;;
    --repo) REPO="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$QUICK" = 1 ]; then
  FILES=2000; RUNS=1; SEQ_MB=${SEQ_MB:-128}; RSS_WORKTREES=${RSS_WORKTREES:-10}; IO_RUNS=1
  CHECKOUT_FILES=${CHECKOUT_FILES:-400}; WARM_FILES=${WARM_FILES:-2000}; CP_BIG=${CP_BIG:-100}
fi
CP_BIG=${CP_BIG:-1000}
SEQ_MB=${SEQ_MB:-1024}
CHECKOUT_FILES=${CHECKOUT_FILES:-4000}
RSS_WORKTREES=${RSS_WORKTREES:-100}
IO_RUNS=${IO_RUNS:-3}
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
# For the checkout row: a commit beside HEAD that changes the first $CHECKOUT_FILES files
# (made once per repository and size; not a bench-* branch, which cleanup deletes).
OTHER="wtfs-bench-other-$CHECKOUT_FILES"
if ! git -C "$REPO" rev-parse -q --verify "refs/heads/$OTHER" >/dev/null; then
  # (Through a file: with pipefail, head closing the pipe early would fail the script.)
  git -C "$REPO" ls-tree -r --name-only HEAD > "$BENCH_DIR/.tracked-$$"
  head -n "$CHECKOUT_FILES" "$BENCH_DIR/.tracked-$$" |
    python3 -c '
import sys
head, ref = sys.argv[1], sys.argv[2]
out = sys.stdout.buffer
msg = b"bench: another version of some files\n"
out.write(b"commit refs/heads/%s\ncommitter bench <bench@example.com> 1700000000 +0000\n" % ref.encode())
out.write(b"data %d\n%s" % (len(msg), msg))
out.write(b"from %s\n" % head.encode())
for n, path in enumerate(sys.stdin.buffer.read().splitlines()):
    data = b"changed for the checkout row, %d\n" % n
    out.write(b"M 100644 inline %s\ndata %d\n%s\n" % (path, len(data), data))
' "$(git -C "$REPO" rev-parse HEAD)" "$OTHER" | git -C "$REPO" fast-import --quiet
fi

RUN_DIR=$(mktemp -d "$BENCH_DIR/run.XXXXXX")
STATE="$RUN_DIR/state"
MNT="$RUN_DIR/mnt"
CHECKOUTS="$RUN_DIR/checkouts"
mkdir -p "$MNT" "$CHECKOUTS"
export WORKTREEFS_STATE_DIR="$STATE"

# Takes out what registering REPO with worktreefs added to it (what `worktreefs repo
# remove` would undo): the fsmonitor include and files.
unregister_leftovers() {
  local gd
  gd=$(git -C "$1" rev-parse --absolute-git-dir)
  git -C "$1" config --remove-section "includeIf.gitdir:$gd/worktrees/wtfs-*" >/dev/null 2>&1
  rm -rf "$gd/worktreefs"
}
# A side repository of the bench (the C project, the dependencies, the warm source) as it
# was made: its worktree entries, and every branch but main and those named, gone.
reset_side_repo() { # reset_side_repo DIR [BRANCH...]
  local dir="$1" d b; shift
  for d in "$dir"/.git/worktrees/*; do [ -d "$d" ] && rm -rf "$d"; done
  git -C "$dir" worktree prune
  for b in $(git -C "$dir" for-each-ref --format='%(refname:short)' 'refs/heads/'); do
    case " main $* " in *" $b "*) ;; *) git -C "$dir" branch -q -D "$b" >/dev/null 2>&1 ;; esac
  done
  unregister_leftovers "$dir"
}
cleanup() {
  set +e
  for o in "$RUN_DIR/ovl" "$RUN_DIR/fovl" "$RUN_DIR/c-overlayfs" "$RUN_DIR/c-fuse-overlayfs"; do
    if grep -q " $o " /proc/mounts; then umount "$o" 2>/dev/null || umount -l "$o"; fi
  done
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
  git -C "$REPO" worktree remove --force "$RUN_DIR/lower" >/dev/null 2>&1
  if [ -d "${CREPO:-/nonexistent}" ]; then
    reset_side_repo "$CREPO"
    make -C "$CREPO" -s clean >/dev/null 2>&1
  fi
  [ -d "${DREPO:-/nonexistent}" ] && reset_side_repo "$DREPO"
  [ -d "${WREPO:-/nonexistent}" ] && reset_side_repo "$WREPO" tracked
  git -C "$REPO" worktree prune
  for b in $(git -C "$REPO" for-each-ref --format='%(refname:short)' 'refs/heads/bench-*'); do
    git -C "$REPO" branch -q -D "$b" >/dev/null 2>&1
  done
  unregister_leftovers "$REPO"
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
# Each creation starts with nothing dirty to write back: a worktreefs creation fsyncs its
# index, and would otherwise wait behind the 390 MB the checkout before it left in the
# page cache (as the checkout would behind the index, on a smaller scale).
sync
time_cmd "$RUN_DIR/create-first" "$BIN" new bench/bench-first

for i in $(seq 1 "$RUNS"); do
  sync
  time_cmd "$RUN_DIR/create-wtfs" "$BIN" new "bench/bench-$i"
  sync
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

# A metadata walk of a fresh worktree: `ls -lR` in a view nobody has listed or stat'ed
# (git status above answered from the index and the fsmonitor) against the checkout just
# made. This is where READDIRPLUS counts: each listing brings its entries' attributes.
for i in $(seq 1 "$RUNS"); do
  time_cmd "$RUN_DIR/lslr-fresh-wtfs" sh -c "cd '$MNT/bench/bench-$i' && ls -lR"
  time_cmd "$RUN_DIR/lslr-fresh-git" sh -c "cd '$CHECKOUTS/wt-$i' && ls -lR"
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
# What READDIRPLUS does to a first walk: after a remount the kernel knows nothing of the
# view; `find` (names only) and `ls -lR` (names and attributes) with listings that bring
# their entries' attributes and without (--no-readdirplus), alternating.
first_walk() { (cd "$MNT/bench/bench-1" && $1 > /dev/null); }
walk_plus() { # walk_plus plus|noplus: both first walks after a remount of that kind
  if [ "$1" = plus ]; then remount; else remount --no-readdirplus; fi
  time_cmd "$RUN_DIR/find-$1" first_walk "find . -type f"
  if [ "$1" = plus ]; then remount; else remount --no-readdirplus; fi
  time_cmd "$RUN_DIR/lslr-$1" first_walk "ls -lR"
}
for i in $(seq 1 "$RUNS"); do
  # Which side goes first alternates from run to run.
  if [ $((i % 2)) = 1 ]; then walk_plus plus; walk_plus noplus; else walk_plus noplus; walk_plus plus; fi
done
# The round trip on each transport: `stat` of the .control directory, whose attributes
# and entry the kernel never caches (a LOOKUP and a GETATTR each), 20,000 times, in a
# mount over io_uring (`--uring auto`: where the kernel offers it) and one over /dev/fuse.
STATS_N=${STATS_N:-20000}
stat_loop() { python3 -c 'import os, sys
p = sys.argv[1]
for _ in range(int(sys.argv[2])): os.stat(p)' "$MNT/.control" "$STATS_N"; }
for i in $(seq 1 "$RUNS"); do
  remount --uring auto
  time_cmd "$RUN_DIR/rt-auto" stat_loop
  rt_transport=$(grep -o '"transport":"[^"]*"' "$MNT/.control/stats" | cut -d'"' -f4)
  remount --uring off
  time_cmd "$RUN_DIR/rt-off" stat_loop
done
# What yielding the CPU to the caller does over io_uring (fuse/yielding.rs): the stat loop,
# the warm read of the files above and Python writing 2,000 small files, in a mount that
# yields and one with --yield-cpu off, which side goes first alternating by run. Each
# write goes to a directory of its own, removed only after the last run: creates timed
# right after 2,000 deletes run slower by how recent the deletes are (see the small-file
# row below), which swung this row both ways.
write_some() { python3 - "$MNT/bench/bench-1/.bench-yield-$1" <<'PY'
import os, sys
root = sys.argv[1]
os.mkdir(root)
for f in range(2000):
    with open(os.path.join(root, f"f{f}.txt"), "wb") as fh:
        fh.write(b"x" * 1024)
PY
}
yield_side() { # yield_side yield|noyield RUN
  if [ "$1" = yield ]; then
    remount
    yield_on=$(grep -o '"yield_cpu":[a-z]*' "$MNT/.control/stats" | cut -d: -f2)
  else
    remount --yield-cpu off
  fi
  read_all
  time_cmd "$RUN_DIR/yield-stat-$1" stat_loop
  time_cmd "$RUN_DIR/yield-read-$1" read_all
  time_cmd "$RUN_DIR/yield-write-$1" write_some "$1-$2"
}
yield_on=false
for i in $(seq 1 "$RUNS"); do
  if [ $((i % 2)) = 1 ]; then yield_side yield "$i"; yield_side noyield "$i"; else yield_side noyield "$i"; yield_side yield "$i"; fi
done
rm -rf "$MNT/bench/bench-1/".bench-yield-*
remount


# ---------------------------------------------------------------------------------------
# Files: worktreefs against a real checkout, kernel overlayfs and fuse-overlayfs over a
# checkout. Each workload runs in a directory of each kind, alternating, IO_RUNS times.
"$BIN" new bench/bench-io >/dev/null
IO_VIEW="$MNT/bench/bench-io"
IO_CHECKOUT="$CHECKOUTS/wt-1"
LOWER="$RUN_DIR/lower"
git -C "$REPO" worktree add -q --detach "$LOWER" HEAD
trees=(wtfs checkout)
dir_of() {
  case "$1" in
    wtfs) echo "$IO_VIEW" ;; checkout) echo "$IO_CHECKOUT" ;;
    overlayfs) echo "$RUN_DIR/ovl" ;; fuse-overlayfs) echo "$RUN_DIR/fovl" ;;
  esac
}
mkdir -p "$RUN_DIR/ovl" "$RUN_DIR/ovl-up" "$RUN_DIR/ovl-work" "$RUN_DIR/fovl" "$RUN_DIR/fovl-up" "$RUN_DIR/fovl-work"
skipped=()
if mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$RUN_DIR/ovl-up,workdir=$RUN_DIR/ovl-work" "$RUN_DIR/ovl" 2>/dev/null; then
  trees+=(overlayfs)
else
  skipped+=("overlayfs (mount -t overlay failed: needs root and kernel overlayfs)")
fi
if command -v fuse-overlayfs >/dev/null && fuse-overlayfs -o "lowerdir=$LOWER,upperdir=$RUN_DIR/fovl-up,workdir=$RUN_DIR/fovl-work" "$RUN_DIR/fovl" 2>/dev/null; then
  trees+=(fuse-overlayfs)
else
  skipped+=("fuse-overlayfs (not installed or failed to mount; apt-get install fuse-overlayfs)")
fi
drop() { if [ "$cold" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }
git -C "$REPO" ls-tree -r --name-only HEAD > "$RUN_DIR/alltracked"
head -n 100 "$RUN_DIR/alltracked" > "$RUN_DIR/touchlist"
read_every() { (cd "$1" && xargs -d '\n' -a "$RUN_DIR/alltracked" cat > /dev/null); }
walk_find() { (cd "$1" && find . -type f > /dev/null); }
walk_ls() { (cd "$1" && ls -lR > /dev/null); }
status_touched() { (cd "$1" && xargs -d '\n' -a "$RUN_DIR/touchlist" touch && git status --porcelain > /dev/null); }
write_small() {
  python3 - "$1" <<'PY'
import os, sys
root = sys.argv[1]
os.mkdir(root)
data = b"x" * 1024
for d in range(100):
    p = os.path.join(root, f"d{d}")
    os.mkdir(p)
    for f in range(100):
        with open(os.path.join(p, f"f{f}.txt"), "wb") as fh:
            fh.write(data)
PY
}
seq_write() { dd if=/dev/zero of="$1" bs=1M count="$SEQ_MB" status=none; }
seq_read() { dd if="$1" of=/dev/null bs=1M status=none; }
io_row() { # io_row KEY FUNCTION [cold]: FUNCTION DIR, timed in each tree
  local key="$1" fn="$2" mode="${3:-}" t
  for i in $(seq 1 "$IO_RUNS"); do
    for t in "${trees[@]}"; do
      [ "$mode" = cold ] && drop
      time_cmd "$RUN_DIR/$key-$t" "$fn" "$(dir_of "$t")"
    done
  done
}
echo "files: ${trees[*]}; $IO_RUNS runs per row" >&2
read_every "$IO_VIEW"  # the blob cache is filled once, as by any first use
io_row status100 status_touched
io_row readcold read_every cold
io_row readwarm read_every
io_row find walk_find
io_row lslr walk_ls
for i in $(seq 1 "$IO_RUNS"); do
  for t in "${trees[@]}"; do
    d=$(dir_of "$t")
    # Each side starts with no dirty pages of the others' to write back.
    sync
    time_cmd "$RUN_DIR/write10k-$t" write_small "$d/bench-small-$i"
    sync
    time_cmd "$RUN_DIR/seqwrite-$t" seq_write "$d/bench-seq-$i"
    # A warm read of 1 GiB takes about 60 ms on either side: five of them per run, so
    # the median is not at the mercy of one 10 ms hiccup.
    for _ in 1 2 3 4 5; do time_cmd "$RUN_DIR/seqread-$t" seq_read "$d/bench-seq-$i"; done
    # The small files stay until the end of the run: on this machine's ext4 (no journal)
    # the inode allocator skips inodes freed in the last minute, one by one, so deleting
    # 10,000 files here would slow down the next side's creates (by 3-10x, depending on
    # which side deleted last and where), which is what made this row swing.
    rm -f "$d/bench-seq-$i"
  done
done

# Checkpoints (docs/design/checkpoints.md), in two views of their own: bench-cp takes
# them, bench-nocp never does. Each pair of timings alternates the two.
"$BIN" new bench/bench-cp >/dev/null
"$BIN" new bench/bench-nocp >/dev/null
CP_VIEW="$MNT/bench/bench-cp"; NOCP_VIEW="$MNT/bench/bench-nocp"
cp_dir=$("$BIN" list --json | python3 -c 'import json,sys; print([w["id"] for w in json.load(sys.stdin) if w["worktree"] == "bench/bench-cp"][0])')
# The worktree's directory: its upper layer and its checkpoints, a file both hold once.
cp_dir="$STATE/worktrees/$cp_dir"
checkpoint() { "$BIN" checkpoint bench/bench-cp >/dev/null; }
newest_cp() { "$BIN" checkpoints bench/bench-cp --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][-1]["checkpoint"])'; }
for i in $(seq 1 "$IO_RUNS"); do
  # Taking one: the command's wall time, and the daemon's own (its log says).
  time_cmd "$RUN_DIR/cp-take-cli" checkpoint
  # A rewind of 1,000 changed files: tracked files appended to (each copied up, its data
  # kept at the open), then put back.
  checkpoint; to=$(newest_cp)
  (cd "$CP_VIEW" && head -n 1000 "$RUN_DIR/alltracked" | while read -r f; do echo x >> "$f"; done)
  time_cmd "$RUN_DIR/cp-rewind1000" "$BIN" rewind bench/bench-cp --to "$to"
  # The write rows with a checkpoint taken before them.
  sync; checkpoint
  time_cmd "$RUN_DIR/cp-write10k-cp" write_small "$CP_VIEW/small-$i"
  sync
  time_cmd "$RUN_DIR/cp-write10k-none" write_small "$NOCP_VIEW/small-$i"
  sync; checkpoint
  time_cmd "$RUN_DIR/cp-seqwrite-cp" seq_write "$CP_VIEW/seq-$i"
  sync
  time_cmd "$RUN_DIR/cp-seqwrite-none" seq_write "$NOCP_VIEW/seq-$i"
  rm -f "$CP_VIEW/seq-$i" "$NOCP_VIEW/seq-$i"
done
# Rewriting $CP_BIG upper files of 1 MiB in place: each one's data is copied at its first
# open for writing after the checkpoint.
make_big() { mkdir -p "$1/big"; for n in $(seq 1 "$CP_BIG"); do head -c 1048576 /dev/urandom > "$1/big/$n"; done; }
rewrite_big() { for n in $(seq 1 "$CP_BIG"); do dd if=/dev/zero of="$1/big/$n" bs=64K count=16 conv=notrunc status=none; done; }
make_big "$CP_VIEW"; make_big "$NOCP_VIEW"; sync
cp_bytes_before=$(du -sk "$cp_dir" | cut -f1)
for i in $(seq 1 "$IO_RUNS"); do
  checkpoint; sync
  time_cmd "$RUN_DIR/cp-rewrite-cp" rewrite_big "$CP_VIEW"
  sync
  time_cmd "$RUN_DIR/cp-rewrite-none" rewrite_big "$NOCP_VIEW"
done
cp_bytes_after=$(du -sk "$cp_dir" | cut -f1)
# Reads and a find with 50 checkpoints kept (each after one change) against none.
for n in $(seq 1 50); do echo "$n" > "$CP_VIEW/touched"; checkpoint; done
for i in $(seq 1 "$IO_RUNS"); do
  time_cmd "$RUN_DIR/cp-read-cp" read_every "$CP_VIEW"
  time_cmd "$RUN_DIR/cp-read-none" read_every "$NOCP_VIEW"
  time_cmd "$RUN_DIR/cp-find-cp" walk_find "$CP_VIEW"
  time_cmd "$RUN_DIR/cp-find-none" walk_find "$NOCP_VIEW"
done
cp_take_us=$(grep 'checkpoint taken' "$STATE/daemon.log" | grep -o 'took_us=[0-9]*' | cut -d= -f2 | sort -n \
  | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}')
cp_kept=$("$BIN" checkpoints bench/bench-cp --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["checkpoints"]))')
# What covering a power loss would cost (records are not synced): one fdatasync per
# record on the state directory's disk (on ext4 that commits the journal, a kept link
# with it), measured as 1,000 appends of a record's size with O_DSYNC.
probe="$STATE/bench-sync-probe"; rm -f "$probe"
t0=$(date +%s%N)
dd if=/dev/zero of="$probe" bs=64 count=1000 oflag=dsync,append conv=notrunc status=none
t1=$(date +%s%N); rm -f "$probe"
cp_sync_us=$(( (t1 - t0) / 1000000 ))

# A compile: a generated C project of 300 files in its own repository.
CREPO="$BENCH_DIR/cproj"
if [ ! -f "$CREPO/.bench-complete" ]; then
  rm -rf "$CREPO"; mkdir -p "$CREPO/src"
  for n in $(seq 1 300); do
    printf '#include "common.h"\nint f%d(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * %d %% 7; return s; }\n' "$n" "$n" > "$CREPO/src/f$n.c"
  done
  printf '#define N 300\nint f1(int);\n' > "$CREPO/src/common.h"
  printf 'int main(void) { return 0; }\n' > "$CREPO/src/main.c"
  cat > "$CREPO/Makefile" <<'MK'
SRCS := $(wildcard src/*.c)
OBJS := $(SRCS:.c=.o)
CFLAGS := -O2 -Wall
prog: $(OBJS)
	$(CC) -o $@ $^
%.o: %.c src/common.h
	$(CC) $(CFLAGS) -c -o $@ $<
clean:
	rm -f prog $(OBJS)
MK
  printf '*.o\nprog\n' > "$CREPO/.gitignore"
  git -C "$CREPO" init -q -b main && git -C "$CREPO" add -A && git -C "$CREPO" commit -q -m cproj
  touch "$CREPO/.bench-complete"
fi
"$BIN" repo add "$CREPO" --name cbench >/dev/null
"$BIN" new cbench/c >/dev/null
git -C "$CREPO" worktree add -q --detach "$RUN_DIR/cproj-checkout" HEAD
git -C "$CREPO" worktree add -q --detach "$RUN_DIR/cproj-lower" HEAD
cdirs=(wtfs "$MNT/cbench/c" checkout "$RUN_DIR/cproj-checkout")
for o in overlayfs fuse-overlayfs; do
  case " ${trees[*]} " in *" $o "*)
    mkdir -p "$RUN_DIR/c-$o" "$RUN_DIR/c-$o-up" "$RUN_DIR/c-$o-work"
    if [ "$o" = overlayfs ]; then
      mount -t overlay overlay -o "lowerdir=$RUN_DIR/cproj-lower,upperdir=$RUN_DIR/c-$o-up,workdir=$RUN_DIR/c-$o-work" "$RUN_DIR/c-$o"
    else
      fuse-overlayfs -o "lowerdir=$RUN_DIR/cproj-lower,upperdir=$RUN_DIR/c-$o-up,workdir=$RUN_DIR/c-$o-work" "$RUN_DIR/c-$o"
    fi
    cdirs+=("$o" "$RUN_DIR/c-$o") ;;
  esac
done
compile() { make -C "$1" -s -j2 prog >/dev/null; }
for i in $(seq 1 "$IO_RUNS"); do
  for ((k = 0; k < ${#cdirs[@]}; k += 2)); do
    time_cmd "$RUN_DIR/compile-${cdirs[k]}" compile "${cdirs[k+1]}"
    make -C "${cdirs[k+1]}" -s clean >/dev/null
  done
done
for ((k = 2; k < ${#cdirs[@]}; k += 2)); do
  [ "${cdirs[k]}" = checkout ] || umount "${cdirs[k+1]}" 2>/dev/null || umount -l "${cdirs[k+1]}"
done

# Dependencies installed from committed lockfiles, as an agent's first step in a worktree:
# `npm ci` of a typical web app (scripts/bench-data/webapp: 470 packages) from an npm cache
# filled once, and `pip install --no-index` of 42 pinned wheels (scripts/bench-data/
# requirements.txt) from a wheelhouse downloaded once; each side starts without them.
# Skipped (said so) where npm, or the first download, is not to be had.
DREPO="$BENCH_DIR/deps"
DDATA="$top/scripts/bench-data"
if ! cmp -s "$DREPO/package-lock.json" "$DDATA/webapp/package-lock.json" \
  || ! cmp -s "$DREPO/requirements.txt" "$DDATA/requirements.txt"; then
  rm -rf "$DREPO"; mkdir -p "$DREPO"
  cp "$DDATA/webapp/package.json" "$DDATA/webapp/package-lock.json" "$DDATA/requirements.txt" "$DREPO/"
  printf 'node_modules/\npydeps/\n' > "$DREPO/.gitignore"
  git -C "$DREPO" init -q -b main && git -C "$DREPO" add -A && git -C "$DREPO" commit -q -m deps
fi
"$BIN" repo add "$DREPO" --name dbench >/dev/null
"$BIN" new dbench/d >/dev/null
git -C "$DREPO" worktree add -q --detach "$RUN_DIR/deps-checkout" HEAD
ddirs=(wtfs "$MNT/dbench/d" checkout "$RUN_DIR/deps-checkout")
NPM_CACHE="$BENCH_DIR/npm-cache"
WHEELS="$BENCH_DIR/wheels"
npm_ok=0
if command -v npm >/dev/null; then
  mkdir -p "$RUN_DIR/npm-fill"
  cp "$DREPO/package.json" "$DREPO/package-lock.json" "$RUN_DIR/npm-fill/"
  if (cd "$RUN_DIR/npm-fill" && npm ci --cache "$NPM_CACHE" --prefer-offline --ignore-scripts \
    --no-audit --no-fund --loglevel=error >/dev/null 2>"$RUN_DIR/npm-fill.err"); then
    npm_ok=1
  else
    echo "bench.sh: npm ci row skipped: filling the cache failed: $(tail -1 "$RUN_DIR/npm-fill.err")" >&2
  fi
  rm -rf "$RUN_DIR/npm-fill"
else
  echo "bench.sh: npm ci row skipped: npm is not installed" >&2
fi
pip_ok=0
if [ -f "$WHEELS/.complete" ] || { mkdir -p "$WHEELS" \
  && python3 -m pip download -q --only-binary=:all: -r "$DREPO/requirements.txt" -d "$WHEELS" \
    >/dev/null 2>"$RUN_DIR/pip-fill.err" && touch "$WHEELS/.complete"; }; then
  pip_ok=1
else
  echo "bench.sh: pip row skipped: downloading the wheels failed: $(tail -1 "$RUN_DIR/pip-fill.err")" >&2
fi
npm_ci() { (cd "$1" && npm ci --cache "$NPM_CACHE" --offline --ignore-scripts --no-audit --no-fund --loglevel=error); }
pip_install() {
  python3 -m pip install -q --no-index --find-links "$WHEELS" -r "$1/requirements.txt" \
    --target "$1/pydeps" --no-warn-conflicts --disable-pip-version-check
}
for i in $(seq 1 "$IO_RUNS"); do
  for ((k = 0; k < ${#ddirs[@]}; k += 2)); do
    d="${ddirs[k+1]}"
    rm -rf "$d/node_modules" "$d/pydeps"
    sync
    [ "$npm_ok" = 1 ] && time_cmd "$RUN_DIR/npmci-${ddirs[k]}" npm_ci "$d"
    [ "$pip_ok" = 1 ] && time_cmd "$RUN_DIR/pipinst-${ddirs[k]}" pip_install "$d"
  done
done

# Eight worktrees used at once by eight processes: git status and reading 2,000 files each.
head -n 2000 "$RUN_DIR/alltracked" > "$RUN_DIR/list2k"
for j in $(seq 1 8); do
  "$BIN" new "bench/bench-par-$j" >/dev/null
  [ -d "$CHECKOUTS/wt-$j" ] || git -C "$REPO" worktree add -q -b "bench-git-par-$j" "$CHECKOUTS/wt-$j" HEAD
done
eight() { # eight wtfs|checkout
  local pids=() j d
  for j in $(seq 1 8); do
    if [ "$1" = wtfs ]; then d="$MNT/bench/bench-par-$j"; else d="$CHECKOUTS/wt-$j"; fi
    (cd "$d" && git status --porcelain > /dev/null && xargs -d '\n' -a "$RUN_DIR/list2k" cat > /dev/null) &
    pids+=($!)
  done
  local rc=0
  for j in "${pids[@]}"; do wait "$j" || rc=1; done
  return $rc
}
for i in $(seq 1 "$IO_RUNS"); do
  time_cmd "$RUN_DIR/eight-wtfs" eight wtfs
  time_cmd "$RUN_DIR/eight-checkout" eight checkout
done

# git checkout to a commit that differs in $CHECKOUT_FILES files and back (a branch switch
# as agents make them), in a fresh view and in a checkout, alternating.
"$BIN" new bench/bench-co >/dev/null
[ -d "$CHECKOUTS/wt-co" ] || git -C "$REPO" worktree add -q --detach "$CHECKOUTS/wt-co" HEAD
base=$(git -C "$REPO" rev-parse HEAD)
switch() { git -C "$1" checkout -q --detach "$OTHER" && git -C "$1" checkout -q --detach "$base"; }
backing_before=$(grep -c "another backing file" "$STATE/daemon.log" 2>/dev/null || true)
for i in $(seq 1 "$RUNS"); do
  time_cmd "$RUN_DIR/checkout-wtfs" switch "$MNT/bench/bench-co"
  time_cmd "$RUN_DIR/checkout-git" switch "$CHECKOUTS/wt-co"
done
backing_after=$(grep -c "another backing file" "$STATE/daemon.log" 2>/dev/null || true)
co_clean=$(git -C "$MNT/bench/bench-co" status --porcelain | wc -l)

# Forking a live worktree with FORK_FILES changed files (`new --from`: a new branch, the
# parent's index, a copy of its upper layer) against `cp -a` of a checkout with the same
# changes (which copies the whole tree, not only what changed).
FORK_FILES=${FORK_FILES:-1000}
sed -n "1,${FORK_FILES}p" "$RUN_DIR/alltracked" > "$RUN_DIR/forklist"
"$BIN" new bench/bench-fork >/dev/null
git -C "$REPO" worktree add -q -b bench-git-fork "$CHECKOUTS/wt-fork" HEAD
change_all() { (cd "$1" && xargs -d '\n' -a "$RUN_DIR/forklist" sh -c 'for f; do echo changed >> "$f"; done' _); }
change_all "$MNT/bench/bench-fork"
change_all "$CHECKOUTS/wt-fork"
for i in $(seq 1 "$RUNS"); do
  sync
  time_cmd "$RUN_DIR/fork-wtfs" "$BIN" new "bench/bench-fork-$i" --from bench-fork
  sync
  time_cmd "$RUN_DIR/fork-cp" cp -a "$CHECKOUTS/wt-fork" "$CHECKOUTS/fork-copy-$i"
  rm -rf "$CHECKOUTS/fork-copy-$i"
done
fork_changed=$(git -C "$MNT/bench/bench-fork-1" status --porcelain | wc -l)

# Warm worktrees: a source checkout whose ignored node_modules/ holds $WARM_FILES files of
# 10 KiB (300 MB at 30,000), in its own repository; the snapshot is taken once, then a
# warm `new` against a plain one, `cp -a` and `cp --reflink=auto` of the same files.
WARM_FILES=${WARM_FILES:-30000}
WREPO="$BENCH_DIR/warmsrc-$WARM_FILES"
if [ ! -f "$WREPO/.bench-complete" ]; then
  rm -rf "$WREPO"; mkdir -p "$WREPO"
  git -C "$WREPO" init -q -b main
  printf 'node_modules/\n' > "$WREPO/.gitignore"; echo '{}' > "$WREPO/package.json"
  git -C "$WREPO" add -A && git -C "$WREPO" commit -q -m warmsrc
  python3 - "$WREPO" "$WARM_FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "node_modules", "pkg%03d" % (i // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.js" % i), "wb") as f:
        f.write((b"// %d\n" % i) + os.urandom(10240 - 16).hex().encode()[: 10240 - 16] + b"\n" * 8)
PY
  # The same files tracked on a side branch: the memory row's plain worktrees show them
  # as base files, so both sides list as many entries.
  # (Through an index of its own: the checkout keeps its files untracked.)
  GIT_INDEX_FILE="$WREPO/.git/index-tracked" git -C "$WREPO" read-tree HEAD
  GIT_INDEX_FILE="$WREPO/.git/index-tracked" git -C "$WREPO" add -f node_modules
  wtree=$(GIT_INDEX_FILE="$WREPO/.git/index-tracked" git -C "$WREPO" write-tree)
  git -C "$WREPO" branch tracked "$(git -C "$WREPO" commit-tree "$wtree" -p HEAD -m tracked)"
  rm -f "$WREPO/.git/index-tracked"
  touch "$WREPO/.bench-complete"
fi
"$BIN" repo add "$WREPO" --name wbench --include node_modules/ >/dev/null
t0=$(now_ns); "$BIN" warm wbench >/dev/null; warm_take=$(( ($(now_ns) - t0) / 1000000 ))
for i in $(seq 1 "$RUNS"); do
  sync
  time_cmd "$RUN_DIR/warm-new" "$BIN" new "wbench/warm-$i" --warm
  sync
  time_cmd "$RUN_DIR/warm-plain" "$BIN" new "wbench/plain-$i"
  sync
  time_cmd "$RUN_DIR/warm-cpa" cp -a "$WREPO/node_modules" "$CHECKOUTS/warm-cpa-$i"
  sync
  time_cmd "$RUN_DIR/warm-reflink" cp -a --reflink=auto "$WREPO/node_modules" "$CHECKOUTS/warm-ref-$i"
  rm -rf "$CHECKOUTS/warm-cpa-$i" "$CHECKOUTS/warm-ref-$i"
done
warm_seen=$(find "$MNT/wbench/warm-1/node_modules" -type f | wc -l)
cmp -s "$MNT/wbench/warm-1/node_modules/pkg000/f00000.js" "$WREPO/node_modules/pkg000/f00000.js" && warm_same=yes || warm_same=NO

# The first build in a warm view (its outputs inherited, newer than the sources: make
# finds them) against a cold one (make builds everything), in the compile row's project.
make -C "$CREPO" -s -j2 prog >/dev/null
"$BIN" repo set cbench --include '*.o' prog >/dev/null
"$BIN" warm cbench >/dev/null
for i in $(seq 1 "$IO_RUNS"); do
  "$BIN" new "cbench/warm-$i" --warm >/dev/null
  "$BIN" new "cbench/cold-$i" >/dev/null
  time_cmd "$RUN_DIR/build-warm" compile "$MNT/cbench/warm-$i"
  time_cmd "$RUN_DIR/build-cold" compile "$MNT/cbench/cold-$i"
done
make -C "$CREPO" -s clean >/dev/null

# Memory: the daemon's peak RSS with many worktrees, 10% of each one's files read.
"$BIN" unmount >/dev/null
"$BIN" mount "$MNT" --linger 3600 >/dev/null
awk 'NR % 10 == 1' "$RUN_DIR/alltracked" > "$RUN_DIR/tenth"
for j in $(seq 1 "$RSS_WORKTREES"); do
  "$BIN" new "bench/bench-rss-$j" >/dev/null
  (cd "$MNT/bench/bench-rss-$j" && xargs -d '\n' -a "$RUN_DIR/tenth" cat > /dev/null)
done
dpid=$(sed -n 1p "$STATE/daemon.lock")
rss_kb=$(awk '/VmHWM/ { print $2 }' "/proc/$dpid/status")
rss_now_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$dpid/status")

# Memory of warm worktrees: ten warm ones, a find over each, against ten plain ones of the
# commit that tracks the same files (as many entries, as base files), each side in a fresh
# mount: what the RSS grew by, and the allocator's bytes in use (`.control/stats`). Both
# read once the daemon is settled: its sweeper hands freed memory back every 5 s. Two
# rounds, in turn (tracked, warm, warm, tracked), the mean per side.
rss_of() { awk '/VmRSS/ { print $2 }' "/proc/$(sed -n 1p "$STATE/daemon.lock")/status"; }
heap_of() { # 0 where the allocator does not say (not glibc)
  local h; h=$(grep -o '"heap_in_use":[0-9]*' "$MNT/.control/stats" | cut -d: -f2 || true)
  echo "${h:-0}"
}
rss_side() { # rss_side warm|tracked ROUND: "RSS-growth heap-growth", KiB
  "$BIN" unmount >/dev/null
  "$BIN" mount "$MNT" --linger 3600 >/dev/null
  sleep 6
  local before heap j; before=$(rss_of); heap=$(heap_of)
  for j in $(seq 1 10); do
    if [ "$1" = warm ]; then "$BIN" new "wbench/mw-$2-$j" --warm >/dev/null
    else "$BIN" new "wbench/mt-$2-$j" --base tracked >/dev/null; fi
  done
  for j in $(seq 1 10); do
    if [ "$1" = warm ]; then (cd "$MNT/wbench/mw-$2-$j" && find . > /dev/null)
    else (cd "$MNT/wbench/mt-$2-$j" && find . > /dev/null); fi
  done
  sleep 6
  # What the resident size is made of at the end, for a row that moves: anonymous pages
  # (the heap, stacks) and mapped files (the binary, pack windows).
  awk -v side="$1 $2" '/RssAnon|RssFile/ { s = s " " $1 " " int($2 / 1024) " MB" } END { print side ":" s }' \
    "/proc/$(sed -n 1p "$STATE/daemon.lock")/status" >> "$RUN_DIR/rss-detail"
  echo "$(( $(rss_of) - before )) $(( ($(heap_of) - heap) / 1024 ))"
}
read -r t1 th1 <<< "$(rss_side tracked 1)"; read -r w1 wh1 <<< "$(rss_side warm 1)"
read -r w2 wh2 <<< "$(rss_side warm 2)"; read -r t2 th2 <<< "$(rss_side tracked 2)"
rss_tracked_kb=$(( (t1 + t2) / 2 )); rss_warm_kb=$(( (w1 + w2) / 2 ))
heap_tracked_kb=$(( (th1 + th2) / 2 )); heap_warm_kb=$(( (wh1 + wh2) / 2 ))

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
row "ls -lR, fresh" "$RUN_DIR/lslr-fresh-wtfs" "$RUN_DIR/lslr-fresh-git"
row "read $(wc -l < "$RUN_DIR/readlist") files, leases on vs off" "$RUN_DIR/read-tracked" "$RUN_DIR/read-untracked"
row "first find, readdirplus on vs off" "$RUN_DIR/find-plus" "$RUN_DIR/find-noplus"
row "first ls -lR, readdirplus on vs off" "$RUN_DIR/lslr-plus" "$RUN_DIR/lslr-noplus"
rt_auto=$(median "$RUN_DIR/rt-auto"); rt_off=$(median "$RUN_DIR/rt-off")
printf '%-34s %10s us %10s us %10s\n' "stat, uncached: $rt_transport vs /dev/fuse" \
  "$(awk -v a="$rt_auto" -v n="$STATS_N" 'BEGIN { printf "%.1f", a * 1000 / n }')" \
  "$(awk -v a="$rt_off" -v n="$STATS_N" 'BEGIN { printf "%.1f", a * 1000 / n }')" \
  "$(awk -v a="$rt_auto" -v b="$rt_off" 'BEGIN { printf "%.4f", a / b }')"
if [ "$yield_on" = true ]; then
  row "stat loop, yielding vs not" "$RUN_DIR/yield-stat-yield" "$RUN_DIR/yield-stat-noyield"
  row "warm read, yielding vs not" "$RUN_DIR/yield-read-yield" "$RUN_DIR/yield-read-noyield"
  row "2,000 small files, yielding vs not" "$RUN_DIR/yield-write-yield" "$RUN_DIR/yield-write-noyield"
else
  echo "yielding vs not: skipped (the mount does not yield here: see the log's FUSE lines)"
fi
[ -s "$RUN_DIR/remove-wtfs" ] && row "remove a clean worktree" "$RUN_DIR/remove-wtfs" "$RUN_DIR/remove-git"
row "git checkout, $CHECKOUT_FILES files, and back" "$RUN_DIR/checkout-wtfs" "$RUN_DIR/checkout-git"
row "fork, $FORK_FILES changed (cp -a)" "$RUN_DIR/fork-wtfs" "$RUN_DIR/fork-cp"
row "warm new, $WARM_FILES files (plain new)" "$RUN_DIR/warm-new" "$RUN_DIR/warm-plain"
row "warm new, $WARM_FILES files (cp -a)" "$RUN_DIR/warm-new" "$RUN_DIR/warm-cpa"
row "warm new, $WARM_FILES files (reflink=auto)" "$RUN_DIR/warm-new" "$RUN_DIR/warm-reflink"
row "first build, warm view (cold view)" "$RUN_DIR/build-warm" "$RUN_DIR/build-cold"
printf '%-34s %10s ms\n' "take the warm snapshot (once)" "$warm_take"
if [ "$cold" = 1 ]; then
  row "git status, kernel caches dropped" "$RUN_DIR/status-wtfs-cold" "$RUN_DIR/status-git-cold"
else
  echo "git status, kernel caches dropped: skipped (needs root to write /proc/sys/vm/drop_caches)"
fi

printf '\n%-34s %12s %12s %9s' "files (ratio: to the checkout)" "worktreefs" "checkout" "ratio"
for t in "${trees[@]:2}"; do printf ' %16s' "$t"; done
echo
frow() { # frow NAME KEY
  local name="$1" key="$2" a b t
  a=$(median "$RUN_DIR/$key-wtfs"); b=$(median "$RUN_DIR/$key-checkout")
  printf '%-34s %9s ms %9s ms %9s' "$name" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
  for t in "${trees[@]:2}"; do
    if [ -s "$RUN_DIR/$key-$t" ]; then
      local c; c=$(median "$RUN_DIR/$key-$t")
      printf ' %8s ms %5s' "$c" "$(awk -v a="$c" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
    else
      printf ' %16s' "-"
    fi
  done
  echo
}
frow "git status, 100 files touched" status100
frow "read every file ($nfiles), cold" readcold
frow "read every file, warm" readwarm
frow "metadata walk: find -type f" find
# The median hides how the walks differ (the first lists every directory through the
# daemon, the second re-reads each directory's attributes, later ones are cached).
echo "  find, each walk in order (ms): worktreefs $(paste -sd' ' "$RUN_DIR/find-wtfs"); checkout $(paste -sd' ' "$RUN_DIR/find-checkout")"
frow "metadata walk: ls -lR" lslr
echo "  ls -lR, each walk in order (ms): worktreefs $(paste -sd' ' "$RUN_DIR/lslr-wtfs"); checkout $(paste -sd' ' "$RUN_DIR/lslr-checkout")"
frow "write 10,000 small files" write10k
frow "sequential write, $SEQ_MB MiB" seqwrite
frow "sequential read, $SEQ_MB MiB, warm" seqread
frow "compile (300 C files, make -j2)" compile
[ "$npm_ok" = 1 ] && frow "npm ci, 470 packages (cached)" npmci
[ "$pip_ok" = 1 ] && frow "pip install --no-index, 42 wheels" pipinst

printf '\n%-34s %12s %12s %9s\n' "checkpoints" "with" "without" "ratio"
crow() { # crow NAME KEY: with a checkpoint (or 50) against none
  local a b; a=$(median "$RUN_DIR/$2-cp"); b=$(median "$RUN_DIR/$2-none")
  printf '%-34s %9s ms %9s ms %9s\n' "$1" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
}
echo "take a checkpoint: the daemon's $cp_take_us us (median of $(grep -c 'checkpoint taken' "$STATE/daemon.log")), the command's $(median "$RUN_DIR/cp-take-cli") ms"
echo "rewind of 1,000 changed files: $(median "$RUN_DIR/cp-rewind1000") ms (the command's wall time)"
crow "write 10,000 small files" cp-write10k
crow "sequential write, $SEQ_MB MiB" cp-seqwrite
crow "rewrite $CP_BIG upper files of 1 MiB" cp-rewrite
crow "read every file, $cp_kept kept" cp-read
crow "find -type f, $cp_kept kept" cp-find
echo "disk the checkpoints took across the rewrites of $CP_BIG MiB ($IO_RUNS checkpoints): $(( (cp_bytes_after - cp_bytes_before) / 1024 )) MiB"
echo "a record synced (power loss is not covered; this is what covering it would add per first change in an epoch): $cp_sync_us us, so $((cp_sync_us * 10)) ms on the 10,000 small files"

a=$(median "$RUN_DIR/eight-wtfs"); b=$(median "$RUN_DIR/eight-checkout")
printf '%-34s %9s ms %9s ms %9s\n' "eight worktrees at once" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
echo "daemon peak RSS, $RSS_WORKTREES worktrees, 10% of files read in each: $((rss_kb / 1024)) MB (now $((rss_now_kb / 1024)) MB)"
echo "daemon RSS growth, ten worktrees and a find over each (mean of 2): warm $((rss_warm_kb / 1024)) MB, plain of the same files tracked $((rss_tracked_kb / 1024)) MB (warm beyond plain: $(( (rss_warm_kb - rss_tracked_kb) / 1024 )) MB; rounds: warm $((w1 / 1024)), $((w2 / 1024)), plain $((t1 / 1024)), $((t2 / 1024)) MB)"
echo "  at the end of each round: $(paste -sd ';' "$RUN_DIR/rss-detail")"
echo "daemon heap growth, the same: warm $((heap_warm_kb / 1024)) MB, plain $((heap_tracked_kb / 1024)) MB (warm beyond plain: $(( (heap_warm_kb - heap_tracked_kb) / 1024 )) MB)"
for k in "${skipped[@]}"; do echo "skipped: $k"; done
[ "$cold" = 1 ] || echo "cold rows: caches not dropped (needs root)"
echo
echo "fresh view clean: $([ "$clean" = 0 ] && echo yes || echo "NO ($clean lines)")"
echo "view clean after the checkouts: $([ "$co_clean" = 0 ] && echo yes || echo "NO ($co_clean lines)")"
echo "warm view shows the $WARM_FILES inherited files: $([ "$warm_seen" = "$WARM_FILES" ] && echo yes || echo "NO ($warm_seen)"), content the source's: $warm_same"
echo "fork shows the parent's $FORK_FILES changes: $([ "$fork_changed" = "$FORK_FILES" ] && echo yes || echo "NO ($fork_changed lines)")"
echo "daemon log, 'open with another backing file' during the checkouts: $(( ${backing_after:-0} - ${backing_before:-0} ))"
echo "daemon counters: $reads"
