#!/usr/bin/env bash
# How long `worktreefs list` takes with many worktrees that each hold work.
#
#   scripts/bench-list.sh [--worktrees N] [--processes P] [--calls C] [--perf]
#
# Makes a repository of 100 files and N branches (default 1000), each 10 commits ahead
# of origin/main, its upstream; mounts worktreefs in a state directory of its own,
# makes a worktree on each branch and changes 50 of its files through the mount; starts
# P processes (default 500) that sleep; then times `worktreefs list` and `list --json`,
# C calls each (default 6), the daemon up. Prints each call's time; the first call
# builds the glance cache, the ones after it are what the target (250 ms) is about.
# --perf: one more call under `perf record -g`, and the top of its report.
# Always unmounts and ends what it started, even on failure.
set -euo pipefail
trap 'echo "bench-list.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

N=1000
P=500
CALLS=6
PERF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --worktrees) N="$2"; shift 2 ;;
    --processes) P="$2"; shift 2 ;;
    --calls) CALLS="$2"; shift 2 ;;
    --perf) PERF=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench-list.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
echo "building worktreefs (release)..." >&2
cargo build --release -q --manifest-path "$top/Cargo.toml"
BIN="$top/target/release/worktreefs"
DIR=$(mktemp -d /tmp/worktreefs-bench-list.XXXXXX)
STATE="$DIR/state"
MNT="$DIR/mnt"
SRC="$DIR/src"
sleepers=()
cleanup() {
  for pid in "${sleepers[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -e "$STATE/daemon.lock" ]; then
    timeout 900 "$BIN" --state-dir "$STATE" unmount >/dev/null 2>&1 || true
  fi
  if mountpoint -q "$MNT" 2>/dev/null; then umount -l "$MNT" || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT

mkdir -p "$SRC" "$MNT"
git -C "$SRC" init -q -b main
python3 - "$SRC" <<'EOF'
import os, sys
src = sys.argv[1]
for i in range(100):
    d = os.path.join(src, "src", f"d{i % 10}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}.txt"), "w") as f:
        f.write(f"file {i}\n" * 20)
EOF
git -C "$SRC" add -A
git -C "$SRC" -c user.name=b -c user.email=b@b commit -qm base
git -C "$SRC" update-ref refs/remotes/origin/main HEAD
base=$(git -C "$SRC" rev-parse HEAD)
echo "making $N branches of 10 commits each..." >&2
python3 - "$N" "$base" <<'EOF' | git -C "$SRC" fast-import --quiet
import sys
n, base = int(sys.argv[1]), sys.argv[2]
out = sys.stdout
mark = 0
for b in range(n):
    parent = base
    for c in range(10):
        mark += 1
        data = f"branch {b} commit {c}\n"
        out.write(f"commit refs/heads/b{b}\nmark :{mark}\n")
        out.write(f"committer b <b@b> {1700000000 + c} +0000\n")
        msg = f"b{b} c{c}\n"
        out.write(f"data {len(msg)}\n{msg}")
        out.write(f"from {parent}\n")
        out.write(f"M 100644 inline log/b{b}.txt\ndata {len(data)}\n{data}\n")
        parent = f":{mark}"
EOF
python3 - "$SRC/.git/config" "$N" <<'EOF'
import sys
with open(sys.argv[1], "a") as f:
    f.write('[remote "origin"]\n\turl = /nonexistent\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n')
    for b in range(int(sys.argv[2])):
        f.write(f'[branch "b{b}"]\n\tremote = origin\n\tmerge = refs/heads/main\n')
EOF

"$BIN" --state-dir "$STATE" repo add "$SRC" --name repo >/dev/null
"$BIN" --state-dir "$STATE" mount "$MNT" --linger 86400 >/dev/null
echo "making $N worktrees..." >&2
seq 0 $((N - 1)) | xargs -P 2 -I{} "$BIN" --state-dir "$STATE" new repo/w{} --branch b{} >/dev/null
echo "changing 50 files in each..." >&2
python3 - "$MNT/repo" "$N" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for w in range(n):
    for i in range(50):
        with open(os.path.join(root, f"w{w}", "src", f"d{i % 10}", f"f{i}.txt"), "a") as f:
            f.write("changed\n")
EOF
for _ in $(seq 1 "$P"); do sleep 86400 & sleepers+=($!); done
echo "$(ls /proc | grep -c '^[0-9]') processes running" >&2
time_ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
for what in "list" "list --json"; do
  times=()
  for _ in $(seq 1 "$CALLS"); do
    # shellcheck disable=SC2086
    times+=("$(time_ms "$BIN" --state-dir "$STATE" $what)")
  done
  echo "$what, $N worktrees, $P sleeping processes: ${times[*]} ms (first call, then the rest)"
done
"$BIN" --state-dir "$STATE" list --json | python3 -c '
import json, sys
w = json.load(sys.stdin)[0]
keys = ("worktree", "changed", "untracked", "ahead", "behind", "compared_with")
print("  e.g. " + ", ".join(k + " " + str(w[k]) for k in keys))'
if [ "$PERF" = 1 ]; then
  perf record -q -g -o "$DIR/perf.data" "$BIN" --state-dir "$STATE" list >/dev/null 2>&1
  perf report -q -i "$DIR/perf.data" --stdio --no-children --percent-limit 2 2>/dev/null | grep -v "^$" | head -80 || true
fi
