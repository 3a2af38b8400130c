#!/usr/bin/env bash
# What a command costs in FUSE requests: runs it with the kernel's fuse tracepoints on and
# prints, per request kind, how many were sent, their latency (from the kernel sending the
# request to the daemon's reply: the daemon's time plus its wake-up) and how many failed.
#
#   scripts/fuse-trace.sh [--mount DIR] -- COMMAND [ARG...]
#
# --mount DIR counts only the requests of the FUSE mount at DIR (default: every FUSE mount).
# Needs root and a kernel with the fuse_request_send/end tracepoints (6.13 and later). A
# diagnosis tool, not a benchmark: timings come from scripts/bench.sh.
set -euo pipefail

MOUNT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mount) MOUNT="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "fuse-trace.sh: no command given; usage: fuse-trace.sh [--mount DIR] -- COMMAND [ARG...]" >&2
  exit 2
fi

T=/sys/kernel/tracing
if [ ! -d "$T/events" ]; then
  mount -t tracefs nodev "$T" 2>/dev/null || true
fi
if [ ! -d "$T/events/fuse/fuse_request_send" ]; then
  echo "fuse-trace.sh: this kernel has no fuse tracepoints ($T/events/fuse); they came in Linux 6.13" >&2
  exit 2
fi
CONN=""
if [ -n "$MOUNT" ]; then
  if ! findmnt -n -M "$MOUNT" >/dev/null; then
    echo "fuse-trace.sh: nothing is mounted at $MOUNT; give the mount point itself" >&2
    exit 2
  fi
  # A FUSE superblock has an anonymous device (major 0): the tracepoint's connection is
  # its minor.
  CONN=$(stat -c '%d' "$MOUNT")
fi

OUT=$(mktemp)
restore() {
  echo 0 > "$T/tracing_on"
  echo 0 > "$T/events/fuse/enable"
  echo > "$T/trace"
  rm -f "$OUT"
}
trap restore EXIT
echo 0 > "$T/tracing_on"
echo > "$T/trace"
echo 65536 > "$T/buffer_size_kb"
echo 1 > "$T/events/fuse/enable"
echo 1 > "$T/tracing_on"
rc=0
"$@" || rc=$?
echo 0 > "$T/tracing_on"
cat "$T/trace" > "$OUT"

python3 - "$OUT" "$CONN" <<'PY'
import collections, re, sys
path, conn = sys.argv[1], sys.argv[2]
send_re = re.compile(r'(\d+\.\d+): fuse_request_send: connection (\d+) req (\d+) opcode \d+ \((\w+)\)')
end_re = re.compile(r'(\d+\.\d+): fuse_request_end: connection (\d+) req (\d+) len \d+ error (-?\d+)')
sent, lat, errors, lost = {}, collections.defaultdict(list), collections.Counter(), 0
count = collections.Counter()
for line in open(path):
    if 'LOST' in line:
        lost += 1
    m = send_re.search(line)
    if m:
        if conn and m.group(2) != conn:
            continue
        sent[(m.group(2), m.group(3))] = (float(m.group(1)), m.group(4))
        count[m.group(4)] += 1
        continue
    m = end_re.search(line)
    if m and (m.group(2), m.group(3)) in sent:
        t, op = sent.pop((m.group(2), m.group(3)))
        lat[op].append((float(m.group(1)) - t) * 1e6)
        if m.group(4) != '0':
            errors[op] += 1
print(f"{'request':<20} {'count':>8} {'mean us':>9} {'p50':>7} {'p90':>7} {'max':>9} {'errors':>7}")
for op, n in count.most_common():
    v = sorted(lat[op]) or [0.0]
    mean = sum(v) / len(v)
    print(f"{op:<20} {n:>8} {mean:>9.1f} {v[len(v) // 2]:>7.1f} {v[len(v) * 9 // 10]:>7.1f} {v[-1]:>9.1f} {errors[op]:>7}")
print(f"total {sum(count.values())} requests; {len(sent)} without a reply in the trace")
if lost:
    print("the trace buffer overflowed: counts are low (trace a shorter command)")
PY
exit "$rc"
