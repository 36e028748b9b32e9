#!/usr/bin/env python3
"""Stack frames of the BPF functions in the eBPF object, and the deepest
chain of calls from a program, as the verifier adds them up (its limit:
512 bytes for the whole chain).

    tools/bpf-stack-depth.py [OBJECT] [PROGRAM] [FUNCTION...]

OBJECT defaults to target/bpf/sluice.bpf.o, PROGRAM to sl_ingress. Prints
the deepest chain from PROGRAM with each frame, then the frame of every
function whose (mangled) name contains one of FUNCTION. A frame is the
deepest `r10 - N` a function touches, rounded up to 16 as the verifier
does for JITed programs. Calls are read from `llvm-objdump -dr`: a call
into `.text` carries its target as the instruction's immediate plus one.
Run it after `cargo xtask build-ebpf` when the verifier says "combined
stack size of N calls is M. Too large".
"""
import re
import subprocess
import sys


def parse(obj):
    out = subprocess.run(["llvm-objdump", "-dr", "--no-show-raw-insn", obj],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    section = fn = None
    starts, frames, calls = {}, {}, {}
    for i, line in enumerate(out):
        m = re.match(r"^Disassembly of section (\S+):", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^([0-9a-f]+) <(.+)>:", line)
        if m:
            fn = m.group(2)
            starts[(section, int(m.group(1), 16) // 8)] = fn
            frames.setdefault(fn, 0)
            calls.setdefault(fn, [])
            continue
        if fn is None:
            continue
        for n in re.findall(r"\(r10 - 0x([0-9a-f]+)\)", line):
            frames[fn] = max(frames[fn], int(n, 16))
        for n in re.findall(r"\(r10 - (\d+)\)", line):
            frames[fn] = max(frames[fn], int(n))
        m = re.match(r"^\s+(\d+):\s+call (-?\d+)", line)
        if not m:
            continue
        nxt = out[i + 1] if i + 1 < len(out) else ""
        r = re.search(r"R_BPF_64_32\s+(\S+)", nxt)
        if r and r.group(1) == ".text":
            calls[fn].append((".text", int(m.group(2)) + 1))
        elif r:
            calls[fn].append(r.group(1))
        elif section == ".text" and "<" not in line:
            # A call within .text: pc-relative, or a helper (not told
            # apart here; a helper's number is small and rarely a start).
            target = int(m.group(1)) + int(m.group(2)) + 1
            if (".text", target) in starts:
                calls[fn].append((".text", target))
    resolve = lambda c: starts.get(c, "?") if isinstance(c, tuple) else c
    return frames, {f: [resolve(c) for c in cs] for f, cs in calls.items()}


def short(name):
    """`module::function` of a Rust v0 mangled name (`_RNvNtCs<hash>_6crate
    6module8function`: length-prefixed identifiers after the crate hash)."""
    if not name.startswith("_R") or "_" not in name[2:]:
        return name
    rest = name[name.index("_", 2) + 1:]
    parts = []
    while rest:
        m = re.match(r"(\d+)", rest)
        if not m:
            break
        n = int(m.group(1))
        start = len(m.group(1))
        if rest[start:start + 1] == "_":  # an identifier starting with a digit or '_'
            start += 1
        parts.append(rest[start:start + n])
        rest = rest[start + n:]
    return "::".join(parts[-2:]) if parts else name


def main():
    args = sys.argv[1:]
    obj = args.pop(0) if args else "target/bpf/sluice.bpf.o"
    root = args.pop(0) if args else "sl_ingress"
    frames, calls = parse(obj)
    r16 = lambda x: (x + 15) // 16 * 16

    def deepest(f, path):
        here = r16(frames.get(f, 0))
        best = (here, [f])
        for c in calls.get(f, []):
            if c in path or c == f:
                continue
            depth, chain = deepest(c, path + [f])
            if here + depth > best[0]:
                best = (here + depth, [f] + chain)
        return best

    depth, chain = deepest(root, [])
    print(f"deepest chain from {root}: {depth} bytes")
    for f in chain:
        print(f"  {short(f)} {frames.get(f, 0)}")
    for want in args:
        for f in frames:
            if want in f:
                print(f"{short(f)} {frames[f]} -> {', '.join(short(c) for c in calls[f]) or '-'}")


if __name__ == "__main__":
    main()
