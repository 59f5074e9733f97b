#!/bin/bash
# Run on the GPU machine, from the repository root:  bash benchmarks/gpu/prepare.sh
#
# Makes gptc buildable there without installing anything: the GPU machine has CUDA and
# PyTorch but most likely no Open MPI, HDF5 or OpenBLAS, and no network. The
# Debian 12 .deb files that fetch_debs.sh put in benchmarks/gpu/debs/ (carried along as an
# ignored path) are unpacked with dpkg -x into a private prefix, repaired where dpkg's
# maintainer scripts would have done the work, and described in $PREFIX/env.sh:
#
#   . "$PREFIX/env.sh"; cmake -S . -B build-gpu $GPTC_CMAKE_ARGS -DGPTC_NCCL_ROOT=$GPTC_NCCL_ROOT
#
# A component the machine already has (mpicc + mpirun, HDF5, OpenBLAS with OpenMP) is
# taken from the system and its .debs are not unpacked.
#
# Environment:
#   GPTC_GPU_PREFIX        where to unpack (default: $PWD/.gpu-prefix)
#   GPTC_GPU_DEBS          the .deb folder (default: benchmarks/gpu/debs)
#   GPTC_GPU_FORCE_PREFIX  1: take every component from the prefix, and keep the prefix's
#                          copy of every library (a test of the prefix on a machine that
#                          has the packages installed, like the development machine)
#   GPTC_GPU_SELFTEST      0: skip the MPI + HDF5 test program
# Exit status: 0 when env.sh is written and mpirun and the test program work.
# shellcheck disable=SC1090  # env.sh is generated; its path is known only at run time
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=$(realpath -m "${GPTC_GPU_PREFIX:-$PWD/.gpu-prefix}")
DEBS=${GPTC_GPU_DEBS:-$HERE/debs}
FORCE=${GPTC_GPU_FORCE_PREFIX:-0}
ARCH=x86_64-linux-gnu           # the .debs are amd64 and Debian-multiarch laid out
U=$PREFIX/usr
ULIB=$U/lib/$ARCH

mkdir -p "$PREFIX" || { echo "prepare: cannot create $PREFIX" >&2; exit 1; }
SUMMARY=$PREFIX/prepare-summary.txt
: > "$SUMMARY"
say() { echo "prepare: $*"; }
fact() { printf '%-22s %s\n' "$1:" "$2" | tee -a "$SUMMARY"; }
STATUS=0
fail() { echo "prepare: FAILED: $*" >&2; fact "problem" "$*"; STATUS=1; }

