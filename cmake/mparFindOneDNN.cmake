# Finds oneDNN 2.x (libdnnl and its C API header oneapi/dnnl/dnnl.h) as the imported target mpar::dnnl
# and sets MPAR_DNNL_FOUND. Used by mpar's own build and by its installed package config. The host GEMM
# (include/mpar/backend/host/onednn_gemm.hpp) is written against the 2.x C API; oneDNN 3 changed it,
# so a 3.x installation is reported and not used (the build then takes CBLAS).
#
# oneDNN's own package config is not used: the one in Debian's libdnnl-dev (2.6) requires OpenCL's
# development files, because the library was built with an OpenCL GPU runtime, although mpar only
# calls its CPU engine and the shared library already names every library it needs.
set(MPAR_DNNL_FOUND OFF)
if(TARGET mpar::dnnl)
  set(MPAR_DNNL_FOUND ON)
else()
  find_path(MPAR_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(MPAR_DNNL_LIBRARY dnnl)
  if(MPAR_DNNL_INCLUDE_DIR AND MPAR_DNNL_LIBRARY AND EXISTS "${MPAR_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
    file(STRINGS "${MPAR_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _mpar_dnnl_major REGEX "^#define DNNL_VERSION_MAJOR [0-9]+")
    string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _mpar_dnnl_major "${_mpar_dnnl_major}")
    if(_mpar_dnnl_major EQUAL 2)
      add_library(mpar::dnnl UNKNOWN IMPORTED)
      set_target_properties(mpar::dnnl PROPERTIES IMPORTED_LOCATION "${MPAR_DNNL_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${MPAR_DNNL_INCLUDE_DIR}")
      set(MPAR_DNNL_FOUND ON)
    else()
      message(STATUS "mpar: oneDNN ${_mpar_dnnl_major}.x at ${MPAR_DNNL_LIBRARY} is not used (the host GEMM needs the 2.x API)")
    endif()
    unset(_mpar_dnnl_major)
  endif()
endif()
