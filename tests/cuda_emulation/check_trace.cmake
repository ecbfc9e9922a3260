# cmake -DFILE=trace.json -P check_trace.cmake: the Chrome trace train_gpt --trace wrote over a 2-stage pipeline
# holds both pipeline ranks' lanes and their forward, backward and point-to-point slices.
file(READ "${FILE}" trace)
foreach(expected IN ITEMS "\"traceEvents\"" "pipeline rank 0" "pipeline rank 1" "\"cat\":\"forward\""
                          "\"cat\":\"backward\"" "\"cat\":\"p2p\"")
  string(FIND "${trace}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_trace: ${FILE} has no ${expected}")
  endif()
endforeach()
