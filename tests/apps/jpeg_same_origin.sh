#!/usr/bin/env bash
# cmake/RingtrainCheckSameOrigin.cmake on a throwaway project and made-up libjpeg installations (the
# 2026-12-04 GPU run compiled against a jpeglib.h saying 80 and ran with libjpeg.so.62):
#   - a prefix whose jconfig.h declares 80 beside a libjpeg.so.62 fails to configure, naming both versions;
#   - a prefix with a 62 header and a libjpeg.so.62 configures;
#   - a prefix like Debian's (jconfig.h in the multiarch subfolder) whose 80 differs from the machine's own
#     jconfig.h configures and compiles against its own jconfig.h: the subfolder goes first on the path;
#   - the header of one prefix with the (same-version) library of another fails to configure;
#   - the machine's own libjpeg configures and compiles.
#   bash tests/apps/jpeg_same_origin.sh CMAKE C_COMPILER SOURCE_DIR WORK_DIR
set -uo pipefail
cmake=$1 cc=$2 src=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
arch=$("$cc" -print-multiarch 2>/dev/null || true)
fails=0

# prefix VERSION SONAME_MAJOR DIR: a libjpeg installation laid out as Debian's (jconfig.h, which says
# VERSION, in include/<multiarch>/; libjpeg.so -> libjpeg.so.MAJOR -> libjpeg.so.MAJOR.0.0, a real shared
# library with that soname).
prefix() {
  local version=$1 major=$2 dir=$3
  local inc=$dir/usr/include lib=$dir/usr/lib${arch:+/$arch}
  mkdir -p "$inc/${arch:-.}" "$lib"
  printf '/* stand-in: the version comes from jconfig.h */\n#include "jconfig.h"\nint jpeg_stand_in(void);\n' > "$inc/jpeglib.h"
  printf '#define JPEG_LIB_VERSION  %s\n' "$version" > "$inc/${arch:-.}/jconfig.h"
  echo "int jpeg_stand_in(void) { return $version; }" > "$dir/stand_in.c"
  "$cc" -shared -fPIC -Wl,-soname,libjpeg.so."$major" -o "$lib/libjpeg.so.$major.0.0" "$dir/stand_in.c" || exit 1
  ln -s "libjpeg.so.$major.0.0" "$lib/libjpeg.so.$major"
  ln -s "libjpeg.so.$major" "$lib/libjpeg.so"
}
prefix 80 62 "$work/p80_so62"
prefix 62 62 "$work/p62_so62"
prefix 62 62 "$work/p62_so62_other"
prefix 80 8 "$work/p80_so8"

mkdir -p "$work/project"
cat > "$work/project/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(jpeg_same_origin CXX)
find_package(JPEG REQUIRED)
include("$src/cmake/RingtrainCheckSameOrigin.cmake")
ringtrain_check_jpeg()
add_library(probe OBJECT probe.cpp)
target_link_libraries(probe PRIVATE JPEG::JPEG)
if(EXPECT_VERSION)
  target_compile_definitions(probe PRIVATE EXPECT_VERSION=\${EXPECT_VERSION})
endif()
EOF
cat > "$work/project/probe.cpp" <<'EOF'
#include <cstdio>
#include <jpeglib.h>
#if JPEG_LIB_VERSION != RINGTRAIN_JPEG_LIB_VERSION
#error "compiled against another JPEG_LIB_VERSION than the configuration checked"
#endif
#if defined(EXPECT_VERSION) && JPEG_LIB_VERSION != EXPECT_VERSION
#error "compiled against another installation's jconfig.h"
#endif
EOF

# expect OK|FAIL NAME PATTERN -- CMAKE_ARGS...: configure (and on OK also build) in a fresh folder; the
# output must match PATTERN (grep -E, several with |&|: all of them).
expect() {
  local want=$1 name=$2 patterns=$3
  shift 4
  local build=$work/build_$name got
  "$cmake" -S "$work/project" -B "$build" "$@" > "$work/$name.txt" 2>&1 && got=OK || got=FAIL
  if [[ $got = OK && $want = OK ]]; then
    "$cmake" --build "$build" >> "$work/$name.txt" 2>&1 || got=FAIL
  fi
  local ok=1 p
  [[ $got = "$want" ]] || ok=0
  while IFS= read -r p; do
    [[ -z $p ]] || grep -Eq -- "$p" "$work/$name.txt" || ok=0
  done <<< "${patterns//|&|/$'\n'}"
  if ((ok)); then
    echo "ok: $name ($got)"
  else
    echo "FAIL: $name: configure/build gave $got (wanted $want) and/or lacked /$patterns/:"
    sed 's/^/  | /' "$work/$name.txt" | tail -30
    fails=$((fails + 1))
  fi
}

expect FAIL header80_library62 \
  "JPEG_LIB_VERSION 80|&|libjpeg.so.62, which is JPEG_LIB_VERSION 62|&|library is 62, caller expects 80|&|$work/p80_so62/usr/include/jpeglib.h|&|JPEG_INCLUDE_DIR=" \
  -- -DCMAKE_PREFIX_PATH="$work/p80_so62/usr"
expect OK header62_library62 "libjpeg: JPEG_LIB_VERSION 62 .*p62_so62/usr/include.*matches .*\(libjpeg.so.62\)" \
  -- -DCMAKE_PREFIX_PATH="$work/p62_so62/usr" -DEXPECT_VERSION=62
expect OK multiarch_header80_library8 "libjpeg: JPEG_LIB_VERSION 80 .*p80_so8/usr/include/.*matches .*\(libjpeg.so.8\)" \
  -- -DCMAKE_PREFIX_PATH="$work/p80_so8/usr" -DEXPECT_VERSION=80
expect FAIL header_and_library_of_two_prefixes \
  "libjpeg: the header and the library come from different places|&|prefix $work/p62_so62/usr|&|prefix $work/p62_so62_other/usr" \
  -- -DJPEG_INCLUDE_DIR="$work/p62_so62/usr/include" -DJPEG_LIBRARY="$work/p62_so62_other/usr/lib${arch:+/$arch}/libjpeg.so"
expect OK this_machine "libjpeg: JPEG_LIB_VERSION [0-9]+ .* matches " --

((fails == 0)) && echo "jpeg_same_origin: all cases behave"
exit $((fails > 0))
