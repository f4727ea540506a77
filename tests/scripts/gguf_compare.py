#!/usr/bin/env python3
"""Compares two GGUF files with a minimal reader of its own (standard library only), so lmtune's writer is checked
against tests/scripts/hf_to_gguf.py without lmtune's reader in the loop: the same tensors (name, type, dims; bytes
equal, F32 data within a relative 1e-6 where the two sides compute a value in different precisions, e.g.
rope_freqs, Q8_0 quants within one step on exact ties, see same_q8_0) in any order, and the same values for the
metadata keys named.
Usage: gguf_compare.py A.gguf B.gguf [KEY_OR_PREFIX* ...]   (a key ending in '*' names every key it starts)
Exit status 1 with the differences listed.
"""
import struct
import sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type: (elements, bytes) per block
BLOCKS = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 14: (256, 210), 30: (1, 2)}


def read(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    def value(t):
        if t == 8: return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(SCALARS[t])

    assert data[:4] == b"GGUF", path + ": not a GGUF file"
    pos = 4
    _, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, take("<I"), dims, take("<Q")))
    align = kv.get("general.alignment", 32)
    start = pos + (-pos % align)
    tensors = {}
    for name, t, dims, off in infos:
        elems, nbytes = BLOCKS[t]
        n = 1
        for d in dims: n *= d
        tensors[name] = (t, dims, data[start + off:start + off + n // elems * nbytes])
    return kv, tensors


def same_f32(a, b):
    if len(a) != len(b): return False
    x, y = struct.unpack("<%df" % (len(a) // 4), a), struct.unpack("<%df" % (len(b) // 4), b)
    return all(abs(p - q) <= 1e-6 * max(abs(p), abs(q)) for p, q in zip(x, y))


def same_q8_0(a, b):
    """Q8_0 blocks with equal scales whose quants differ by at most one step: ggml's reference quantizer (and
    gguf-py's) rounds halves away from zero, lmtune's quant.cpp to even, so exact .5 products may differ."""
    if len(a) != len(b): return False
    for i in range(0, len(a), 34):
        if a[i:i + 2] != b[i:i + 2]: return False
        qa, qb = struct.unpack_from("<32b", a, i + 2), struct.unpack_from("<32b", b, i + 2)
        if any(abs(p - q) > 1 for p, q in zip(qa, qb)): return False
    return True


def main():
    a_path, b_path, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    (ka, ta), (kb, tb) = read(a_path), read(b_path)
    problems = []
    if sorted(ta) != sorted(tb):
        problems.append("tensor names differ: only in A %s, only in B %s" % (sorted(set(ta) - set(tb))[:5],
                                                                          sorted(set(tb) - set(ta))[:5]))
    for name in sorted(set(ta) & set(tb)):
        (t1, d1, b1), (t2, d2, b2) = ta[name], tb[name]
        if (t1, d1) != (t2, d2): problems.append("%s: type/dims %s vs %s" % (name, (t1, d1), (t2, d2)))
        elif b1 != b2 and not (t1 == 0 and same_f32(b1, b2)) and not (t1 == 8 and same_q8_0(b1, b2)):
            problems.append("%s: data differs" % name)
    for k in keys:
        names = [x for x in set(ka) | set(kb) if x.startswith(k[:-1])] if k.endswith("*") else [k]
        for name in sorted(names):
            if ka.get(name) != kb.get(name):
                problems.append("key %s: %r vs %r" % (name, str(ka.get(name))[:80], str(kb.get(name))[:80]))
    if problems:
        print("%s vs %s:\n  " % (a_path, b_path) + "\n  ".join(problems[:20]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
