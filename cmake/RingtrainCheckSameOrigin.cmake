# cmake/RingtrainCheckSameOrigin.cmake: a library's headers and its binary come from one place (one
# install prefix), and the version its headers declare is the version of the binary that is linked.
#
# Why: the first GPU run (docs/GPU.md, 2026-12-04) compiled against one libjpeg and ran with another. CMake
# found jpeglib.h and libjpeg.so (-> libjpeg.so.62) in the GPU bundle's private prefix, but jpeglib.h gets
# JPEG_LIB_VERSION from `#include "jconfig.h"`, which Debian and Ubuntu install in the multiarch folder
# (<prefix>/include/x86_64-linux-gnu). That folder of the prefix was on no include path, so the compiler's
# default one supplied the machine's own jconfig.h (Ubuntu's libjpeg-turbo8: 80), and every JPEG call
# aborted: "Wrong JPEG library version: library is 62, caller expects 80".
#
#   ringtrain_install_prefix(<out> <path>)
#       The install prefix a header, library or folder belongs to: what comes before the innermost
#       include/, lib/, lib32/, lib64/ or libx32/ folder of its real path (symbolic links resolved), e.g.
#       /usr for /usr/include/x86_64-linux-gnu/jconfig.h and /usr/lib/x86_64-linux-gnu/libjpeg.so.
#   ringtrain_check_same_origin(<name> HEADER <file> LIBRARIES <file>... [FIX <advice>])
#       Stops the configuration (FATAL_ERROR) when a library is not from the header's prefix, naming both.
#   ringtrain_library_soname(<out> <library>)
#       The ELF soname of a shared library (libjpeg.so.62), or "" for a static one.
#   ringtrain_check_jpeg()
#       After find_package(JPEG): finds the jconfig.h of jpeglib.h's own prefix, puts its folder first on
#       JPEG::JPEG's include path, asks the compiler which jconfig.h it then reads, and stops unless that
#       is the prefix's one, the library is from the same prefix, and its soname is the one the declared
#       JPEG_LIB_VERSION belongs to (libjpeg-turbo and IJG: 62 -> libjpeg.so.62, 80 -> libjpeg.so.8,
#       90 -> libjpeg.so.9). Defines RINGTRAIN_JPEG_LIB_VERSION=<version> on JPEG::JPEG for the sources'
#       own compile-time check (data/codec.cpp), which covers include paths that other targets add.
#
# RINGTRAIN_ALLOW_MIXED_ORIGIN (cache, default OFF): a header and a library from different prefixes is
# then a warning, for layouts that split one package in two on purpose (Nix's -dev outputs). The version
# check still stops the configuration.
include_guard(GLOBAL)

option(RINGTRAIN_ALLOW_MIXED_ORIGIN
       "Only warn when a library's headers and binary come from different install prefixes" OFF)

function(ringtrain_install_prefix out path)
  file(REAL_PATH "${path}" real)
  if(IS_DIRECTORY "${real}")
    set(dir "${real}")
  else()
    get_filename_component(dir "${real}" DIRECTORY)
  endif()
  set(d "${dir}")
  while(NOT d STREQUAL "/" AND NOT d STREQUAL "")
    get_filename_component(base "${d}" NAME)
    get_filename_component(parent "${d}" DIRECTORY)
    if(base MATCHES "^(include|lib|lib32|lib64|libx32)$")
      set(${out} "${parent}" PARENT_SCOPE)
      return()
    endif()
    set(d "${parent}")
  endwhile()
  set(${out} "${dir}" PARENT_SCOPE)  # no include/ or lib/ folder: the file's own folder
endfunction()

# The libraries a found-package target links, from the target (what is linked) or a <PKG>_LIBRARIES list
# (whose optimized/debug/general keywords are dropped).
function(_ringtrain_target_libraries out target fallback)
  set(libs "")
  if(TARGET ${target})
    foreach(p IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_DEBUG IMPORTED_LOCATION_RELWITHDEBINFO
              IMPORTED_LOCATION_MINSIZEREL IMPORTED_LOCATION_NOCONFIG)
      get_target_property(v ${target} ${p})
      if(v)
        list(APPEND libs "${v}")
      endif()
    endforeach()
  endif()
  if(NOT libs)
    foreach(v IN LISTS fallback)
      if(NOT v MATCHES "^(optimized|debug|general)$")
        list(APPEND libs "${v}")
      endif()
    endforeach()
  endif()
  list(REMOVE_DUPLICATES libs)
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

