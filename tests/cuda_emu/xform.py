#!/usr/bin/env python3
"""Test tool, not part of the engine: turns one CUDA source file of engine/cuda/ into
C++ that the CPU emulator of tests/cuda_emu runs (see emu_runtime.c).

    xform.py IN.cu OUT.cpp

Only two constructs are not C++ with the built-ins of cuda_runtime.h:
  kernel<<<grid, block[, smem[, stream]]>>>(a, b, ...);
      -> emu_launch((const void *)kernel, "kernel",
                    [emu_k = kernel, emu_a0 = (a), emu_a1 = (b), ...]() { emu_k(emu_a0, emu_a1, ...); },
                    grid, block[, smem[, stream]]);
     (the kernel and each argument evaluated at the launch, as CUDA does: the grid runs
     later, on its stream's thread, when what an argument read, a local of the launcher,
     may be gone)
  extern __shared__ T name[];
      -> T *name = (T *)emu_dyn_smem;
Line breaks are kept and a #line directive names the original file, so compiler
messages and sanitizer reports point at the .cu source. Anything left that looks like
a launch is an error, rather than a kernel that silently does not run."""
import re
import sys

LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*<<<")
DYN_SHARED = re.compile(r"\bextern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;")


def closing(src, i, open_ch, close_ch):
    """Index just past the bracket that closes the one before src[i]."""
    depth = 1
    while depth:
        if i >= len(src):
            raise SystemExit("xform.py: unbalanced %s%s" % (open_ch, close_ch))
        depth += {open_ch: 1, close_ch: -1}.get(src[i], 0)
        i += 1
    return i


def split_args(args):
    """The top-level comma-separated pieces of a call's argument list."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    if args.strip():
        parts.append(args[start:])
    return parts


def rewrite_launches(src, path):
    out, pos = [], 0
    for m in LAUNCH.finditer(src):
        if m.start() < pos:
            continue
        kernel = m.group(1)
        end_cfg = src.find(">>>", m.end())
        config = src[m.end():end_cfg]
        j = end_cfg + 3
        while src[j].isspace():
            j += 1
        if src[j] != "(":
            raise SystemExit("%s: launch of %s without arguments" % (path, kernel))
        k = closing(src, j + 1, "(", ")")
        args = split_args(src[j + 1:k - 1])
        captures = ", ".join("emu_a%d = (%s)" % (i, a) for i, a in enumerate(args))
        names = ", ".join("emu_a%d" % i for i in range(len(args)))
        out.append(src[pos:m.start()])
        # the kernel too: it may be a launcher's local function pointer
        out.append('emu_launch((const void *)%s, "%s", [emu_k = %s%s]() { emu_k(%s); }, %s)'
                   % (kernel, kernel, kernel, ", " + captures if captures else "", names,
                      config))
        pos = k
    out.append(src[pos:])
    return "".join(out)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: xform.py IN.cu OUT.cpp")
    path, dest = sys.argv[1], sys.argv[2]
    with open(path) as f:
        src = f.read()
    src = DYN_SHARED.sub(r"\1 *\2 = (\1 *)emu_dyn_smem;", src)
    src = rewrite_launches(src, path)
    if "<<<" in src or ">>>" in src:
        raise SystemExit("%s: a launch xform.py did not understand" % path)
    with open(dest, "w") as f:
        f.write('#line 1 "%s"\n' % path)
        f.write(src)


if __name__ == "__main__":
    main()
