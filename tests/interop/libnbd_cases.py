"""Protocol corner cases against `sluice serve`, through python3-libnbd with strict mode off
so that deliberately bad requests reach the server. Each case names what it expects; the
connection must stay usable after every refused request."""
import errno
import sys

import nbd

uri = sys.argv[1]
h = nbd.NBD()
h.set_strict_mode(0)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
size = h.get_size()


def refused(what, expected, call):
    try:
        call()
    except nbd.Error as e:
        assert e.errnum == expected, f"{what}: got {errno.errorcode.get(e.errnum, e.errnum)}, want {errno.errorcode[expected]}"
        return
    raise AssertionError(f"{what}: succeeded, want {errno.errorcode[expected]}")


refused("misaligned read", errno.EINVAL, lambda: h.pread(512, 100))
refused("misaligned write", errno.EINVAL, lambda: h.pwrite(b"x" * 100, 0))
refused("read past the end", errno.EINVAL, lambda: h.pread(4096, size - 512))
refused("write past the end", errno.ENOSPC, lambda: h.pwrite(b"x" * 4096, size - 512))
refused("trim past the end", errno.EINVAL, lambda: h.trim(4096, size))
refused("unknown write flag", errno.EINVAL, lambda: h.pwrite(b"y" * 512, 0, flags=1 << 9))
refused("unknown flag beside FUA on a read", errno.EINVAL,
        lambda: h.pread(512, 0, flags=nbd.CMD_FLAG_FUA | 1 << 9))
refused("read above the payload limit", errno.EINVAL, lambda: h.pread((32 << 20) + 512, 0))
refused("fast zero that must allocate", errno.ENOTSUP,
        lambda: h.zero(1 << 20, 0, flags=nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO))
assert h.pread(0, 0) == b"", "zero-length read"
h.pwrite(b"", 0)
h.flush()

# FUA is negotiated, so every command accepts it (the spec: the server may ignore it where it
# means nothing; older qemu sends FLUSH with FUA). READ, FLUSH and BLOCK_STATUS were refused
# with EINVAL.
assert h.can_fua()
fua = nbd.CMD_FLAG_FUA
h.pwrite(b"u" * 8192, 3 << 20, flags=fua)
assert h.pread(8192, 3 << 20, flags=fua) == b"u" * 8192, "read with FUA"
assert h.pread(8192, 3 << 20, flags=fua | nbd.CMD_FLAG_DF) == b"u" * 8192, "read with FUA and DF"
h.flush(flags=fua)
h.trim(4096, 3 << 20, flags=fua)
h.zero(4096, (3 << 20) + 4096, flags=fua)
h.zero(4096, (3 << 20) + 4096, flags=fua | nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8192, 3 << 20, flags=fua) == bytes(8192), "trimmed and zeroed with FUA"
seen = []
h.block_status(65536, 3 << 20, lambda ctx, off, ents, err: seen.append(ctx) or 0, flags=fua)
assert seen == ["base:allocation"], f"block status with FUA: {seen}"

# A FUA write is readable at once; zeroing with and without holes reads as zeros.
data = bytes(range(256)) * 64
h.pwrite(data, 1 << 20, flags=nbd.CMD_FLAG_FUA)
assert h.pread(len(data), 1 << 20) == data, "FUA write read back"
h.zero(16384, 1 << 20, flags=nbd.CMD_FLAG_NO_HOLE)
assert h.pread(16384, 1 << 20) == bytes(16384), "zeroed with NO_HOLE"
h.pwrite(data, 2 << 20)
h.zero(16384, 2 << 20, flags=nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(16384, 2 << 20) == bytes(16384), "fast zero"

# base:allocation: a trimmed block range is a hole, a written one is data.
h.pwrite(b"d" * 65536, 4 << 20)
h.trim(65536, 5 << 20)
extents = []
h.block_status(2 << 20, 4 << 20,
               lambda ctx, off, ents, err: extents.append((ctx, list(ents))) or 0)
flags = dict()
at = 4 << 20
for ctx, ents in extents:
    assert ctx == "base:allocation", ctx
    for i in range(0, len(ents), 2):
        flags[at] = ents[i + 1]
        at += ents[i]
assert flags.get(4 << 20) == 0, f"written range not data: {flags}"
assert flags.get(5 << 20, 0) & 1 == 1, f"trimmed range not a hole: {flags}"

# Multi-connection: a flush on another connection covers this one's writes.
h2 = nbd.NBD()
h2.connect_uri(uri)
assert h2.can_multi_conn()
h.pwrite(b"m" * 4096, 6 << 20)
h2.flush()
assert h2.pread(4096, 6 << 20) == b"m" * 4096, "write seen on another connection"

# Many requests in flight on one connection: replies come back in any order, some sent by the
# request itself and some queued behind another reply, and each one answers its own request.
base, piece, count = 8 << 20, 65536, 64
payloads = [nbd.Buffer.from_bytearray(bytearray([i + 1]) * piece) for i in range(count)]
writes = [h.aio_pwrite(payloads[i], base + i * piece) for i in range(count)]
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(h.aio_command_completed(c) for c in writes), "every write answered"
buffers = [nbd.Buffer(piece) for _ in range(count)]
reads = [h.aio_pread(buffers[i], base + i * piece) for i in range(count)]
while h.aio_in_flight() > 0:
    h.poll(-1)
for i, c in enumerate(reads):
    assert h.aio_command_completed(c), f"read {i} answered"
    assert buffers[i].to_bytearray() == bytearray([i + 1]) * piece, f"read {i} got another's data"

# After everything refused above, the first connection still works.
assert h.pread(65536, 4 << 20) == b"d" * 65536
h.shutdown()
h2.shutdown()
print("libnbd cases: all passed")
