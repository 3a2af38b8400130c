#!/usr/bin/env python3
"""Writes a `git fast-import` stream for a synthetic repository of N files.

Shape: packages of modules of leaf directories (about 25 files each, depth 2 to 4), a
few top-level files, names with common extensions. Sizes: 75% 100 B-2 KiB, 23% 2-16 KiB,
2% 16-64 KiB (mean about 4 KiB). Content is deterministic text, so repeated runs make the
same repository. Usage: gen_repo.py N > stream
"""
import random
import sys

def main():
    n = int(sys.argv[1])
    rng = random.Random(42)
    words = [("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))) for _ in range(2000)]
    exts = ["rs", "py", "ts", "go", "c", "h", "md", "json", "txt", "toml"]
    out = sys.stdout.buffer
    paths = []
    leaf = 0
    i = 0
    while i < n:
        depth = rng.choice([2, 3, 3, 4])
        parts = [f"pkg{leaf % 37}", f"mod{(leaf // 37) % 23}", f"sub{leaf // 851}", f"deep{leaf % 5}"][:depth]
        d = "/".join(parts) + f"/leaf{leaf}"
        for _ in range(min(25, n - i)):
            paths.append(f"{d}/file{i}.{rng.choice(exts)}")
            i += 1
        leaf += 1
    paths[0] = "README.md"
    if n > 1:
        paths[1] = "Makefile"
    for mark, path in enumerate(paths, start=1):
        r = rng.random()
        size = rng.randint(100, 2048) if r < 0.75 else rng.randint(2048, 16384) if r < 0.98 else rng.randint(16384, 65536)
        text = []
        total = 0
        while total < size:
            w = words[rng.randrange(len(words))]
            text.append(w)
            total += len(w) + 1
        data = (" ".join(text))[:size].encode() + b"\n"
        out.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
        out.write(data)
        out.write(b"\n")
    out.write(b"commit refs/heads/main\n")
    out.write(b"committer Bench <bench@example.com> 1700000000 +0000\n")
    msg = b"synthetic repository"
    out.write(b"data %d\n%s\n" % (len(msg), msg))
    for mark, path in enumerate(paths, start=1):
        mode = b"100755" if path.endswith(".sh") else b"100644"
        out.write(b"M %s :%d %s\n" % (mode, mark, path.encode()))
    out.write(b"\n")

if __name__ == "__main__":
    main()
