#!/bin/bash
# Run on the Debian 12 development machine (not on the GPU machine, which has no network).
#
# Downloads into benchmarks/gpu/debs/ the Debian bookworm .deb files that gptc needs to
# build and run under mpirun on a machine that lacks them: Open MPI, HDF5 and OpenBLAS
# (OpenMP build), plus their dependency closure. prepare.sh unpacks them there
# with dpkg -x into a private prefix, so nothing is installed and no dependency is checked
# at unpack time: the closure computed here is the only thing that makes the set complete.
#
# The closure is walked one level at a time with `apt-cache depends` (not with
# --recurse): --recurse follows every branch of every "a | b" alternative and walks on
# through the packages we exclude, which drags in gcc, gfortran, flang, LLVM and perl
# (over 200 packages). Here an excluded package ends the walk along that edge, and of an
# alternative group only one member is taken (one we already take, else the first real one).
#
# Usage: bash benchmarks/gpu/fetch_debs.sh [--list]   (--list: print the closure only)
# Environment: GPTC_DEBS_EXTRA="pkg ..." adds packages (e.g. cmake);
#              GPTC_DEBS_NO_BULLSEYE=1 keeps bookworm packages that need glibc 2.36.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST="$HERE/debs"
LIMIT_MIB=60          # the working tree plus carried paths may not exceed 64 MiB

# What we ask for. libopenblas-dev is the generic -dev that depends on one of the variant
# -devs; naming the openmp ones in the seed set makes the alternative walk pick them.
SEEDS=(
  libopenmpi-dev openmpi-bin libopenmpi3 openmpi-common
  libhdf5-dev libhdf5-103-1 libhdf5-hl-100
  libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev libopenblas0
  # pkg-config gives tests/fuzz/run.sh the prefix's HDF5 flags; a CUDA image may lack it.
  pkgconf pkg-config make
)
# GPTC_DEBS_EXTRA: more packages to take, e.g. "cmake" when the GPU machine may have none
# (adds about 13-21 MiB, not re-measured: libarchive pulls in libxml2 and libicu).
# prepare.sh uses a carried program only where the machine has none of its own.
read -r -a EXTRA <<< "${GPTC_DEBS_EXTRA:-}"
SEEDS+=("${EXTRA[@]}")

# Not downloaded, and not walked through. Glob patterns. Four kinds:
#  - in every Ubuntu image (the C/C++ runtime, zlib) or part of the base system that only
#    maintainer scripts use (dpkg, debconf, adduser, ...): dpkg -x never runs those scripts;
#  - the toolchain: the GPU machine has gcc for nvcc; mpicc only wraps it. Open MPI's -dev
#    wants a Fortran compiler for mpifort, which gptc does not use;
#  - the -dev packages of Open MPI's own dependencies (hwloc, libevent, PMIx, verbs, libnl,
#    numa): only a static link of Open MPI needs them; mpicc links the shared -lmpi.
#    HDF5's -dev dependencies stay (zlib1g-dev, libaec-dev, libssl-dev, libcurl-dev):
#    CMake's FindHDF5 takes `h5cc -show`'s -lcrypto -lcurl -lsz -lz and links the
#    unversioned .so of each. libjpeg-dev goes: h5cc names no -ljpeg;
#  - things a single-node run never loads: ssh (mpirun only needs it to reach other
#    hosts; prepare.sh sets plm_rsh_agent when ssh is missing), hwloc's optional plugins
#    (PCI/X11/OpenCL/libxml2 discovery: pull in libicu and X11 for ~15 MiB; hwloc runs
#    without them), and jQuery (HTML docs of hwloc).
EXCLUDE=(
  libc6 libc-bin libc6-dev libc-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev
  libgcc-s1 'libgcc-*-dev' libstdc++6 'libstdc++-*-dev' 'gcc-*-base' zlib1g
  gcc 'gcc-[0-9]*' cpp 'cpp-[0-9]*' gfortran 'gfortran-*' 'flang-*' 'binutils*' 'libbinutils'
  'libasan*' 'liblsan*' 'libtsan*' 'libubsan*' 'libitm*' 'libcc1-*' 'libgfortran-*-dev'
  make autoconf automake autotools-dev m4 libtool 'libltdl-dev'
  perl perl-base 'perl-modules-*' 'libperl*'
  dpkg debconf debconf-2.0 cdebconf debianutils adduser passwd login tar install-info
  'libpam*' libselinux1 'libsemanage*' libsepol2 'libaudit*' libcap-ng0 libacl1
  readline-common libreadline8 libtinfo6 lsb-base sensible-utils usrmerge init-system-helpers
  procps libsystemd0 'lib*-perl'
  libevent-dev libhwloc-dev libpmix-dev libibverbs-dev libnl-3-dev libnl-route-3-dev
  libnuma-dev libjpeg-dev
  openssh-client ssh-client
  libhwloc-plugins
  libjs-jquery libjs-jquery-ui
)

