#!/usr/bin/env python3
"""Makes a `cfi_eval` fuzz seed from an ELF file: u16 length of
.eh_frame_hdr, u32 address of .eh_frame_hdr, u32 address of .eh_frame, the
header bytes, then .eh_frame (cut to MAX bytes, default 4096).

usage: fuzz/make_cfi_seed.py ELF OUT [MAX]"""
import struct, subprocess, sys, tempfile, os

def section(path, name):
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.replace("[ ", "[").split()
        if len(f) > 5 and f[1] == name:
            addr, off, size = int(f[3], 16), int(f[4], 16), int(f[5], 16)
            with open(path, "rb") as fh:
                fh.seek(off)
                return addr, fh.read(size)
    return 0, b""

elf, out = sys.argv[1], sys.argv[2]
cap = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
ha, hdr = section(elf, ".eh_frame_hdr")
ea, eh = section(elf, ".eh_frame")
data = struct.pack("<HII", len(hdr), ha & 0xffffffff, ea & 0xffffffff) + hdr + eh[:cap]
open(out, "wb").write(data)
print(f"{out}: {len(data)} bytes")
