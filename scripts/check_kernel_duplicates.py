#!/usr/bin/env python3
"""Finds blocks of GLSL copied between kernel sources (or within one).

Usage: check_kernel_duplicates.py [KERNEL_DIR] [--min-lines N]

Reads every .comp and .glsl file under KERNEL_DIR (default: kernels/ next to this script's directory), drops
blank lines and comments, folds runs of whitespace, and reports each run of at least N consecutive normalized
lines that occurs in two places: two files, or two places in one file (a block repeated back to back counts once
per repetition; a shorter shape repeated, such as one line written N times, does not count). Exits 1 if it finds
any, naming both files and their line ranges, so that the shared body can move into a .glsl include.

N defaults to 8: longer than the header kernels of one family share (#version and up to six #extension lines,
as in the tensor-core matmuls), short enough to catch a copied helper function or loop body.

Lines between a `// check_kernel_duplicates: off` comment and a `// check_kernel_duplicates: on` comment are left
out, for data that may equal another kernel's without being shared code (a kernel's own tuned block sizes); say
why next to the marker.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

DEFAULT_MIN_LINES = 8
SUFFIXES = (".comp", ".glsl")


MARKER = re.compile(r"//\s*check_kernel_duplicates:\s*(off|on)\b")
COMMENT = re.compile(r"//[^\n]*|/\*.*?(?:\*/|$)", re.S)


def normalize(path, text):
    """The file's significant lines as (normalized text, 1-based source line number); a line left out by the
    off / on markers is None, which matches nothing."""
    markers = {}
    for number, line in enumerate(text.split("\n"), start=1):
        marker = MARKER.search(line)
        if marker:
            markers[number] = marker.group(1) == "off"
    # Comments out, newlines kept (so line numbers stay).
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    lines = []
    skipping = False
    off_at = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if number in markers:
            if markers[number] == skipping:
                raise ValueError(f"{path}:{number}: check_kernel_duplicates: {'off' if skipping else 'on'} twice")
            skipping = markers[number]
            off_at = number
            lines.append((None, number))
            continue
        line = " ".join(line.split())
        if line:
            lines.append((None if skipping else line, number))
    if skipping:
        raise ValueError(f"{path}:{off_at}: check_kernel_duplicates: off without a matching on")
    return lines


def kernel_files(root):
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            if name.endswith(SUFFIXES):
                yield os.path.join(directory, name)


def smallest_period(block):
    """The smallest p such that the block is its first p lines repeated (the last repetition may be partial)."""
    for p in range(1, len(block)):
        if all(block[k] == block[k + p] for k in range(len(block) - p)):
            return p
    return len(block)


def find_duplicates(sources, min_lines):
    """Maximal runs of >= min_lines equal normalized lines in two places, as (length, (file, i), (file, j))
    with i and j indices into the normalized lines."""
    windows = defaultdict(list)
    for path, lines in sources.items():
        texts = [text for text, _ in lines]
        for i in range(len(texts) - min_lines + 1):
            window = texts[i:i + min_lines]
            if None not in window:
                windows[tuple(window)].append((path, i))

    def same(a, i, b, j):
        la, lb = sources[a], sources[b]
        return 0 <= i < len(la) and 0 <= j < len(lb) and la[i][0] is not None and la[i][0] == lb[j][0]

    runs = []
    for places in windows.values():
        for x in range(len(places)):
            for y in range(x + 1, len(places)):
                (a, i), (b, j) = places[x], places[y]
                # Only the start of a maximal run; later windows of the same run extend backwards into it.
                if same(a, i - 1, b, j - 1):
                    continue
                length = min_lines
                while same(a, i + length, b, j + length):
                    length += 1
                if a == b and j < i + length:
                    # The block overlaps its copy: a block repeated back to back, counted once per period.
                    length = j - i
                if smallest_period([text for text, _ in sources[a][i:i + length]]) < min_lines:
                    continue  # a shorter shape repeated (a line written N times), not a copied block
                runs.append((length, (a, i), (b, j)))
    runs.sort(key=lambda r: (-r[0], r[1], r[2]))
    return runs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel_dir", nargs="?", default=os.path.join(here, "..", "kernels"))
    parser.add_argument("--min-lines", type=int, default=DEFAULT_MIN_LINES,
                        help="shortest run of equal normalized lines that counts (default %(default)s)")
    args = parser.parse_args()
    if args.min_lines < 1:
        parser.error("--min-lines must be at least 1")

    root = os.path.normpath(args.kernel_dir)
    sources = {}
    try:
        for path in kernel_files(root):
            with open(path, encoding="utf-8") as f:
                name = os.path.relpath(path, root)
                sources[name] = normalize(name, f.read())
    except ValueError as e:
        print(f"check_kernel_duplicates: {e}", file=sys.stderr)
        return 2
    if not sources:
        print(f"check_kernel_duplicates: no .comp or .glsl files under {root}", file=sys.stderr)
        return 2

    runs = find_duplicates(sources, args.min_lines)
    if not runs:
        print(f"check_kernel_duplicates: {len(sources)} files under {root}, no block of "
              f"{args.min_lines} or more normalized lines in two places")
        return 0

    def where(path, start, length):
        lines = sources[path]
        return f"{path}:{lines[start][1]}-{lines[start + length - 1][1]}"

    print(f"check_kernel_duplicates: {len(runs)} block(s) of {args.min_lines} or more equal lines (blank lines "
          f"and comments dropped, whitespace folded) in two places under {root}; move the shared body into a "
          f".glsl include (or, for data that is equal only by chance, see the off / on markers in --help):",
          file=sys.stderr)
    for length, (a, i), (b, j) in runs:
        print(f"  {length} lines: {where(a, i, length)} == {where(b, j, length)}", file=sys.stderr)
        for text, _ in sources[a][i:i + min(length, 3)]:
            print(f"      {text}", file=sys.stderr)
        if length > 3:
            print("      ...", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