is_excluded() {
  local p=$1 pat
  for pat in "${EXCLUDE[@]}"; do
    # shellcheck disable=SC2053  # glob match on purpose
    [[ $p == $pat ]] && return 0
  done
  return 1
}

command -v apt-cache >/dev/null || { echo "fetch_debs: apt-cache not found (run on Debian 12)" >&2; exit 1; }
if ! apt-cache show libopenmpi3 >/dev/null 2>&1; then
  echo "fetch_debs: apt-cache knows no libopenmpi3: run 'apt-get update' first" >&2
  exit 1
fi
. /etc/os-release 2>/dev/null
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
  echo "fetch_debs: warning: this is ${PRETTY_NAME:-an unknown OS}, not Debian 12 bookworm;" \
       "prepare.sh and the README assume bookworm packages" >&2
fi

# Print the direct dependencies (Depends and PreDepends) of the packages named, one line
# per dependency group: "PKG ALT1 ALT2 ...". apt-cache writes a virtual package as <v>
# with the packages that provide it indented below; those providers become the
# alternatives. One apt-cache call per level of the walk: each call costs about a second.
dep_groups() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "$@" 2>/dev/null |
  awk '
    function add(n) { if (n != "") group = group " " n }
    function out() { if (group != "") print pkg group; group = ""; flush = 0 }
    /^[^ ]/ { out(); pkg = $1; virt = 0; next }          # a package header
    /^ *\|?[A-Za-z]+: / {                               # a relation line
      if (flush) out()
      if ($0 !~ /^ *\|?(Pre)?Depends: /) next
      alt = ($0 ~ /^ *\|/)                              # "|Depends:" = OR-ed with the next line
      virt = ($2 ~ /^</)
      if (!virt) add($2)
      if (!alt) { if (virt) flush = 1; else out() }
      next
    }
    /^    [^ ]/ { if (virt) add($1); next }             # a provider of the virtual above
    END { out() }
  '
}

if ! apt-cache show "${SEEDS[@]}" >/dev/null 2>&1; then
  echo "fetch_debs: some of ${SEEDS[*]} are unknown to apt-cache" >&2; exit 1
fi
declare -A TAKE=() SEED=()
for p in "${SEEDS[@]}"; do SEED[$p]=1; done
frontier=("${SEEDS[@]}")
while [ "${#frontier[@]}" -gt 0 ]; do
  for p in "${frontier[@]}"; do TAKE[$p]=1; done
  declare -A NEXT=()
  while read -r -a f; do
    pkg=${f[0]}; alts=("${f[@]:1}")
    choice=""
    # An alternative we already take or asked for wins; an excluded one satisfies the
    # group (it is on the target, or not needed there); else the first one listed
    # (apt-cache names a package without <> only when it exists).
    for a in "${alts[@]}"; do
      if [ -n "${TAKE[$a]:-}" ] || [ -n "${SEED[$a]:-}" ]; then choice=$a; break; fi
    done
    if [ -z "$choice" ]; then
      for a in "${alts[@]}"; do
        if is_excluded "$a"; then choice=-; break; fi
      done
    fi
    [ -z "$choice" ] && choice=${alts[0]}
    [ "$choice" = - ] && continue
    [ -z "${TAKE[$choice]:-}" ] && NEXT[$choice]=1
  done < <(dep_groups "${frontier[@]}")
  frontier=("${!NEXT[@]}")
  unset NEXT
done

mapfile -t PKGS < <(printf '%s\n' "${!TAKE[@]}" | sort)
if [ "${1:-}" = --list ]; then printf '%s\n' "${PKGS[@]}"; exit 0; fi

