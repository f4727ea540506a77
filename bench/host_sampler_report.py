#!/usr/bin/env python3
"""Names the stacks bench/host_sampler.c wrote: inclusive and self shares per function of the main thread.

    host_sampler_report.py SAMPLES BINARY [FUNCTION]

BINARY is the lmtune binary that ran (the same build: frames are named from its symbol table with nm); frames in
other libraries are named by the library. With FUNCTION (a substring of a demangled name), only the samples whose
stack holds it count, e.g. lmtune::train_step for the training steps without loading and warm-up.
"""
import bisect
import collections
import subprocess
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    path, binary = sys.argv[1], sys.argv[2]
    focus = sys.argv[3] if len(sys.argv) == 4 else None
    maps, stacks, elsewhere = [], [], 0
    for line in open(path):
        if line.startswith("M "):
            f = line[2:].split()
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            maps.append((lo, hi, int(f[2], 16), f[5] if len(f) > 5 else "?"))
        elif line.startswith("O "):
            elsewhere = int(line[2:])
        elif line.startswith("S"):
            stacks.append([int(x, 16) for x in line[1:].split()])
    nm = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True, check=True)
    symbols = sorted((int(f[0], 16), f[2]) for f in (l.split(" ", 2) for l in nm.stdout.splitlines())
                     if len(f) == 3 and f[1] in "tTwW")
    starts = [a for a, _ in symbols]
    names_of_binary = {binary.split("/")[-1], "lmtune"}  # the run's file may carry another name than this copy
    own = [m for m in maps if m[3].split("/")[-1] in names_of_binary]
    base = min(lo - off for lo, _, off, _ in own) if own else 0

    def name(addr):
        for lo, hi, _, lib in maps:
            if lo <= addr < hi:
                if (lo, hi, _, lib) in own:
                    i = bisect.bisect_right(starts, addr - base) - 1
                    return symbols[i][1] if i >= 0 else "?"
                return lib.split("/")[-1]
        return "?"

    inclusive, leaf, counted = collections.Counter(), collections.Counter(), 0
    for stack in stacks:
        names = [name(a) for a in stack]
        if not names or (focus and not any(focus in n for n in names)):
            continue
        counted += 1
        leaf[names[0]] += 1
        inclusive.update(set(names))
    print(f"{counted} of {len(stacks)} main-thread samples{' with ' + focus if focus else ''}; "
          f"{elsewhere} on other threads")
    for title, table, rows in (("inclusive", inclusive, 50), ("self", leaf, 20)):
        print(f"-- {title}")
        for n, c in table.most_common(rows):
            print(f"{100 * c / max(counted, 1):6.1f}%  {n[:150]}")


if __name__ == "__main__":
    main()