function(ringtrain_check_same_origin name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "HEADER;FIX" "LIBRARIES")
  if(NOT arg_FIX)
    set(arg_FIX "Use one installation for both: point the package's include folder and library cache entries "
                "at one prefix, or take the other copy out of CMAKE_PREFIX_PATH, in a fresh build folder (or "
                "with those cache entries deleted).")
    string(JOIN "" arg_FIX ${arg_FIX})
  endif()
  ringtrain_install_prefix(header_prefix "${arg_HEADER}")
  foreach(lib IN LISTS arg_LIBRARIES)
    ringtrain_install_prefix(lib_prefix "${lib}")
    if(lib_prefix STREQUAL header_prefix)
      continue()
    endif()
    set(shown_header "${arg_HEADER}")
    set(shown_lib "${lib}")
    file(REAL_PATH "${arg_HEADER}" real)
    if(NOT real STREQUAL arg_HEADER)
      string(APPEND shown_header " -> ${real}")
    endif()
    file(REAL_PATH "${lib}" real)
    if(NOT real STREQUAL lib)
      string(APPEND shown_lib " -> ${real}")
    endif()
    set(text "${name}: the header and the library come from different places:\n"
             "  header  ${shown_header}: prefix ${header_prefix}\n"
             "  library ${shown_lib}: prefix ${lib_prefix}\n"
             "A header describes the binary interface of its own installation's library: compiled against one "
             "installation and run with another, a program can abort or misbehave. ${arg_FIX} "
             "-DRINGTRAIN_ALLOW_MIXED_ORIGIN=ON makes this a warning.")
    string(JOIN "" text ${text})
    if(RINGTRAIN_ALLOW_MIXED_ORIGIN)
      message(WARNING "${text}")
    else()
      message(FATAL_ERROR "${text}")
    endif()
  endforeach()
endfunction()

function(ringtrain_library_soname out lib)
  set(${out} "" PARENT_SCOPE)
  file(REAL_PATH "${lib}" real)
  get_filename_component(file_name "${real}" NAME)
  if(NOT file_name MATCHES "\\.so(\\.[0-9]+)*$")
    return()  # a static library (or not ELF): no soname
  endif()
  set(objdump "${CMAKE_OBJDUMP}")
  if(NOT objdump)
    find_program(RINGTRAIN_OBJDUMP objdump)
    mark_as_advanced(RINGTRAIN_OBJDUMP)
    set(objdump "${RINGTRAIN_OBJDUMP}")
  endif()
  if(objdump)
    execute_process(COMMAND "${objdump}" -p "${real}" OUTPUT_VARIABLE dump ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND dump MATCHES "SONAME[ \t]+([^ \t\r\n]+)")
      set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
      return()
    endif()
  endif()
  # No objdump, or no SONAME in the file: the real file's name up to its first version number
  # (libjpeg.so.62.3.0 -> libjpeg.so.62), which is how libjpeg's builds name it.
  if(file_name MATCHES "^(.*\\.so\\.[0-9]+)")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  endif()
endfunction()

