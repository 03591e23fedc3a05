#!/usr/bin/env python3
"""Hostile inputs of about 1 MiB each, the worst shapes found for time and memory while fuzzing and reading the
readers: each must be read (or refused) in well under a second and in no more than about 64× its size.
tests/it/bad_input.rs runs every one under an address-space limit; bench/hostile.sh times them.

    python3 fuzz/hostile.py OUT_DIR
"""
import os
import struct
import sys

MIB = 1 << 20


def pickle_body(body):
    return b"\x80\x04" + body + b"."


def fill(unit, size=MIB):
    return unit * (size // len(unit))


def cases():
    # Lists of memo references to lists of memo references: every level shares the one before, so nothing is copied.
    refs = bytearray(b"]\x94")
    n = 0
    while len(refs) < MIB:
        refs += b"(" + (b"j" + struct.pack("<I", n)) * 4 + b"l\x94"
        n += 1
    yield "pickle-list-of-memo-refs.pickle", pickle_body(bytes(refs))
    # Half a million references to one list in one list.
    yield "pickle-half-a-million-refs-to-one-list.pickle", pickle_body(b"]\x94(" + fill(b"h\x00", MIB - 8) + b"l")
    # A million MARKs never closed.
    yield "pickle-a-million-marks.pickle", pickle_body(fill(b"("))
    # Nesting to just under the limit, closed, again and again.
    deep = b"]" * 250 + b"a" * 249 + b"0"
    yield "pickle-nested-250-again-and-again.pickle", pickle_body(b"N" + fill(deep))
    # Memo stores at huge, scattered indices.
    puts = bytearray()
    i = 0
    while len(puts) < MIB:
        puts += b"K\x07r" + struct.pack("<I", (i * 2654435761) & 0xFFFFFFF0) + b"0"
        i += 1
    yield "pickle-scattered-memo-indices.pickle", pickle_body(bytes(puts))
    # One dict with a hundred thousand keys, all the same key.
    d = b"}\x94\x8c\x01k\x940(" + fill(b"h\x01K\x01", MIB - 16) + b"u"
    yield "pickle-dict-of-one-key-repeated.pickle", pickle_body(d)
    # A string whose length prefix claims 4 GiB, then the file ends.
    yield "pickle-lying-length.pickle", b"\x80\x04X\xff\xff\xff\xff" + b"a" * (MIB - 8)
    # A snapshot whose trace holds 30,000 tiny entries that all refer to one frames list.
    entry = (b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addr\x4a\x00\x10\x00\x00\x8c\x04size\x4b\x10"
             b"\x8c\x06stream\x4b\x00\x8c\x06frames]u")
    trace = b"}(\x8c\x08segments]\x8c\x0ddevice_traces](" + b"](" + fill(entry, MIB - 64) + b"eeu"
    yield "pickle-thirty-thousand-tiny-entries.pickle", pickle_body(trace)
    # Text: one 1 MiB line that keeps almost saying the OOM message.
    yield "log-one-long-line.log", fill(b"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ")
    # The OOM message itself, 5,000 times.
    msg = (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           b"79.10 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.03 GiB memory in "
           b"use. Of the allocated memory 70.12 GiB is allocated by PyTorch, and 6.41 GiB is reserved by PyTorch but "
           b"unallocated.\n")
    yield "log-the-message-five-thousand-times.log", fill(msg)
    # nvidia-smi CSV: the header, then rows with ever more columns.
    header = b"timestamp, index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n"
    yield "smi-a-header-then-wide-rows.csv", header + fill(b"2026/01/01 00:00:00.000, 0, " + b"x, " * 200 + b"\n")
    # A default-table frame repeated: every line looks like the start of a table.
    table = (b"+-----------------------------------------------------------------------------------------+\n"
             b"| NVIDIA-SMI 590.48.01              Driver Version: 590.48.01      CUDA Version: 13.1     |\n")
    yield "smi-table-headers-only.txt", fill(table)
    # nsys CSV: a quote opened and never closed, then a megabyte of commas.
    yield "nsys-open-quote.csv", b'Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"' + fill(b",")
    # ncu CSV: the details header, then one row with a hundred thousand cells.
    ncu = (b'"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
           b'"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')
    yield "ncu-a-very-wide-row.csv", ncu + fill(b'"0",')


def main(out):
    os.makedirs(out, exist_ok=True)
    for name, data in cases():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
