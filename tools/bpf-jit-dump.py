#!/usr/bin/env python3
"""Disassemble the JIT images of a loaded BPF program, one file per function.

    sudo tools/bpf-jit-dump.py PROG_ID OUT_DIR

For machines whose bpftool has no disassembler (built without libbfd, as
on the development VMs): reads the images through BPF_OBJ_GET_INFO_BY_FD
(jited_prog_insns, jited_ksyms, jited_func_lens), names each function from
/proc/kallsyms and writes OUT_DIR/<name>.bin and OUT_DIR/<name>.s
(`objdump -b binary`, addresses as the kernel runs them). A sample of
`perf record` at bpf_prog_<tag>_<func>+0xOFF is then the instruction at
that address in <name>.s. x86-64 only.
"""
import ctypes
import os
import struct
import subprocess
import sys

SYS_BPF = 321  # x86-64
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
INFO_SIZE = 256

libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    ret = libc.syscall(SYS_BPF, cmd, buf, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def prog_info(fd, info):
    attr = bytearray(128)
    struct.pack_into("IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    prog_id, out = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    attr = bytearray(128)
    struct.pack_into("I", attr, 0, prog_id)
    fd = bpf(BPF_PROG_GET_FD_BY_ID, attr)

    # First call: the sizes (struct bpf_prog_info offsets, include/uapi/linux/bpf.h).
    info = ctypes.create_string_buffer(INFO_SIZE)
    prog_info(fd, info)
    jited_len = struct.unpack_from("I", info.raw, 16)[0]
    nr_ksyms, nr_lens = struct.unpack_from("II", info.raw, 104)
    if jited_len == 0:
        sys.exit("no JIT image (is net.core.bpf_jit_enable on, and are you root?)")

    # Second call: the image, the functions' addresses and lengths.
    image = ctypes.create_string_buffer(jited_len)
    ksyms = (ctypes.c_uint64 * nr_ksyms)()
    lens = (ctypes.c_uint32 * nr_lens)()
    info = ctypes.create_string_buffer(INFO_SIZE)
    struct.pack_into("I", info, 16, jited_len)
    struct.pack_into("Q", info, 24, ctypes.addressof(image))
    struct.pack_into("II", info, 104, nr_ksyms, nr_lens)
    struct.pack_into("QQ", info, 112, ctypes.addressof(ksyms), ctypes.addressof(lens))
    prog_info(fd, info)

    names = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            addr, _, name = line.split()[:3]
            names[int(addr, 16)] = name
    pos = 0
    for addr, length in zip(ksyms, lens):
        name = names.get(addr, hex(addr))
        path = os.path.join(out, name)
        with open(path + ".bin", "wb") as f:
            f.write(image.raw[pos : pos + length])
        pos += length
        with open(path + ".s", "w") as f:
            subprocess.run(
                ["objdump", "-D", "-b", "binary", "-mi386:x86-64",
                 f"--adjust-vma={addr:#x}", path + ".bin"],
                stdout=f, check=True)
        print(f"{name} {addr:#x} {length} bytes")


if __name__ == "__main__":
    main()
