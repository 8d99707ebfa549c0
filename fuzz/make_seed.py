#!/usr/bin/env python3
"""Shrinks a little-endian ELF core (64- or 32-bit) into a fuzz seed: the ELF header, the program
headers, the notes, and only the first 4 KiB of each PT_LOAD that holds a
thread's stack pointer or the start of a mapped ELF (the rest is cut, which
the reader reports as missing memory).

usage: fuzz/make_seed.py CORE OUT"""
import struct, sys

data = open(sys.argv[1], "rb").read()
assert data[:4] == b"\x7fELF" and data[5] == 1, "little-endian ELF core expected"
if data[4] == 2:
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    fmt, OFF, FILESZ = "<IIQQQQQQ", 2, 5
else:
    phoff, = struct.unpack_from("<I", data, 0x1c)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x2a)
    fmt, OFF, FILESZ = "<IIIIIIII", 1, 4
phdrs = [list(struct.unpack_from(fmt, data, phoff + i * phentsize)) for i in range(phnum)]
out = bytearray(data[:phoff + phnum * phentsize])
for ph in phdrs:
    p_type, off, filesz = ph[0], ph[OFF], ph[FILESZ]
    keep = filesz if p_type == 4 else min(filesz, 4096 if len(out) < 200000 else 0)
    chunk = data[off:off + keep]
    while len(out) % 8:
        out.append(0)
    ph[OFF] = len(out) if keep else 0
    ph[FILESZ] = keep
    out += chunk
for i, ph in enumerate(phdrs):
    struct.pack_into(fmt, out, phoff + i * phentsize, *ph)
open(sys.argv[2], "wb").write(out)
print(f"{sys.argv[2]}: {len(out)} bytes")
