#!/usr/bin/env python3
"""Test tool, not part of the engine: turns one CUDA source file of engine/cuda/ into
C++ that the CPU emulator of tests/cuda_emu runs (see emu_runtime.c).

    xform.py IN.cu OUT.cpp

Only two constructs are not C++ with the built-ins of cuda_runtime.h:
  kernel<<<grid, block[, smem[, stream]]>>>(args);
      -> emu_launch((const void *)kernel, "kernel", [=]() { kernel(args); },
                    grid, block[, smem[, stream]]);
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
        args = src[j + 1:k - 1]
        out.append(src[pos:m.start()])
        out.append('emu_launch((const void *)%s, "%s", [=]() { %s(%s); }, %s)'
                   % (kernel, kernel, kernel, args, config))
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
