"""Writes the seed corpus for the nbd_session fuzz target (corpus/nbd_session/). Each file is
everything one client sends: valid sessions that reach transmission, and damaged ones."""
import os
import struct

OPTS = 0x49484156454F5054
REQ = 0x25609513
out = os.path.join(os.path.dirname(__file__), "corpus", "nbd_session")
os.makedirs(out, exist_ok=True)


def opt(option, data=b""):
    return struct.pack(">QII", OPTS, option, len(data)) + data


def go(name=b"vol0", infos=(3, 1)):
    return opt(7, struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos))
               + b"".join(struct.pack(">H", i) for i in infos))


def meta(option, name=b"vol0", queries=(b"base:allocation",)):
    return opt(option, struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
               + b"".join(struct.pack(">I", len(q)) + q for q in queries))


def req(kind, offset=0, length=4096, flags=0, cookie=1):
    return struct.pack(">IHHQQI", REQ, flags, kind, cookie, offset, length)


hello = struct.pack(">I", 3)
structured = opt(8) + meta(10)
seeds = {
    "go_simple_rw": hello + go() + req(1, 0, 4096) + b"\xab" * 4096 + req(0, 0, 4096) + req(3, 0, 0) + req(2, 0, 0),
    "go_structured": hello + structured + go() + req(1, 8192, 8192, 1) + b"\x11" * 8192
        + req(0, 0, 16384) + req(7, 0, 1 << 20) + req(4, 0, 4096) + req(6, 4096, 8192, 2) + req(2, 0, 0),
    "export_name": hello + opt(1, b"vol0") + req(0, 0, 512) + req(2, 0, 0),
    "list_info_abort": hello + opt(3) + opt(6, struct.pack(">I", 4) + b"nope" + b"\0\0") + opt(2),
    "bad_request_magic": hello + go() + b"\0" * 28,
    "oversize_write": hello + go() + req(1, 0, (32 << 20) + 512),
    "misaligned_and_unknown": hello + go() + req(0, 100, 512) + req(9, 0, 512) + req(3, 512, 0) + req(0, 0, 0),
    "huge_option": hello + struct.pack(">QII", OPTS, 99, 1 << 30),
    "unknown_option": hello + opt(42, b"xyz") + opt(5) + go(),
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
