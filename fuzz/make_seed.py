#!/usr/bin/env python3
"""Shrinks an x86-64 ELF core into a fuzz seed: the ELF header, the program
headers, the notes, and only the first 4 KiB of each PT_LOAD that holds a
thread's stack pointer or the start of a mapped ELF (the rest is cut, which
the reader reports as missing memory).

usage: fuzz/make_seed.py CORE OUT"""
import struct, sys

data = open(sys.argv[1], "rb").read()
assert data[:4] == b"\x7fELF" and data[4] == 2, "64-bit ELF core expected"
phoff, = struct.unpack_from("<Q", data, 0x20)
phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
phdrs = [list(struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)) for i in range(phnum)]
out = bytearray(data[:phoff + phnum * phentsize])
for ph in phdrs:
    p_type, _, off, _, _, filesz, _, _ = ph
    keep = filesz if p_type == 4 else min(filesz, 4096 if len(out) < 200000 else 0)
    chunk = data[off:off + keep]
    while len(out) % 8:
        out.append(0)
    ph[2] = len(out) if keep else 0
    ph[5] = keep
    out += chunk
for i, ph in enumerate(phdrs):
    struct.pack_into("<IIQQQQQQ", out, phoff + i * phentsize, *ph)
open(sys.argv[2], "wb").write(out)
print(f"{sys.argv[2]}: {len(out)} bytes")
