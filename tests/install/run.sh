#!/usr/bin/env bash
# Install test: install a build tree into a temporary DESTDIR, then build the
# 20-line consumer against the installed tree only, with pkg-config (shared
# and static) and with CMake's find_package(dcp), and run it.
#
#   tests/install/run.sh [BUILD_DIR]        (default: build)
#
# The install uses the prefix the build was configured with, so dcp.pc's
# prefix is the real one; the .pc is read through a copy whose prefix line
# points into DESTDIR, as if the tree had been installed there.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "${1:-build}" && pwd)
CC=${CC:-cc}
CMAKE=${CMAKE:-cmake}

say() { printf 'install-test: %s\n' "$*"; }
die() {
    printf 'install-test: FAIL: %s\n' "$*" >&2
    exit 1
}

[ -f "$BUILD/CMakeCache.txt" ] || die "$BUILD is not a configured CMake build"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
PREFIX=$(cache CMAKE_INSTALL_PREFIX)
LIBDIR_REL=$(cache CMAKE_INSTALL_LIBDIR)
MAJOR=$(sed -n 's/^#define DCP_VERSION_MAJOR \([0-9]*\).*/\1/p' \
    "$HERE/../../include/dcp/dcp_version.h")

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dcp-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ROOT=$TMP/dest$PREFIX
LIBDIR=$ROOT/$LIBDIR_REL

# ------------------------------------------------------------ install
DESTDIR=$TMP/dest "$CMAKE" --install "$BUILD" >"$TMP/install.log" 2>&1 ||
    {
        cat "$TMP/install.log" >&2
        die "cmake --install $BUILD failed"
    }
say "installed $BUILD into DESTDIR (prefix $PREFIX): $(wc -l <"$TMP/install.log") lines of log"
for f in include/dcp/dcp.h include/dcp/dcp_version.h \
    "$LIBDIR_REL/libdcp.so" "$LIBDIR_REL/libdcp.so.$MAJOR" "$LIBDIR_REL/libdcp.a" \
    "$LIBDIR_REL/pkgconfig/dcp.pc" "$LIBDIR_REL/cmake/dcp/dcpConfig.cmake" \
    "$LIBDIR_REL/cmake/dcp/dcpConfigVersion.cmake" \
    "$LIBDIR_REL/cmake/dcp/dcpTargets.cmake"; do
    [ -e "$ROOT/$f" ] || die "not installed: $PREFIX/$f"
done
say "files present: headers, libdcp.so.$MAJOR, libdcp.a, dcp.pc, CMake package"

# ------------------------------------------------------------ ABI
soname=$(objdump -p "$LIBDIR/libdcp.so" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = "libdcp.so.$MAJOR" ] ||
    die "SONAME is '$soname', expected libdcp.so.$MAJOR (docs/ABI.md)"
exports=$(nm -D --defined-only "$LIBDIR/libdcp.so" | awk '{ print $NF }')
stray=$(printf '%s\n' "$exports" | grep -v '^dcp_' || true)
[ -z "$stray" ] || die "exported symbols outside dcp_*: $(echo $stray)"
say "SONAME $soname; $(printf '%s\n' "$exports" | wc -l) exported symbols, all dcp_*"

# Every installed header compiles on its own (C11, pedantic, -Werror).
mpi_cflags=""
if [ -e "$ROOT/include/dcp/dcp_mpi.h" ]; then
    mpi_cflags=$(pkg-config --cflags ompi-c 2>/dev/null || pkg-config --cflags mpi)
fi
for h in "$ROOT"/include/dcp/*.h; do
    printf '#include <dcp/%s>\ntypedef int dcp_header_check;\n' "${h##*/}" |
        $CC -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only \
            -I"$ROOT/include" $mpi_cflags -x c - ||
        die "installed header ${h##*/} does not compile on its own"
done
say "installed headers compile alone: $(cd "$ROOT/include/dcp" && echo *.h)"

# ------------------------------------------------------------ pkg-config
mkdir -p "$TMP/pc"
sed "s|^prefix=.*|prefix=$ROOT|" "$LIBDIR/pkgconfig/dcp.pc" >"$TMP/pc/dcp.pc"
export PKG_CONFIG_PATH=$TMP/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pkg-config --exists --print-errors dcp || die "pkg-config cannot resolve dcp.pc"
CFLAGS_PC=$(pkg-config --cflags dcp)
LIBS_PC=$(pkg-config --libs dcp)
say "pkg-config: dcp $(pkg-config --modversion dcp): $CFLAGS_PC $LIBS_PC"

# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Wpedantic -Werror $CFLAGS_PC \
    "$HERE/consumer.c" -o "$TMP/consumer-pc" $LIBS_PC ||
    die "consumer does not build with pkg-config --cflags --libs dcp"