# ---------------------------------------------------------------------------- machine facts
. /etc/os-release 2>/dev/null
fact "os" "${PRETTY_NAME:-unknown} (${ID:-?} ${VERSION_ID:-?})"
GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
fact "glibc" "${GLIBC:-unknown}"
fact "kernel" "$(uname -r)"
fact "cpus" "$(nproc 2>/dev/null)"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"     # CUDA images often leave it off PATH
fi
NVCC=$(command -v nvcc || true)
fact "nvcc" "${NVCC:-not found} $( [ -n "$NVCC" ] && "$NVCC" --version | sed -n 's/.*release \([^,]*\),.*/\1/p')"
fact "gcc" "$(gcc -dumpfullversion 2>/dev/null || echo 'not found')"
fact "cmake" "$(cmake --version 2>/dev/null | head -1 || true)"
GPU_LINE=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)
[ -z "$GPU_LINE" ] && GPU_LINE=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
fact "gpu" "${GPU_LINE:-none (nvidia-smi failed)}"
# sm_90 for H100/H200; from compute_cap where the driver reports it
CUDA_ARCH=$(echo "$GPU_LINE" | awk -F', *' 'NF >= 4 && $4 ~ /^[0-9]+\.[0-9]+$/ { sub(/\./, "", $4); print $4 }')
CUDA_ARCH=${GPTC_CUDA_ARCH:-${CUDA_ARCH:-90}}
PY=$(command -v python3 || true)
TORCH=$([ -n "$PY" ] && "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)
fact "torch" "${TORCH:-not importable}"

# ---------------------------------------------------------------------------- what the system has
# Detection is deliberately strict: a component counts as present only if it can be
# used as is (a library without its headers or wrapper does not count).
SYS_MPI=0; SYS_HDF5=0; SYS_BLAS=0; SYS_PKGCONF=0; SYS_MAKE=0; SYS_CMAKE=0
if [ "$FORCE" != 1 ]; then
  mpicc --showme:version >/dev/null 2>&1 && mpirun --version >/dev/null 2>&1 && SYS_MPI=1
  { [ -f /usr/include/hdf5/serial/hdf5.h ] && [ -f /usr/lib/$ARCH/hdf5/serial/libhdf5.so ]; } ||
    { [ -f /usr/include/hdf5.h ] && [ -f /usr/lib/$ARCH/libhdf5.so ]; } && SYS_HDF5=1
  [ -f /usr/lib/$ARCH/openblas-openmp/libopenblas.so ] && [ -f /usr/include/$ARCH/openblas-openmp/cblas.h ] && SYS_BLAS=1
  command -v make >/dev/null && SYS_MAKE=1
  command -v cmake >/dev/null && SYS_CMAKE=1
fi
command -v pkg-config >/dev/null && SYS_PKGCONF=1   # any pkg-config reads our .pc files
src() { [ "$1" = 1 ] && echo system || echo prefix; }
fact "open mpi" "$(src $SYS_MPI)"
fact "hdf5" "$(src $SYS_HDF5)"
fact "openblas (openmp)" "$(src $SYS_BLAS)"

# Which component a .deb belongs to: its files are unpacked only when the system lacks
# the component. "lib" = a general-purpose library (OpenSSL, curl, krb5, libgomp, ...):
# where the system has the same soname, the system's copy is used (see dedup below).
component() {
  case $1 in
    openmpi-*|libopenmpi*|libpmix*|libhwloc*|libevent*|libfabric*|libucx*|libibverbs*|\
    ibverbs-providers|librdmacm*|libpsm*|libnl-*|libmunge*|libnuma*) echo mpi ;;
    hdf5-*|libhdf5*|libsz2|libaec*) echo hdf5 ;;
    libopenblas*) echo blas ;;
    pkgconf*|libpkgconf*|pkg-config) echo pkgconf ;;
    make) echo make ;;
    cmake|cmake-data) echo cmake ;;
    *) echo lib ;;
  esac
}
wanted() {
  case $1 in
    mpi) [ $SYS_MPI = 0 ] ;; hdf5) [ $SYS_HDF5 = 0 ] ;;
    blas) [ $SYS_BLAS = 0 ] ;; pkgconf) [ $SYS_PKGCONF = 0 ] ;; make) [ $SYS_MAKE = 0 ] ;;
    cmake) [ $SYS_CMAKE = 0 ] ;; lib) return 0 ;;
  esac
}
NEED_PREFIX=0
for c in mpi hdf5 blas pkgconf make; do wanted $c && NEED_PREFIX=1; done
# cmake is carried only on request (GPTC_DEBS_EXTRA=cmake in fetch_debs.sh)
ls "$DEBS"/cmake_*.deb >/dev/null 2>&1 && wanted cmake && NEED_PREFIX=1

# ---------------------------------------------------------------------------- unpack
LDCACHE=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk '/x86-64/ { print $1, $NF }')
sys_lib() {   # path of a usable system library with this soname, or nothing
  local p
  p=$(echo "$LDCACHE" | awk -v n="$1" '$1 == n { print $2; exit }')
  [ -n "$p" ] && [ -f "$p" ] && [ -s "$p" ] && echo "$p"
}

deb_field() { dpkg-deb -f "$1" "$2" 2>/dev/null; }
unpack_deb() {  # dpkg -x, or ar + tar where dpkg-deb is missing
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$PREFIX"; return; fi
  local m; m=$(ar t "$1" | grep '^data\.tar') || return 1
  case $m in
    *.xz) ar p "$1" "$m" | tar -xJ -C "$PREFIX" ;;
    *.zst) ar p "$1" "$m" | zstd -dc | tar -x -C "$PREFIX" ;;
    *) ar p "$1" "$m" | tar -xz -C "$PREFIX" ;;
  esac
}

