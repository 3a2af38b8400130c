#!/usr/bin/env bash
# POSIX conformance: runs the crates.io pjdfstest (0.2.x) with one configuration
# (tests/pjdfstest/pjdfstest.toml) in a mounted worktree and in a plain directory of the
# machine's own filesystem, in the same run, and compares each with its expected failures
# (tests/pjdfstest/expected-failures.txt: "<where> <test>  # why"). Exits non-zero on an
# unexpected failure, and on an expected one that now passes (so the list stays true).
# Always unmounts what it mounted, and bounds each run in time.
#
#   scripts/pjdfstest.sh [--release] [--keep]
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
profile=debug
keep=0
for a in "$@"; do
  case "$a" in
    --release) profile=release ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--release] [--keep]" >&2; exit 2 ;;
  esac
done
bin="$top/target/$profile/worktreefs"
conf="$top/tests/pjdfstest/pjdfstest.toml"
expected="$top/tests/pjdfstest/expected-failures.txt"
if [ ! -x "$bin" ]; then
  echo "pjdfstest.sh: $bin is missing: build it first (cargo build${profile/debug/})" >&2
  exit 2
fi
command -v pjdfstest >/dev/null || { echo "pjdfstest.sh: pjdfstest is not installed (cargo install pjdfstest)" >&2; exit 2; }

t=$(mktemp -d /tmp/wtfs-pjdfstest.XXXXXX)
# pjdfstest switches to unprivileged users: they must be able to walk to both directories.
chmod 755 "$t"
export WORKTREEFS_STATE_DIR="$t/state"
mounted=0
cleanup() {
  cd /
  if [ "$mounted" = 1 ]; then
    timeout 60 "$bin" unmount >/dev/null 2>&1 || timeout 30 "$bin" unmount --lazy >/dev/null 2>&1 || true
    if grep -q " $t/mnt " /proc/mounts; then umount -l "$t/mnt" || true; fi
  fi
  if [ "$keep" = 0 ]; then rm -rf "$t"; else echo "pjdfstest.sh: logs kept in $t"; fi
}
trap cleanup EXIT

git init -q -b main "$t/repo"
echo "pjdfstest" > "$t/repo/README"
git -C "$t/repo" add README
git -C "$t/repo" -c user.name=ci -c user.email=ci@localhost commit -qm init
"$bin" repo add "$t/repo" --name repo >/dev/null
mkdir -p "$t/mnt" "$t/native"
chmod 755 "$t/native"
"$bin" mount "$t/mnt" --allow-other >/dev/null || { echo "pjdfstest.sh: mount failed" >&2; exit 1; }
mounted=1
"$bin" new repo/pjdfstest >/dev/null
view="$t/mnt/repo/pjdfstest"
# Which transport carries the view's requests (`--uring`, or $WORKTREEFS_URING).
transport=$(grep -o '"transport":"[^"]*"' "$t/mnt/.control/stats" | cut -d'"' -f4)
echo "pjdfstest.sh: the view's requests go over ${transport:-/dev/fuse}"
fstype=$(stat -f -c %T "$t/native")

run() { # where dir
  (cd "$2" && timeout 900 pjdfstest -c "$conf" -p "$2" > "$t/$1.log" 2>&1)
  local rc=$?
  # One line per test: "<name>  <ok|FAILED|skipped...>"; the failures' names.
  grep -E '^[a-z_0-9:]+ +FAILED' "$t/$1.log" | awk '{print $1}' | sort > "$t/$1.failed"
  local ok failed skipped
  ok=$(grep -cE '^[a-z_0-9:]+ +ok$' "$t/$1.log")
  failed=$(wc -l < "$t/$1.failed")
  skipped=$(grep -cE '^[a-z_0-9:]+ +skipped' "$t/$1.log")
  echo "pjdfstest $1: $ok ok, $failed failed, $skipped skipped (exit $rc)"
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "pjdfstest.sh: pjdfstest in $1 exited $rc without a failure it names:" >&2
    tail -20 "$t/$1.log" >&2
    return 1
  fi
}

status=0
run native "$t/native" || status=1
run view "$view" || status=1
for where in native view; do
  grep -E "^$where " "$expected" | awk '{print $2}' | sort > "$t/$where.expected"
  unexpected=$(comm -23 "$t/$where.failed" "$t/$where.expected")
  fixed=$(comm -13 "$t/$where.failed" "$t/$where.expected")
  if [ -n "$unexpected" ]; then
    echo "pjdfstest.sh: unexpected failures in $where ($fstype for native):" >&2
    for n in $unexpected; do
      echo "  $n" >&2
      grep -A4 -E "^$n +FAILED" "$t/$where.log" | tail -n +2 | sed 's/^/      /' >&2
    done
    status=1
  fi
  if [ -n "$fixed" ]; then
    echo "pjdfstest.sh: expected to fail in $where but passed (take them off $expected):" >&2
    echo "$fixed" | sed 's/^/  /' >&2
    status=1
  fi
done
exit "$status"
