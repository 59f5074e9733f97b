#!/bin/bash
# Run on the Debian 12 development machine, as root, after fetch_debs.sh.
#
# Tests prepare.sh's prefix as the GPU machine will see it: in a private mount namespace
# (unshare -m) every file of the installed Open MPI, HDF5 and OpenBLAS packages and
# their own dependencies (hwloc, libevent, PMIx, ...) is hidden behind /dev/null, so that
# prepare.sh finds none of them, unpacks all three into a fresh prefix, and anything that
# still reached for a system copy would fail. General-purpose libraries (OpenSSL, curl,
# libgomp) stay visible, as they will be on the GPU machine. Then gptc is configured and
# built against the prefix alone and its MPI and HDF5 tests run.
#
# Usage: bash benchmarks/gpu/check_prefix_here.sh [PREFIX [BUILD_DIR]]
#   (defaults /tmp/gpu-prefix-check and /tmp/gpu-build; both are wiped first)
# Nothing outside the namespace changes except those two folders.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PREFIX=${1:-/tmp/gpu-prefix-check}
BUILD=${2:-/tmp/gpu-build}

if [ -z "${GPTC_IN_NS:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "check_prefix_here: needs root (unshare -m)" >&2; exit 1; }
  rm -rf "$PREFIX" "$BUILD"
  GPTC_IN_NS=1 exec unshare -m --propagation private bash "$0" "$PREFIX" "$BUILD"
fi

# --- inside the namespace: hide the packages prepare.sh would otherwise take from the system
PKG_RE='^(openmpi-|libopenmpi|libpmix|libhwloc|libevent|libfabric|libucx|libibverbs|ibverbs-providers|librdmacm|libpsm|libnl-|libmunge|libnuma|hdf5-|libhdf5|libsz2|libaec|libopenblas|libcaf-openmpi|libcoarrays-openmpi)'
mapfile -t PKGS < <(dpkg-query -W -f '${Package}\n' | grep -E "$PKG_RE")
n=0
while read -r f; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  mount --bind /dev/null "$f" && n=$((n + 1))
done < <(dpkg -L "${PKGS[@]}" 2>/dev/null | sort -u | grep -vE '^/usr/share/(doc|man|lintian)/')
echo "check_prefix_here: hid $n files of ${#PKGS[@]} packages"
if mpirun --version >/dev/null 2>&1 || [ -f /usr/include/hdf5/serial/hdf5.h ]; then
  echo "check_prefix_here: the system's Open MPI/HDF5 is still visible; giving up" >&2; exit 1
fi

STATUS=0
step() { echo; echo "=== $*"; }

step "prepare.sh into $PREFIX"
( cd "$REPO" && GPTC_GPU_PREFIX=$PREFIX bash benchmarks/gpu/prepare.sh ) || {
  echo "(prepare.sh exits 1 here when only NCCL is missing, which this machine lacks)"; }
[ -f "$PREFIX/env.sh" ] || { echo "no env.sh" >&2; exit 1; }
. "$PREFIX/env.sh"

step "cmake configure of $REPO into $BUILD"
# shellcheck disable=SC2086  # GPTC_CMAKE_ARGS is a list of -D flags
# The CUDA backend is off by default here: this checks the prefix, and a CUDA build on
# 2 cores is slow (GPTC_CHECK_CMAKE_EXTRA="" builds it too, where nvcc exists).
cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $GPTC_CMAKE_ARGS \
  ${GPTC_CHECK_CMAKE_EXTRA--DGPTC_CUDA=OFF} > "$BUILD.configure.log" 2>&1
rc=$?
grep -E 'Found (MPI|HDF5|OpenMP)|BLAS:|Error|error' "$BUILD.configure.log"
[ $rc = 0 ] || { echo "configure failed (rc $rc), log $BUILD.configure.log"; tail -30 "$BUILD.configure.log"; exit 1; }
grep -E '^(MPI_C_COMPILER|MPI_mpi_LIBRARY|HDF5_C_LIBRARY_hdf5|HDF5_C_INCLUDE_DIR|OPENBLAS_OPENMP|CBLAS_INCLUDE_DIR)[:=]' \
  "$BUILD/CMakeCache.txt"
bad=$(grep -E '^(MPI_C_COMPILER|MPI_mpi_LIBRARY|HDF5_C_LIBRARY_hdf5|HDF5_C_INCLUDE_DIR|OPENBLAS_OPENMP|CBLAS_INCLUDE_DIR)[:=]' \
      "$BUILD/CMakeCache.txt" | grep -v "$PREFIX")
if [ -n "$bad" ]; then echo "NOT from the prefix:"; echo "$bad"; STATUS=1; else echo "all from the prefix"; fi

step "build"
cmake --build "$BUILD" -j "$(nproc)" > "$BUILD.build.log" 2>&1 || {
  echo "build failed, log $BUILD.build.log"; tail -30 "$BUILD.build.log"; exit 1; }
echo "built"
for b in gptc-train tests/test_comm; do
  [ -e "$BUILD/$b" ] && ldd "$BUILD/$b" | grep -E 'mpi|hdf5|not found' | sed "s#^#$b: #"
done

step "ctest: MPI, HDF5 and config tests"
( cd "$BUILD" && timeout 600 ctest --output-on-failure -R "${GPTC_CHECK_TESTS:-test_comm|test_checkpoint|test_tokens|test_config_errors}" ) || STATUS=1

echo
echo "check_prefix_here: $([ $STATUS = 0 ] && echo PASS || echo FAIL)"
exit $STATUS