# The first of FILES that #defines MACRO as a number: sets <out_file> and <out_value> ("" when none does).
function(_ringtrain_first_define out_file out_value macro)
  set(${out_file} "" PARENT_SCOPE)
  set(${out_value} "" PARENT_SCOPE)
  foreach(f IN LISTS ARGN)
    if(NOT EXISTS "${f}" OR IS_DIRECTORY "${f}")
      continue()
    endif()
    file(STRINGS "${f}" line REGEX "^[ \t]*#[ \t]*define[ \t]+${macro}[ \t]+[0-9]+")
    if(line)
      list(GET line 0 line)
      string(REGEX REPLACE "^[ \t]*#[ \t]*define[ \t]+${macro}[ \t]+([0-9]+).*" "\\1" value "${line}")
      set(${out_file} "${f}" PARENT_SCOPE)
      set(${out_value} "${value}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

# Preprocesses `#include <stdio.h>` + `#include <HEADER>` with TARGET's include folders as the build passes
# them and reports which file #defines MACRO, and its value: the compiler's own answer to "which jconfig.h".
# Sets <out_file>/<out_value> to "" when no GCC-like compiler is enabled or the preprocessor fails
# (<out_error> then says why).
function(_ringtrain_compiler_define out_file out_value out_error target header macro)
  set(${out_file} "" PARENT_SCOPE)
  set(${out_value} "" PARENT_SCOPE)
  set(${out_error} "" PARENT_SCOPE)
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  set(lang "")
  foreach(l CXX C)
    if(l IN_LIST languages AND CMAKE_${l}_COMPILER_ID MATCHES "^(GNU|Clang|AppleClang|IntelLLVM)$")
      set(lang ${l})
      break()
    endif()
  endforeach()
  if(NOT lang)
    set(${out_error} "no GCC-like C or C++ compiler enabled" PARENT_SCOPE)
    return()
  endif()
  set(flag "${CMAKE_INCLUDE_SYSTEM_FLAG_${lang}}")  # imported targets' folders are system folders
  if(NOT flag)
    set(flag "-I")
  endif()
  string(STRIP "${flag}" flag)
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(args "")
  foreach(d IN LISTS dirs)
    if(d AND NOT d IN_LIST CMAKE_${lang}_IMPLICIT_INCLUDE_DIRECTORIES)  # CMake leaves those out too
      list(APPEND args "${flag}" "${d}")
    endif()
  endforeach()
  if(CMAKE_SYSROOT)
    list(APPEND args "--sysroot=${CMAKE_SYSROOT}")
  endif()
  if(lang STREQUAL "CXX")
    set(x c++)
  else()
    set(x c)
  endif()
  set(src "${CMAKE_BINARY_DIR}${CMAKE_FILES_DIRECTORY}/ringtrain_${macro}_probe.c")
  file(WRITE "${src}" "#include <stdio.h>\n#include <${header}>\n")
  execute_process(COMMAND "${CMAKE_${lang}_COMPILER}" -E -dD -x ${x} ${args} "${src}"
                  OUTPUT_VARIABLE pp ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    set(${out_error} "${CMAKE_${lang}_COMPILER} -E failed: ${err}" PARENT_SCOPE)
    return()
  endif()
  string(FIND "${pp}" "\n#define ${macro} " at)
  if(at LESS 0)
    set(${out_error} "${header} as preprocessed defines no ${macro}" PARENT_SCOPE)
    return()
  endif()
  # The line marker before the #define (`# 4 "/usr/include/x86_64-linux-gnu/jconfig.h" 3 4`) names its file.
  string(SUBSTRING "${pp}" 0 ${at} before)
  string(FIND "${before}" "\n# " marker REVERSE)
  string(SUBSTRING "${before}" ${marker} -1 marker_line)
  math(EXPR value_at "${at} + 1")
  string(SUBSTRING "${pp}" ${value_at} 200 define_line)
  if(NOT marker_line MATCHES "^\n# [0-9]+ \"([^\"]+)\"")
    set(${out_error} "no line marker before the #define in the preprocessor's output" PARENT_SCOPE)
    return()
  endif()
  set(file "${CMAKE_MATCH_1}")
  if(NOT define_line MATCHES "^#define ${macro} +([0-9]+)")
    set(${out_error} "${macro} is not a number in the preprocessor's output" PARENT_SCOPE)
    return()
  endif()
  set(${out_value} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${out_file} "${file}" PARENT_SCOPE)
endfunction()

function(ringtrain_check_jpeg)
  if(NOT JPEG_FOUND)
    return()
  endif()
  set(inc "${JPEG_INCLUDE_DIR}")
  if(NOT inc)
    list(GET JPEG_INCLUDE_DIRS 0 inc)
  endif()
  set(header "${inc}/jpeglib.h")
  _ringtrain_target_libraries(libs JPEG::JPEG "${JPEG_LIBRARIES}")
  set(fix "Use one libjpeg installation for both: -DJPEG_INCLUDE_DIR=<prefix>/include and "
          "-DJPEG_LIBRARY=<prefix>/lib/<...>/libjpeg.so from the same prefix (and no other jconfig.h ahead of "
          "that prefix's on the include path), in a fresh build folder or with those cache entries deleted.")
  string(JOIN "" fix ${fix})

  # 1. What jpeglib.h's own installation declares: JPEG_LIB_VERSION in jpeglib.h itself (IJG's), in
  #    jconfig.h beside it, in its multiarch subfolder (Debian, Ubuntu), or in jconfig-<bits>.h (Fedora's
  #    jconfig.h includes that one).
  set(candidates "${header}" "${inc}/jconfig.h")
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND candidates "${inc}/${CMAKE_LIBRARY_ARCHITECTURE}/jconfig.h")
  endif()
  file(GLOB fedora "${inc}/jconfig*.h")
  file(GLOB multiarch "${inc}/*/jconfig.h")
  list(APPEND candidates ${fedora} ${multiarch})
  _ringtrain_first_define(config version JPEG_LIB_VERSION ${candidates})
  if(NOT config)
    message(FATAL_ERROR "libjpeg: neither ${header} nor a jconfig.h of its installation (${inc}/jconfig.h, "
                        "${inc}/<multiarch>/jconfig.h) defines JPEG_LIB_VERSION. ${fix}")
  endif()

  # 2. Header and binary from one prefix.
  ringtrain_check_same_origin(libjpeg HEADER "${header}" LIBRARIES ${libs} FIX "${fix}")

  # 3. jpeglib.h's `#include "jconfig.h"` looks beside jpeglib.h first, then along the include path, then
  #    in the compiler's own folders (/usr/include/<multiarch> among them). A jconfig.h in a subfolder of
  #    the prefix is found only if that subfolder is on the path: put it first.
  get_filename_component(config_dir "${config}" DIRECTORY)
  if(TARGET JPEG::JPEG AND NOT config_dir STREQUAL inc)
    get_target_property(dirs JPEG::JPEG INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT dirs)
      set(dirs "")
    endif()
    list(REMOVE_ITEM dirs "${config_dir}")
    list(PREPEND dirs "${config_dir}")
    set_target_properties(JPEG::JPEG PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
    set(JPEG_INCLUDE_DIRS "${dirs}" PARENT_SCOPE)
  endif()

  # 4. The jconfig.h the compiler reads with that include path must be the prefix's.
  if(TARGET JPEG::JPEG)
    _ringtrain_compiler_define(used_config used_version probe_error JPEG::JPEG jpeglib.h JPEG_LIB_VERSION)
    if(used_config)
      file(REAL_PATH "${used_config}" used_real)
      file(REAL_PATH "${config}" config_real)
      if(NOT used_real STREQUAL config_real)
        message(FATAL_ERROR
                "libjpeg: the compiler reads another installation's version header than jpeglib.h's own:\n"
                "  jpeglib.h's installation: ${config} declares JPEG_LIB_VERSION ${version}\n"
                "  read by the compiler:     ${used_config} declares JPEG_LIB_VERSION ${used_version}\n"
                "${fix}")
      endif()
    else()
      message(STATUS "libjpeg: could not ask the compiler which jconfig.h it reads (${probe_error}); "
                     "using ${config}")
    endif()
  endif()

  # 5. The declared version against the linked library's soname.
  if(version GREATER_EQUAL 70)
    math(EXPR want_major "${version} / 10")
  else()
    set(want_major "${version}")
  endif()
  set(checked "")
  foreach(lib IN LISTS libs)
    ringtrain_library_soname(soname "${lib}")
    if(NOT soname)
      list(APPEND checked "${lib} (static: no soname to compare)")
      continue()
    endif()
    if(NOT soname MATCHES "\\.so\\.([0-9]+)$")
      list(APPEND checked "${lib} (soname ${soname} has no version)")
      continue()
    endif()
    set(major "${CMAKE_MATCH_1}")
    if(NOT major EQUAL want_major)
      if(major LESS 10)
        math(EXPR lib_version "${major} * 10")
      else()
        set(lib_version "${major}")
      endif()
      file(REAL_PATH "${lib}" lib_real)
      message(FATAL_ERROR
              "libjpeg: the header and the library are different versions:\n"
              "  header  ${header}: JPEG_LIB_VERSION ${version} (from ${config}), which is libjpeg.so.${want_major}\n"
              "  library ${lib} (${lib_real}): ${soname}, which is JPEG_LIB_VERSION ${lib_version}\n"
              "A program built this way stops at its first JPEG call with\n"
              "  Wrong JPEG library version: library is ${lib_version}, caller expects ${version}\n"
              "${fix}")
    endif()
    list(APPEND checked "${lib} (${soname})")
  endforeach()
  list(JOIN checked ", " checked)
  message(STATUS "libjpeg: JPEG_LIB_VERSION ${version} (${config}) matches ${checked}")
  if(TARGET JPEG::JPEG)
    set_property(TARGET JPEG::JPEG APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS
                 "RINGTRAIN_JPEG_LIB_VERSION=${version}")
  endif()
endfunction()