STAMP_WANT="$(cat "$DEBS/MANIFEST.txt" 2>/dev/null | md5sum | cut -c1-32) force=$FORCE mpi=$SYS_MPI hdf5=$SYS_HDF5 blas=$SYS_BLAS pc=$SYS_PKGCONF make=$SYS_MAKE cmake=$SYS_CMAKE"
if [ "$NEED_PREFIX" = 1 ]; then
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
    fail "no .deb files in $DEBS: run fetch_debs.sh on the dev machine and carry benchmarks/gpu/debs"
  elif [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" = "$STAMP_WANT" ]; then
    say "prefix $PREFIX is up to date"
  else
    # Wiped first, but only a folder this script made (a stamp) or an empty one: a
    # mistyped GPTC_GPU_PREFIX must not cost anybody their files. (.made-by-prepare marks ours.)
    if [ ! -f "$PREFIX/.made-by-prepare" ] && [ -n "$(find "$PREFIX" -mindepth 1 -maxdepth 1 ! -name prepare-summary.txt -print -quit)" ]; then
      echo "prepare: $PREFIX is not empty and was not made by prepare.sh; not touching it" >&2
      exit 1
    fi
    say "unpacking into $PREFIX"
    find "$PREFIX" -mindepth 1 -maxdepth 1 ! -name prepare-summary.txt -exec rm -rf {} +
    touch "$PREFIX/.made-by-prepare"
    DEDUP_CANDIDATES=()
    ALT_PAIRS=""
    n=0
    for deb in "$DEBS"/*.deb; do
      pkg=$(deb_field "$deb" Package); [ -z "$pkg" ] && pkg=$(basename "$deb" | cut -d_ -f1)
      comp=$(component "$pkg")
      wanted "$comp" || continue
      unpack_deb "$deb" || { fail "cannot unpack $deb"; continue; }
      n=$((n + 1))
      if [ "$comp" = lib ] && [ "$FORCE" != 1 ]; then
        while read -r f; do DEDUP_CANDIDATES+=("$PREFIX/${f#./}"); done < <(
          dpkg-deb -c "$deb" 2>/dev/null | awk '{ print $6 }' | grep -E '/lib[^/]*\.so\.[0-9]+$')
      fi
      # update-alternatives calls in postinst make the generic names (mpicc, mpirun,
      # libopenblas.so.0, cblas.h, libpsm_infinipath.so.1, hdf5.pc); dpkg -x runs none.
      ALT_PAIRS+=$(dpkg-deb --ctrl-tarfile "$deb" 2>/dev/null | tar -xO --wildcards '*postinst' 2>/dev/null |
        sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep 'update-alternatives' |
        awk '{ for (i = 1; i <= NF; i++) if ($i == "--install" || $i == "--slave") print $(i+1), $(i+3) }')
      ALT_PAIRS+=$'\n'
    done
    say "unpacked $n packages"

    # Alternatives: link -> target, both inside the prefix; a target that is not there
    # (the MPI variant of HDF5, man pages) or a shell variable is skipped.
    while read -r link target; do
      [ -z "$link" ] && continue
      case "$link$target" in *'$'*|*'"'*) continue ;; esac
      [ -e "$PREFIX$target" ] || continue
      [ -e "$PREFIX$link" ] || [ -L "$PREFIX$link" ] && continue
      mkdir -p "$(dirname "$PREFIX$link")" && ln -sr "$PREFIX$target" "$PREFIX$link"
    done <<< "$ALT_PAIRS"

    # Absolute symlinks shipped in the .debs (e.g. libz.so -> /lib/.../libz.so.1.2.13):
    # into the prefix where the target is there, else to the system's library of the
    # same soname (zlib is not carried: every image has it, in its own version).
    while read -r l; do
      t=$(readlink "$l")
      if [ -e "$PREFIX$t" ]; then ln -sfr "$PREFIX$t" "$l"
      elif [ -e "$t" ]; then :
      else
        so=$(basename "$t" | sed -E 's/(\.so\.[0-9]+).*/\1/')
        p=$(sys_lib "$so")
        if [ -n "$p" ]; then ln -sf "$p" "$l"; else say "warning: dangling $l -> $t"; fi
      fi
    done < <(find "$PREFIX" -type l -lname '/*')

    # pkg-config files and h5cc name /usr literally (prefix=/usr, -I/usr/include/...).
    while read -r pc; do
      sed -i -e "s#=/usr\\([/ ]\\|\$\\)#=$U\\1#g" -e "s#-I/usr/#-I$U/#g" -e "s#-L/usr/#-L$U/#g" "$pc"
    done < <(find "$PREFIX" -name '*.pc' -type f)
    for h in "$U"/bin/h5cc "$U"/bin/h5c++ "$U"/bin/h5fc; do
      [ -f "$h" ] && sed -i "s#^prefix=\"/usr\"#prefix=\"$U\"#" "$h"
    done

    # Where the system has a library of the same soname as a general-purpose one we
    # carry (OpenSSL, curl, krb5, libgomp, libgfortran, ...), use the system's: the
    # prefix goes on LD_LIBRARY_PATH, which every program started from env.sh sees
    # (cmake, python, nvcc), and those must keep their own OpenSSL and curl. gptc and
    # OpenBLAS then share the compiler's libgomp (one OpenMP thread pool). Open MPI,
    # HDF5 and OpenBLAS themselves are always the prefix's own, with their
    # exact dependencies (hwloc, libevent, PMIx).
    nd=0
    for f in "${DEDUP_CANDIDATES[@]}"; do
      [ -e "$f" ] || [ -L "$f" ] || continue
      p=$(sys_lib "$(basename "$f")")
      [ -z "$p" ] && continue
      mkdir -p "$PREFIX/shadowed"; mv "$f" "$PREFIX/shadowed/" 2>/dev/null
      ln -sf "$p" "$f"; nd=$((nd + 1))
    done
    fact "libs from system" "$nd of ${#DEDUP_CANDIDATES[@]} general-purpose sonames (copies kept in $PREFIX/shadowed)"
    echo "$STAMP_WANT" > "$PREFIX/.stamp"
  fi
fi

# ---------------------------------------------------------------------------- NCCL
# PyTorch's wheel ships NCCL as site-packages/nvidia/nccl/{include,lib}; nvidia.nccl is a
# namespace package (no __file__), hence __path__. The wheel has libnccl.so.2 only, so
# a linkable root with libnccl.so is made in the prefix.
NCCL_SITE=""; hdr=""
if [ -n "${GPTC_NCCL_ROOT:-}" ]; then
  NCCL_SITE=$GPTC_NCCL_ROOT
elif [ -n "$PY" ]; then
  NCCL_SITE=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -z "$NCCL_SITE" ]; then
    for sp in $("$PY" -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
      [ -d "$sp/nvidia/nccl" ] && { NCCL_SITE=$sp/nvidia/nccl; break; }
    done
  fi
fi
# else the CUDA toolkit's own (some installs add NCCL there), else the system's
if [ -z "$NCCL_SITE" ] && [ -n "$NVCC" ] && [ -f "$(dirname "$(dirname "$NVCC")")/include/nccl.h" ]; then
  NCCL_SITE=$(dirname "$(dirname "$NVCC")")
fi
if [ -z "$NCCL_SITE" ] && [ -f /usr/include/nccl.h ]; then NCCL_SITE=/usr; fi
NCCL_ROOT=""; NCCL_LIBDIR=""; NCCL_VERSION=unknown
if [ -n "$NCCL_SITE" ]; then
  hdr=$(ls "$NCCL_SITE"/include/nccl.h 2>/dev/null | head -1)
  lib=$(ls "$NCCL_SITE"/lib/libnccl.so* "$NCCL_SITE"/lib/$ARCH/libnccl.so* "$NCCL_SITE"/lib64/libnccl.so* 2>/dev/null | head -1)
  if [ -n "$hdr" ]; then
    NCCL_VERSION=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{ v[$2] = $3 }
      END { if (v["NCCL_MAJOR"] != "") print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"] }' "$hdr")
  fi
  if [ -z "$NCCL_VERSION" ] || [ "$NCCL_VERSION" = unknown ]; then
    NCCL_VERSION=$(ls "$NCCL_SITE"/lib/libnccl.so.2.* 2>/dev/null | sed -n 's/.*libnccl\.so\.//p' | head -1)
    [ -z "$NCCL_VERSION" ] && [ -n "$PY" ] &&
      NCCL_VERSION=$("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)
  fi
  if [ -n "$lib" ]; then
    NCCL_LIBDIR=$(dirname "$lib")
    if [ -e "$NCCL_LIBDIR/libnccl.so" ]; then
      NCCL_ROOT=$NCCL_SITE
    else
      NCCL_ROOT=$PREFIX/nccl
      rm -rf "$NCCL_ROOT"; mkdir -p "$NCCL_ROOT/lib"
      ln -s "$NCCL_SITE/include" "$NCCL_ROOT/include"
      for f in "$NCCL_LIBDIR"/libnccl*; do ln -s "$f" "$NCCL_ROOT/lib/"; done
      [ -e "$NCCL_ROOT/lib/libnccl.so" ] || ln -s "$(ls "$NCCL_LIBDIR"/libnccl.so.* | head -1)" "$NCCL_ROOT/lib/libnccl.so"
    fi
  fi
fi
fact "nccl" "${NCCL_VERSION:-unknown} at ${NCCL_SITE:-not found} (header: ${hdr:-none}; GPTC_NCCL_ROOT=${NCCL_ROOT:-none})"
[ -z "$NCCL_ROOT" ] && fail "NCCL not found (no nvidia/nccl in python3's site-packages, no /usr/include/nccl.h)"

CUPTI_DIR=""
for d in "${CUDA_HOME:-/usr/local/cuda}/extras/CUPTI/lib64" "${CUDA_HOME:-/usr/local/cuda}/targets/x86_64-linux/lib" /usr/lib/$ARCH; do
  ls "$d"/libcupti.so* >/dev/null 2>&1 && { CUPTI_DIR=$d; break; }
done
fact "cupti" "${CUPTI_DIR:-not found}"

# ---------------------------------------------------------------------------- env.sh
# Library folders of the prefix, most specific first. openmpi/lib: libmpi.so.40 has
# RUNPATH /usr/lib/.../openmpi/lib, which LD_LIBRARY_PATH must override.
LIBDIRS=""
for d in "$ULIB/openmpi/lib" "$ULIB" "$PREFIX/lib/$ARCH" "$ULIB/openblas-openmp" "$U/lib/libpsm1"; do
  [ -d "$d" ] && LIBDIRS+="$d:"
done
case $NCCL_LIBDIR in
  */nvidia/nccl/lib) LIBDIRS+="$NCCL_LIBDIR:" ;;   # the wheel's: torch loads the same file
esac
# Not CUDA's or CUPTI's lib folders: PyTorch's wheels carry their own CUDA libraries,
# and a system cuBLAS/cuSPARSE ahead of them on LD_LIBRARY_PATH breaks `import torch`
# (undefined __nvJitLink symbols). NCCL's folder goes on it only when it is the wheel's.

CMAKE_ARGS=""
MPICC=$(command -v mpicc 2>/dev/null)
if [ $SYS_MPI = 0 ]; then
  MPICC=$U/bin/mpicc
  CMAKE_ARGS+=" -DMPI_C_COMPILER=$MPICC -DMPIEXEC_EXECUTABLE=$U/bin/mpiexec"
fi
if [ $SYS_HDF5 = 0 ]; then
  H5_INC=$U/include/hdf5/serial; H5_LIB=$ULIB/hdf5/serial
  CMAKE_ARGS+=" -DHDF5_C_COMPILER_EXECUTABLE=$U/bin/h5cc"
else
  H5_INC=$(dirname "$(ls /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h 2>/dev/null | head -1)")
  H5_LIB=$(dirname "$(ls /usr/lib/$ARCH/hdf5/serial/libhdf5.so /usr/lib/$ARCH/libhdf5.so 2>/dev/null | head -1)")
fi
if [ $SYS_BLAS = 0 ]; then
  # CMakeLists looks for the OpenMP OpenBLAS in /usr/lib/<arch>/openblas-openmp only
  # (NO_DEFAULT_PATH): name it, and its cblas.h.
  CMAKE_ARGS+=" -DOPENBLAS_OPENMP=$ULIB/openblas-openmp/libopenblas.so -DCBLAS_INCLUDE_DIR=$U/include/$ARCH/openblas-openmp"
fi
CMAKE_ARGS+=" -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"
[ -n "$NVCC" ] && CMAKE_ARGS+=" -DCMAKE_CUDA_COMPILER=$NVCC"

ENV_SH=$PREFIX/env.sh
{
  echo "# written by benchmarks/gpu/prepare.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ); source it"
  echo "export GPTC_GPU_PREFIX='$PREFIX'"
  [ -n "$NVCC" ] && echo "export PATH=\"$(dirname "$NVCC"):\$PATH\"" && echo "export CUDACXX='$NVCC'"
  # first: only what the system lacks was unpacked (a system mpicc without a working
  # mpirun counts as lacking, and must lose)
  [ "$NEED_PREFIX" = 1 ] && echo "export PATH=\"$U/bin:\$PATH\""
  # no empty element: an empty entry in LD_LIBRARY_PATH means the current directory
  LIBDIRS=${LIBDIRS%:}
  [ -n "$LIBDIRS" ] && echo "export LD_LIBRARY_PATH=\"$LIBDIRS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  if [ "$NEED_PREFIX" = 1 ]; then
    echo "export PKG_CONFIG_PATH=\"$ULIB/pkgconfig:$U/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
    echo "export CMAKE_PREFIX_PATH=\"$U\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}\""
  fi
  if [ $SYS_MPI = 0 ]; then
    # Debian's Open MPI was configured with --prefix=/usr and keeps every path relative
    # to it (libdir = \${prefix}/lib/x86_64-linux-gnu/openmpi/lib, the MCA plugins in
    # .../openmpi3, help and wrapper data in share/openmpi), so OPAL_PREFIX is the
    # prefix's usr, not .../openmpi. Only sysconfdir (/etc/openmpi) is absolute.
    echo "export OPAL_PREFIX='$U'"
    echo "export OPAL_SYSCONFDIR='$PREFIX/etc/openmpi'"
    # PMIx (built with --prefix=/usr/lib/<arch>/pmix2) finds its plugins from this
    echo "export PMIX_INSTALL_PREFIX='$ULIB/pmix2'"
    echo "export PMIX_MCA_mca_base_component_path='$ULIB/pmix2/lib/pmix'"
  fi
  echo "export HDF5_ROOT='$H5_LIB'"
  echo "export GPTC_HDF5_INCLUDE_DIR='$H5_INC' GPTC_HDF5_LIBRARY_DIR='$H5_LIB'"
  # mpirun as root (the GPU machine runs us as root)
  echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  # containers forbid the cross-process memory copy (CMA) vader tries first
  echo "export OMPI_MCA_btl_vader_single_copy_mechanism=none"
  if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then
    # Open MPI 4 refuses to start without a remote shell even for local ranks
    echo "export OMPI_MCA_plm_rsh_agent=false"
  fi
  echo "export GPTC_NCCL_ROOT='$NCCL_ROOT' GPTC_NCCL_VERSION='$NCCL_VERSION'"
  echo "export GPTC_CUDA_ARCH='$CUDA_ARCH' GPTC_CUPTI_DIR='$CUPTI_DIR'"
  echo "export GPTC_CMAKE_ARGS='${CMAKE_ARGS# }'"
} > "$ENV_SH"
fact "env" "$ENV_SH"
fact "cmake args" "${CMAKE_ARGS# }"

# ---------------------------------------------------------------------------- checks
# In a subshell so that this script's own environment stays as it was.
MPIRUN_V=$( . "$ENV_SH"; mpirun --version 2>&1 | head -1 )
if ( . "$ENV_SH"; mpirun --version >/dev/null 2>&1 ); then
  fact "mpirun --version" "ok: $MPIRUN_V ($( . "$ENV_SH"; command -v mpirun))"
else
  fail "mpirun --version does not run: $MPIRUN_V"
  if [ -n "$GLIBC" ] && [ "$(printf '%s\n2.34\n' "$GLIBC" | sort -V | head -1)" != 2.34 ]; then
    fact "hint" "glibc $GLIBC is older than 2.34, which the bookworm .debs need"
  fi
fi
# Libraries of the prefix that do not load here (glibc too old, a missing dependency):
# ldd names them. Open MPI's plugins are left out: those for hardware we lack
# (verbs, psm) are allowed not to load.
if [ "$NEED_PREFIX" = 1 ] && [ -d "$ULIB" ]; then
  BAD=$( . "$ENV_SH"
    for f in "$U"/bin/mpirun.openmpi "$U"/bin/orted "$ULIB"/libmpi.so.40 "$ULIB"/libhdf5_serial.so.103 \
             "$ULIB"/openblas-openmp/libopenblas.so.0; do
      [ -e "$f" ] || continue
      ldd "$f" 2>&1 | grep -E 'not found|version .* not found' | sed "s#^#$(basename "$f"): #"
    done | sort -u)
  if [ -n "$BAD" ]; then
    fail "unresolved libraries in the prefix"; echo "$BAD" | sed 's/^/  /' | tee -a "$SUMMARY"
  else
    fact "ldd of prefix libs" "all resolved"
  fi
fi
# The end-to-end check: an MPI + HDF5 program built with mpicc, run by mpirun on 2 ranks.
if [ "${GPTC_GPU_SELFTEST:-1}" != 0 ]; then
  T=$PREFIX/selftest; mkdir -p "$T"
  cat > "$T/h5mpi.c" <<'EOF'
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
  char name[256]; snprintf(name, sizeof name, "%s.%d.h5", argc > 1 ? argv[1] : "selftest", rank);
  hid_t f = H5Fcreate(name, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t n = 4; int w[4] = {rank, rank + 1, rank + 2, rank + 3}, r[4] = {0};
  hid_t s = H5Screate_simple(1, &n, NULL);
  hid_t d = H5Dcreate2(f, "x", H5T_NATIVE_INT, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w);
  H5Dread(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, r);
  H5Dclose(d); H5Sclose(s); H5Fclose(f);
  int local = r[3], total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  unsigned maj, min, rel; H5get_libversion(&maj, &min, &rel);
  if (rank == 0) printf("h5mpi ok: %d ranks, sum %d, hdf5 %u.%u.%u\n", size, total, maj, min, rel);
  int ok = total == size * (size - 1) / 2 + 3 * size;
  MPI_Finalize();
  return ok ? 0 : 1;
}
EOF
  OUT_TXT=$( . "$ENV_SH"
    "$MPICC" -o "$T/h5mpi" "$T/h5mpi.c" -I"$GPTC_HDF5_INCLUDE_DIR" -L"$GPTC_HDF5_LIBRARY_DIR" -lhdf5 2>&1 &&
    timeout 60 "$(dirname "$MPICC")/mpirun" --oversubscribe -np 2 "$T/h5mpi" "$T/out" 2>&1 )
  if echo "$OUT_TXT" | grep -q 'h5mpi ok'; then
    fact "mpi+hdf5 selftest" "$(echo "$OUT_TXT" | grep 'h5mpi ok')"
  else
    fail "mpi+hdf5 selftest"; echo "$OUT_TXT" | tail -20 | sed 's/^/  /' | tee -a "$SUMMARY"
  fi
fi

say "summary in $SUMMARY; environment in $ENV_SH"
exit $STATUS
