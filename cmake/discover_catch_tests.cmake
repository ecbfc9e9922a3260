#[[ Lists the test cases of a Catch2 binary and writes one CTest entry per case, each with every label.
      cmake -DEXE=path -DPREFIX=name -DLABELS=a,b -DWORKDIR=dir -DTIMEOUT=s [-DCOST=s] -DOUT=file -P discover_catch_tests.cmake
    Run after each build of the binary (mpar_add_test_binary in tests/CMakeLists.txt). Catch2's own
    catch_discover_tests passes only the first label of a list, and a directory's LABELS property
    reaches discovered tests on some CMake versions only; writing the labels into each entry works
    everywhere, so `ctest -L tsan` selects exactly the tests of the binaries labelled tsan. ]]
cmake_policy(VERSION 3.25)  # a -P script starts with old policies: IN_LIST and list() need new ones
execute_process(COMMAND "${EXE}" --list-test-names-only OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_VARIABLE err)
# Catch2 2.x exits with the number of test cases listed; a crash or a signal is not a number.
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "discover_catch_tests: '${EXE} --list-test-names-only' failed (${rc}): ${err}")
endif()
string(REPLACE "," ";" labels "${LABELS}")
# Cases tagged [sweep] (a large input space or a measured training run, minutes under a sanitizer) also carry the
# label `sweep`, which the sanitizer presets exclude: other cases reach the same code there.
execute_process(COMMAND "${EXE}" "[sweep]" --list-test-names-only OUTPUT_VARIABLE sweep_out RESULT_VARIABLE sweep_rc)
if(NOT sweep_rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "discover_catch_tests: '${EXE} [sweep] --list-test-names-only' failed (${sweep_rc})")
endif()
string(REPLACE ";" "<mpar-semicolon>" sweep_out "${sweep_out}")
string(REPLACE "\n" ";" sweep_names "${sweep_out}")
list(TRANSFORM sweep_names STRIP)
if(NOT DEFINED COST OR COST STREQUAL "")
  set(COST 0)
endif()
# Test names may hold ';', which CMake lists would split: carry them as a placeholder meanwhile.
string(REPLACE ";" "<mpar-semicolon>" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  string(REPLACE "<mpar-semicolon>" ";" name "${line}")
  string(STRIP "${name}" name)
  if(name STREQUAL "")
    continue()
  endif()
  # Catch2 reads ',' '[' ']' in a test spec as syntax: escape them to select exactly this case.
  set(spec "${name}")
  foreach(c , [ ])
    string(REPLACE "${c}" "\\${c}" spec "${spec}")
  endforeach()
  # -w NoTests: a spec that matches no case (a renamed test) fails instead of passing with nothing run.
  set(case_labels "${labels}")
  string(STRIP "${line}" raw)
  if(raw IN_LIST sweep_names)
    list(APPEND case_labels sweep)
  endif()
  string(APPEND script "add_test([==[${PREFIX}: ${name}]==] [==[${EXE}]==] [==[${spec}]==] -w NoTests)\n"
         "set_tests_properties([==[${PREFIX}: ${name}]==] PROPERTIES LABELS [==[${case_labels}]==] "
         "WORKING_DIRECTORY [==[${WORKDIR}]==] TIMEOUT ${TIMEOUT} COST ${COST})\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "discover_catch_tests: '${EXE}' lists no test cases")
endif()
file(WRITE "${OUT}" "${script}")
