# Every public concept mpar defines lives in a header named after it and has its row in docs/concepts.md, and there
# are at most ten of them: the contracts users program against (tensor, layout, backend, communicator, module,
# layer, redistribution, pipeline part, pipeline schedule, token source). A concept in a `detail/` folder (its
# area's `detail` namespace) is an internal refinement or capability trait: documented in its header and in
# docs/concepts.md's second tier, not counted here. A new public concept is a decision: raise the bound below and
# say why in docs/concepts.md.
#
#   cmake -DINCLUDE=<dir holding mpar/> -DDOCS=<docs/concepts.md> -P check_concepts.cmake
#
# A concept is a line `concept NAME = ...` in a header under INCLUDE/mpar. For each, the header's file name
# must be NAME.hpp (or NAME.cuh), and DOCS must have a table row naming the concept in backticks
# (`NAME<...>`, or qualified: `nn::NAME<...>`) and its header's path below mpar/ (`nn/NAME.hpp`). Every
# violation is listed; the script fails if there is any, and also if it finds no concept at all (a wrong
# INCLUDE would otherwise pass).
if(NOT INCLUDE OR NOT DOCS)
  message(FATAL_ERROR "check_concepts: pass -DINCLUDE=<dir holding mpar/> and -DDOCS=<docs/concepts.md>")
endif()
get_filename_component(INCLUDE "${INCLUDE}" ABSOLUTE)
file(STRINGS "${DOCS}" rows REGEX "^\\|")
file(GLOB_RECURSE headers RELATIVE "${INCLUDE}/mpar" "${INCLUDE}/mpar/*.hpp" "${INCLUDE}/mpar/*.cuh")
list(SORT headers)
set(found 0)
set(problems "")
foreach(rel IN LISTS headers)
  if(rel MATCHES "(^|/)detail/")
    continue()
  endif()
  file(STRINGS "${INCLUDE}/mpar/${rel}" lines REGEX "^[ \t]*concept[ \t]+[A-Za-z_][A-Za-z_0-9]*[ \t]*=")
  get_filename_component(stem "${rel}" NAME_WE)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*concept[ \t]+([A-Za-z_][A-Za-z_0-9]*).*" "\\1" name "${line}")
    math(EXPR found "${found} + 1")
    if(NOT stem STREQUAL name)
      string(APPEND problems "\n  concept `${name}` is in mpar/${rel}: move it to a header named ${name}.hpp "
                             "(the old header can include it)")
    endif()
    set(documented FALSE)
    foreach(row IN LISTS rows)
      if(row MATCHES "`([A-Za-z_]+::)*${name}[<`]" AND row MATCHES "${rel}")
        set(documented TRUE)
        break()
      endif()
    endforeach()
    if(NOT documented)
      string(APPEND problems "\n  concept `${name}` (mpar/${rel}) has no row in ${DOCS} naming it and `${rel}`: "
                             "add one with its header and its requirements")
    endif()
  endforeach()
endforeach()
if(found EQUAL 0)
  message(FATAL_ERROR "check_concepts: no concept found under ${INCLUDE}/mpar")
endif()
set(max_public 10)
if(found GREATER max_public)
  string(APPEND problems "\n  ${found} public concepts, more than ${max_public}: make the new one an internal "
                         "refinement or capability trait (a `detail/` header, docs/concepts.md's second tier), or "
                         "raise the bound in cmake/check_concepts.cmake and say why in docs/concepts.md")
endif()
if(problems)
  message(FATAL_ERROR "check_concepts: ${found} concepts, these break the rule:${problems}")
endif()
message(STATUS "check_concepts: ${found} concepts, each in a header named after it and in ${DOCS}")
