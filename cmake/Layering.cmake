# The layering of the libraries (docs/architecture.md, "Layout"), checked on the target
# graph at configure time: a link that breaks it fails the configure with the
# chain that breaks it.
#
#   sp_support  <-  everything                        (formats, errors, XML)
#   sp_text (the tokenizer), sp_token_file  <-  sp_support only; the runtime
#              links sp_token_file (the token file's sidecar), never sp_text
#   sp_ir  <-  sp_plan  <-  sp_lower  <-  sp_analysis  <-  sp_passes  <-
#              sp_reports  <-  sp_driver  <-  sp_planner  (the compiler)
#                       <-  sp_html_report            (the HTML page)
#                       <-  sp_runtime                (the runtime: executor,
#                                                      kernels, communicators,
#                                                      the backend registry)
#                              <-  sp_train           (the training library)
#                              <-  sp_runtime_cuda    (the CUDA backend, and
#                                                      sp_cuda_host, its
#                                                      host-side logic)
#
# sp-run is built from the training library (the runtime, the plan library,
# the ONNX frontend: weights are read from the model, and written back by
# --export-onnx; the report page) and the CUDA backend, never from the
# compiler; the training library reaches the backends only through the
# registry.

# Every target T links, directly or not, as "T -> A -> B" chains in OUT.
function(sp_link_closure Target Out)
  set(Seen "")
  set(Queue "${Target}")
  set(Chains "")
  set(Chain_${Target} "${Target}")
  while(Queue)
    list(POP_FRONT Queue T)
    if(NOT TARGET ${T})
      continue()
    endif()
    get_target_property(Imported ${T} IMPORTED)
    if(Imported)
      continue()
    endif()
    get_target_property(Links ${T} LINK_LIBRARIES)
    get_target_property(ILinks ${T} INTERFACE_LINK_LIBRARIES)
    foreach(L IN LISTS Links ILinks)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" L "${L}")
      if(L MATCHES "-NOTFOUND$" OR L STREQUAL "" OR L IN_LIST Seen)
        continue()
      endif()
      list(APPEND Seen ${L})
      set(Chain_${L} "${Chain_${T}} -> ${L}")
      list(APPEND Chains "${Chain_${L}}")
      list(APPEND Queue ${L})
    endforeach()
  endwhile()
  set(${Out} "${Chains}" PARENT_SCOPE)
endfunction()

# Fails when Target reaches any of the Forbidden targets.
function(sp_forbid_links Target)
  sp_link_closure(${Target} Chains)
  foreach(Chain IN LISTS Chains)
    foreach(F IN LISTS ARGN)
      if(Chain MATCHES "-> ${F}$")
        message(FATAL_ERROR "layering: ${Chain}, but ${Target} must not "
                            "depend on ${F} (cmake/Layering.cmake)")
      endif()
    endforeach()
  endforeach()
endfunction()

function(sp_check_layering)
  set(Compiler sp_lower sp_analysis sp_passes sp_reports sp_driver sp_planner)
  set(Runtime sp_runtime sp_runtime_cpu sp_comm sp_cuda_host sp_runtime_cuda)
  set(Above sp_train sp_html_report)
  sp_forbid_links(sp_text sp_token_file sp_ir sp_plan sp_frontend ${Compiler}
                  ${Runtime} ${Above})
  # The runtime reads token files' sidecars, never the tokenizer (PCRE2).
  sp_forbid_links(sp_runtime sp_text)
  sp_forbid_links(sp_support sp_ir sp_plan sp_frontend ${Compiler} ${Runtime}
                  ${Above})
  sp_forbid_links(sp_plan ${Compiler} ${Runtime} sp_frontend ${Above})
  sp_forbid_links(sp_lower ${Runtime} sp_analysis sp_passes sp_reports
                  sp_driver sp_planner sp_frontend ${Above})
  sp_forbid_links(sp_analysis ${Runtime} sp_passes sp_reports
                  sp_driver sp_planner sp_frontend ${Above})
  sp_forbid_links(sp_passes ${Runtime} sp_reports sp_driver sp_planner
                  ${Above})
  sp_forbid_links(sp_reports ${Runtime} sp_driver sp_planner ${Above})
  sp_forbid_links(sp_driver ${Runtime} sp_planner sp_train)
  sp_forbid_links(sp_planner ${Runtime} sp_train)
  sp_forbid_links(sp_runtime ${Compiler} sp_runtime_cuda ${Above})
  sp_forbid_links(sp_html_report ${Compiler} ${Runtime} sp_frontend sp_train)
  sp_forbid_links(sp_train ${Compiler} sp_runtime_cuda sp_cuda_host)
  sp_forbid_links(sp_runtime_cuda ${Compiler} sp_frontend)
  sp_forbid_links(sp_cuda_host ${Compiler} sp_frontend)
  sp_forbid_links(sp-run ${Compiler})
endfunction()