mkdir -p "$DEST"
# Start clean so that a package dropped from the closure does not linger in debs/.
rm -f "$DEST"/*.deb
( cd "$DEST" && apt-get download -q -o APT::Sandbox::User=root "${PKGS[@]}" ) || {
  echo "fetch_debs: apt-get download failed (run 'apt-get update'?)" >&2; exit 1; }

# glibc. A bookworm package may need glibc 2.36 (its Depends says libc6 (>= 2.36));
# Ubuntu 22.04 has 2.35, and the loader refuses such a library there ("version
# `GLIBC_2.36' not found"). Today that is libevent (arc4random), which libopen-pal and
# PMIx link, so mpirun would not start. For each such package, take the same package
# from bullseye (glibc 2.31) when it has one with the same name (so the same soname):
# for libevent, the same upstream 2.1.12. A private apt state in a temporary folder
# reads bullseye's index; the system's apt configuration is not touched.
OLD_GLIBC_MAX=2.35
libc_need() {   # the libc6 version a .deb asks for, or 0
  dpkg-deb -f "$1" Depends Pre-Depends | sed 's/^[A-Za-z-]*: //' | tr ',|' '\n\n' |
    sed -n 's/^ *libc6 *(>= *\([0-9.]*\)[^)]*).*/\1/p' | sort -V | tail -1 | grep . || echo 0
}
newer_than() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" = "$1" ]; }
deb_source() { local s; s=$(dpkg-deb -f "$1" Source); s=${s%% *}; echo "${s:-$(dpkg-deb -f "$1" Package)}"; }
# Swap whole source packages: libevent-pthreads pins libevent-core's exact version.
declare -A OLD_SRC=()
for f in "$DEST"/*.deb; do
  newer_than "$(libc_need "$f")" "$OLD_GLIBC_MAX" && OLD_SRC[$(deb_source "$f")]=1
done
too_new=()
for f in "$DEST"/*.deb; do
  [ -n "${OLD_SRC[$(deb_source "$f")]:-}" ] && too_new+=("$f")
done
if [ "${#too_new[@]}" -gt 0 ] && [ "${GPTC_DEBS_NO_BULLSEYE:-0}" != 1 ]; then
  APT_TMP=$(mktemp -d)
  trap 'rm -rf "$APT_TMP"' EXIT
  mkdir -p "$APT_TMP/parts" "$APT_TMP/lists/partial" "$APT_TMP/cache/archives/partial"
  printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bullseye' \
    'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
    > "$APT_TMP/parts/bullseye.sources"
  APT_OPTS=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$APT_TMP/parts"
            -o "Dir::State::Lists=$APT_TMP/lists" -o "Dir::Cache=$APT_TMP/cache"
            -o APT::Sandbox::User=root)
  if apt-get "${APT_OPTS[@]}" -q update >/dev/null 2>&1; then
    for f in "${too_new[@]}"; do
      pkg=$(dpkg-deb -f "$f" Package)
      # bullseye's version: the one in the private index that is not bookworm's
      ver=$(apt-cache "${APT_OPTS[@]}" show "$pkg" 2>/dev/null |
            awk -v cur="$(dpkg-deb -f "$f" Version)" '/^Version: / && $2 != cur { print $2; exit }')
      if [ -z "$ver" ]; then echo "fetch_debs: no bullseye $pkg; keeping $(basename "$f")" >&2; continue; fi
      if ( cd "$APT_TMP" && apt-get "${APT_OPTS[@]}" -q download "$pkg=$ver" >/dev/null 2>&1 ); then
        new=$(ls "$APT_TMP"/"${pkg}"_*.deb | head -1)
        if newer_than "$(libc_need "$new")" "$OLD_GLIBC_MAX"; then
          echo "fetch_debs: bullseye $pkg $ver still needs a newer glibc; keeping bookworm's" >&2
        else
          echo "fetch_debs: $pkg: bookworm needs glibc $(libc_need "$f"); taking bullseye $ver (glibc $(libc_need "$new"))"
          rm -f "$f"; mv "$new" "$DEST/"
        fi
      else
        echo "fetch_debs: could not download bullseye $pkg=$ver; keeping $(basename "$f")" >&2
      fi
    done
  else
    echo "fetch_debs: warning: could not read bullseye's index; packages needing glibc" \
         "> $OLD_GLIBC_MAX stay (mpirun will not start on Ubuntu 22.04)" >&2
  fi
fi

# A manifest travels with the debs: prepare.sh prints it, and it records what was taken.
glibc_need=0
for f in "$DEST"/*.deb; do
  v=$(libc_need "$f"); newer_than "$v" "$glibc_need" && glibc_need=$v
done
{
  echo "# fetched by benchmarks/gpu/fetch_debs.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# from ${PRETTY_NAME:-unknown OS}, $(ldd --version 2>/dev/null | head -1)"
  echo "# glibc needed (highest libc6 Depends): $glibc_need"
  for f in "$DEST"/*.deb; do
    printf '%-44s %10d  libc6>=%s\n' "$(dpkg-deb -f "$f" Package)_$(dpkg-deb -f "$f" Version)" \
      "$(stat -c %s "$f")" "$(libc_need "$f")"
  done
} > "$DEST/MANIFEST.txt"

n=$(ls "$DEST"/*.deb | wc -l)
bytes=$(cat "$DEST"/*.deb | wc -c)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "fetch_debs: $n packages, $mib MiB in $DEST; they need glibc >= $glibc_need"
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "fetch_debs: ERROR: over ${LIMIT_MIB} MiB; the carry limit is 64 MiB in all" >&2
  exit 1
fi
exit 0