ldd_line=$(LD_LIBRARY_PATH=$LIBDIR ldd "$TMP/consumer-pc" | grep 'libdcp\.so' || true)
case "$ldd_line" in
*"$LIBDIR/"*) ;;
*) die "consumer-pc resolves libdcp outside the install tree: $ldd_line" ;;
esac
LD_LIBRARY_PATH=$LIBDIR "$TMP/consumer-pc" >"$TMP/out" || {
    cat "$TMP/out"
    die "consumer-pc failed"
}
say "pkg-config shared: $(tr '\n' ' ' <"$TMP/out")"

# Static: the same consumer against libdcp.a, with Libs.private and
# Requires.private (MPI) from pkg-config --static.
LIBS_STATIC=$(pkg-config --static --libs dcp | sed 's/\(^\| \)-ldcp\( \|$\)/\1-l:libdcp.a\2/')
# shellcheck disable=SC2086
$CC -std=c11 $CFLAGS_PC "$HERE/consumer.c" -o "$TMP/consumer-static" \
    $LIBS_STATIC || die "consumer does not link statically: $LIBS_STATIC"
if ldd "$TMP/consumer-static" | grep -q 'libdcp\.so'; then
    die "consumer-static still needs libdcp.so"
fi
"$TMP/consumer-static" >"$TMP/out" || {
    cat "$TMP/out"
    die "consumer-static failed"
}
say "pkg-config static: $(tr '\n' ' ' <"$TMP/out")"

if [ -n "$mpi_cflags" ]; then
    printf '#include <dcp/dcp_mpi.h>\nint main(void) { return 0; }\n' |
        $CC -std=c11 $CFLAGS_PC -x c - -o "$TMP/mpi-hdr" $LIBS_PC ||
        die "dcp_mpi.h is not usable with pkg-config --cflags dcp (Requires.private)"
    say "pkg-config: dcp_mpi.h finds mpi.h through Requires.private"
fi

# ------------------------------------------------------------ CMake package
if ! "$CMAKE" -S "$HERE" -B "$TMP/cmake-build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_PREFIX_PATH="$ROOT" \
    >"$TMP/cmake.log" 2>&1 ||
    ! "$CMAKE" --build "$TMP/cmake-build" >>"$TMP/cmake.log" 2>&1; then
    cat "$TMP/cmake.log" >&2
    die "consumer does not build with find_package(dcp)"
fi
found=$(sed -n 's/^-- dcp \(.*\)/\1/p' "$TMP/cmake.log")
case "$found" in
*"$ROOT/"*) ;;
*) die "find_package(dcp) found something else: $found" ;;
esac
LD_LIBRARY_PATH=$LIBDIR "$TMP/cmake-build/consumer" >"$TMP/out" || {
    cat "$TMP/out"
    die "consumer (CMake) failed"
}
say "find_package(dcp) $found: $(tr '\n' ' ' <"$TMP/out")"

# ------------------------------------------------------------ dcptool
# The installed dcptool carries an RPATH relative to itself ($ORIGIN/../lib):
# it runs without LD_LIBRARY_PATH from the DESTDIR tree, from a tree
# installed with another prefix (cmake --install --prefix), and from that
# tree moved elsewhere.
run_tool() { # run_tool TREE: dcptool --version and ls on a checkpoint
    env -u LD_LIBRARY_PATH "$1/bin/dcptool" --version >"$TMP/out" 2>&1 || {
        cat "$TMP/out"
        die "dcptool in $1 does not run without LD_LIBRARY_PATH"
    }
    lib=$(env -u LD_LIBRARY_PATH ldd "$1/bin/dcptool" |
        awk '/libdcp\.so/ { print $3 }')
    case "$lib" in
    "$1"/*) ;;
    *) die "dcptool in $1 resolves libdcp to '$lib', outside its tree" ;;
    esac
    env -u LD_LIBRARY_PATH "$1/bin/dcptool" ls \
        "$HERE/../data/torch_small" >"$TMP/ls.out" 2>&1 || {
        cat "$TMP/ls.out"
        die "dcptool ls in $1 failed"
    }
}
if [ -e "$ROOT/bin/dcptool" ]; then
    rpath=$(objdump -p "$ROOT/bin/dcptool" | awk '$1 == "RUNPATH" || $1 == "RPATH" { print $2 }')
    case "$rpath" in
    *'$ORIGIN/../'*) ;;
    *) die "installed dcptool has RPATH '$rpath', not relative to \$ORIGIN" ;;
    esac
    run_tool "$ROOT"
    say "installed dcptool (DESTDIR, RPATH $rpath): $(head -n1 "$TMP/out")"
    "$CMAKE" --install "$BUILD" --prefix "$TMP/prefix2" >"$TMP/install2.log" 2>&1 ||
        {
            cat "$TMP/install2.log" >&2
            die "cmake --install $BUILD --prefix $TMP/prefix2 failed"
        }
    run_tool "$TMP/prefix2"
    mv "$TMP/prefix2" "$TMP/moved"
    run_tool "$TMP/moved"
    say "dcptool installed with --prefix, then moved: runs and lists ($(wc -l <"$TMP/ls.out") entries) without LD_LIBRARY_PATH"
fi
say "OK"
