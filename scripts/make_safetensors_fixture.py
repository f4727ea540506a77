#!/usr/bin/env python3
"""Writes tests/io/fixtures/tiny.safetensors byte by byte from the format description, with only the Python
standard library: an implementation independent of lmtune's writer, for the reader test
(tests/io/safetensors_test.cpp, test FixtureFromIndependentWriter).

Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data. This writer orders the
data by tensor name (not by dtype like the reference) and does not pad the header, so the reader also sees
unaligned tensor data. Re-run to regenerate; the output is deterministic.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "io", "fixtures", "tiny.safetensors")


def bf16_bytes(values):
    # Values are chosen to be exact in bfloat16, so truncating the float32 bits is exact.
    out = b""
    for v in values:
        (bits,) = struct.unpack("<I", struct.pack("<f", v))
        assert bits & 0xFFFF == 0, v
        out += struct.pack("<H", bits >> 16)
    return out


tensors = {
    # name: (dtype, shape, bytes)
    "a.weight": ("F32", [2, 3], struct.pack("<6f", 1.0, -2.5, 3.25, 0.0, 1e-3, -7.0)),
    "b.bias": ("F16", [4], struct.pack("<4e", 0.5, -1.0, 65504.0, 2.0 ** -24)),
    "c.norm": ("BF16", [2, 2], bf16_bytes([1.5, -2.0, 0.15625, 256.0])),
    "d.ids": ("I64", [2], struct.pack("<2q", 7, -9)),
    "e.empty": ("F32", [0, 4], b""),
}

header = {"__metadata__": {"format": "pt", "writer": "make_safetensors_fixture.py"}}
data = b""
for name in sorted(tensors):
    dtype, shape, raw = tensors[name]
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw

header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
with open(OUT, "wb") as f:
    f.write(struct.pack("<Q", len(header_bytes)))
    f.write(header_bytes)
    f.write(data)
print(OUT, 8 + len(header_bytes) + len(data), "bytes")
