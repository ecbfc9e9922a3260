# The folders under include/mpar/ form layers: a header may include headers of its own folder and of the
# folders before it in LAYERS, never of a folder after it, so no two folders depend on each other.
#
#   cmake -DINCLUDE=<dir holding mpar/> -P check_layering.cmake
#
# An include of an umbrella header (`mpar/nn.hpp`) counts as one of its folder (`nn`). Headers directly in
# mpar/ (the umbrellas, `mpar.hpp`, `tools.hpp`, `cuda.hpp`, `version.hpp`) may include anything. Every
# violation is listed; the script fails if there is any, if a folder is missing from LAYERS, or if it finds no
# include at all (a wrong INCLUDE would otherwise pass). docs/concepts.md ("Folders and namespaces") explains
# the order.
set(LAYERS core cli data backend comm observe nn optim parallel pipeline plan io train models)
if(NOT INCLUDE)
  message(FATAL_ERROR "check_layering: pass -DINCLUDE=<dir holding mpar/>")
endif()
get_filename_component(INCLUDE "${INCLUDE}" ABSOLUTE)
file(GLOB_RECURSE headers RELATIVE "${INCLUDE}/mpar" "${INCLUDE}/mpar/*.hpp" "${INCLUDE}/mpar/*.cuh")
list(SORT headers)
set(checked 0)
set(problems "")
foreach(rel IN LISTS headers)
  if(NOT rel MATCHES "/")
    continue()  # an umbrella header
  endif()
  string(REGEX REPLACE "/.*" "" from "${rel}")
  list(FIND LAYERS "${from}" from_layer)
  if(from_layer EQUAL -1)
    string(APPEND problems "\n  folder `${from}` (mpar/${rel}) has no place in LAYERS: add it to "
                           "cmake/check_layering.cmake and docs/concepts.md")
    continue()
  endif()
  file(STRINGS "${INCLUDE}/mpar/${rel}" includes REGEX "^[ \t]*#[ \t]*include[ \t]+[\"<]mpar/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+[\"<]mpar/([^\">]+)[\">].*" "\\1" target "${line}")
    if(target MATCHES "/")
      string(REGEX REPLACE "/.*" "" to "${target}")
    else()
      string(REGEX REPLACE "\\.(hpp|cuh)$" "" to "${target}")
    endif()
    math(EXPR checked "${checked} + 1")
    list(FIND LAYERS "${to}" to_layer)
    if(to_layer EQUAL -1)
      if(NOT to STREQUAL "version")
        string(APPEND problems "\n  mpar/${rel} includes mpar/${target}, which is in no layer")
      endif()
    elseif(to_layer GREATER from_layer)
      string(APPEND problems "\n  mpar/${rel} (layer `${from}`) includes mpar/${target} (layer `${to}`, above it): "
                             "move what it needs down to `${from}` or below, or the including code up")
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "check_layering: no mpar/ include found under ${INCLUDE}/mpar")
endif()
if(problems)
  string(REPLACE ";" " < " order "${LAYERS}")
  message(FATAL_ERROR "check_layering: ${checked} includes checked against ${order}; these go up:${problems}")
endif()
message(STATUS "check_layering: ${checked} includes, each to its own folder or one below it")
