"""A pool that runs out of space, through python3-libnbd: every request refused for lack of
space answers ENOSPC (plain writes, FUA writes, WRITE_ZEROES with NO_HOLE, with and without
FUA, one at a time and 64 in flight), never EIO or ESHUTDOWN; afterwards the server still
serves: reads return what was written, flush works, and a trim frees room for new writes.

The export (argv[1]) must be a volume larger than its pool can hold."""
import errno
import sys

import nbd

uri = sys.argv[1]
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
MIB = 1 << 20


def name(code):
    return errno.errorcode.get(code, str(code))


def no_space(what, call):
    """`call` must fail with ENOSPC. A full pool does not stay exactly full: a request the
    space check refuses first runs syncs to free room, and every sync, even an empty one,
    releases the space maps and directory its predecessors replaced (their frees deferred two
    txgs) while deferring its own, so the next request may find a 16 KiB range that came
    back. Each try first takes whatever room came back (`refill`); a request that still
    succeeds three times running is admitted on a full pool."""
    for _ in range(3):
        refill()
        try:
            call()
        except nbd.Error as e:
            assert e.errnum == errno.ENOSPC, f"{what}: got {name(e.errnum)} ({e}), want ENOSPC"
            return
    raise AssertionError(f"{what}: succeeded on a full pool three times, want ENOSPC")


def fill_byte(offset):
    return (offset // MIB) % 250 + 1


# Where the next fill write goes.
at = 0


def fill(pieces):
    """Writes from `at` on, each size in turn until it is refused for lack of space."""
    global at
    for piece in pieces:
        while True:
            assert at + piece <= size, f"the {size // MIB} MiB volume fit in the pool: test too small"
            try:
                h.pwrite(bytes([fill_byte(at)]) * piece, at)
            except nbd.Error as e:
                assert e.errnum == errno.ENOSPC, \
                    f"fill with {piece}-byte writes at {at}: {name(e.errnum)} ({e}), want ENOSPC"
                break
            at += piece


def refill():
    """Takes the room deferred frees gave back since the pool was last full."""
    before = at
    fill((4096,))
    assert at < fresh, f"{(at - before) // 1024} KiB came back: reaches the test's fresh range"


# Fill in 1 MiB writes, then smaller ones into what is left, until even 4 KiB is refused. Each
# piece stays inside one MiB, so every MiB holds one byte value.
fill((MIB, 65536, 16384, 4096))
filled = at
assert filled > 32 * MIB, f"only {filled} bytes written before ENOSPC"
fresh = (filled // MIB + 2) * MIB

no_space("plain write", lambda: h.pwrite(b"p" * 4096, fresh))
no_space("FUA write", lambda: h.pwrite(b"f" * 65536, fresh, flags=nbd.CMD_FLAG_FUA))
# At 3 MiB, never read back: the trim below clears what a try that found room wrote.
no_space("FUA overwrite of written data (copy-on-write needs room)",
         lambda: h.pwrite(b"o" * 4096, 3 * MIB, flags=nbd.CMD_FLAG_FUA))
no_space("WRITE_ZEROES with NO_HOLE", lambda: h.zero(65536, fresh, flags=nbd.CMD_FLAG_NO_HOLE))
no_space("WRITE_ZEROES with NO_HOLE and FUA",
         lambda: h.zero(65536, fresh, flags=nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA))

# Many at once: each one is answered, and every failure is ENOSPC.
refill()
errors = {}


def count(err):
    if err.value:
        errors[name(err.value)] = errors.get(name(err.value), 0) + 1
    return 1


buffer = nbd.Buffer.from_bytearray(bytearray(b"c" * 16384))
for i in range(256):
    flags = nbd.CMD_FLAG_FUA if i % 2 else 0
    h.aio_pwrite(buffer, fresh + i * 65536, completion=count, flags=flags)
    if i % 4 == 0:
        h.aio_zero(16384, fresh + i * 65536 + 32768, completion=count,
                   flags=nbd.CMD_FLAG_NO_HOLE)
    while h.aio_in_flight() >= 64:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
assert set(errors) == {"ENOSPC"}, f"writes in flight on a full pool answered {errors}"

# Still serving: reads see the data, flush works.
for offset in (0, filled // 2 // MIB * MIB, (filled - 4096) // MIB * MIB):
    assert h.pread(4096, offset) == bytes([fill_byte(offset)]) * 4096, f"read at {offset}"
h.flush()
# A trim frees room: plain, FUA and NO_HOLE writes succeed again.
h.trim(16 * MIB, 0)
h.flush()
h.pwrite(b"a" * 65536, 0)
h.pwrite(b"b" * 65536, MIB, flags=nbd.CMD_FLAG_FUA)
h.zero(65536, 2 * MIB, flags=nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
assert h.pread(65536, 0) == b"a" * 65536, "write after trim"
assert h.pread(65536, MIB) == b"b" * 65536, "FUA write after trim"
assert h.pread(65536, 2 * MIB) == bytes(65536), "NO_HOLE zeroes after trim"
assert h.pread(4096, 4 * MIB) == bytes(4096), "trimmed range reads as zeros"
h.shutdown()
print(f"no-space cases: all passed ({filled // MIB} MiB fit, every refusal ENOSPC)")
