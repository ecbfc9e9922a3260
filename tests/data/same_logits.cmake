# cmake -DGPT_LOGITS=exe -DA=a.safetensors -DB=b.safetensors -DWORK=dir "-DARGS=--vocab;76;..." -P same_logits.cmake:
# gpt_logits computes the logits of one sequence from each file on one rank; the two .npy files must be equal byte
# for byte (the same weights in the same layout compute the same bits).
foreach(side A B)
  execute_process(COMMAND ${GPT_LOGITS} --safetensors ${${side}} ${ARGS} --out ${WORK}/${side}.npy
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "same_logits: gpt_logits on ${${side}} failed (${rc}): ${out}${err}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/A.npy ${WORK}/B.npy RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "same_logits: ${A} and ${B} give different logits")
endif()
message(STATUS "same_logits: ${A} and ${B} give the same logits")
