# kreg_add_plugin(<group> VERSION x.y.z SOURCES <cpu sources...> [CUDA_SOURCES <.cu sources...>])
#
# Builds one ops group as its own shared object, build/plugins/libkreg_<group>.so. CPU
# sources (the registration file and the CPU references) always build; CUDA sources only
# when a CUDA toolkit was found, in which case KREG_PLUGIN_HAS_CUDA=1 is defined so the
# registration file can list the CUDA implementations. Plugins link the ABI headers only,
# never the core library.
function(kreg_add_plugin group)
  cmake_parse_arguments(ARG "" "VERSION" "SOURCES;CUDA_SOURCES" ${ARGN})
  if(NOT ARG_VERSION)
    message(FATAL_ERROR "kreg_add_plugin(${group}): VERSION x.y.z is required (it reaches the "
                        "plugin's descriptor; registry.yaml may pin it)")
  endif()
  set(target kreg_${group})
  set(sources ${ARG_SOURCES})
  if(KREG_HAVE_CUDA)
    list(APPEND sources ${ARG_CUDA_SOURCES})
  endif()
  add_library(${target} MODULE ${sources})
  target_link_libraries(${target} PRIVATE kreg::plugin_api)
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME kreg_${group}
    LIBRARY_OUTPUT_DIRECTORY ${KREG_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # GNU unique symbols would pin the library in memory forever (no real unload).
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${KREG_WARNINGS} -fno-gnu-unique>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-gnu-unique --expt-relaxed-constexpr>)
  target_link_options(${target} PRIVATE LINKER:--no-undefined)
  target_compile_definitions(${target} PRIVATE KREG_PLUGIN_VERSION="${ARG_VERSION}")
  if(KREG_HAVE_CUDA)
    string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${CMAKE_CUDA_COMPILER_VERSION}")
    math(EXPR cuda_version "${CMAKE_MATCH_1} * 1000 + ${CMAKE_MATCH_2} * 10")
    string(REPLACE ";" "," archs "${CMAKE_CUDA_ARCHITECTURES}")
    target_compile_definitions(${target} PRIVATE
      KREG_PLUGIN_HAS_CUDA=1
      KREG_PLUGIN_CUDA_VERSION=${cuda_version}
      KREG_PLUGIN_CUDA_ARCHS="${archs}")
    target_link_libraries(${target} PRIVATE CUDA::cudart)
  endif()
  # kreg refuses a library that its group or others may write, or that sits in such a
  # folder (path-safety); under a umask of 002 the linker would produce exactly that.
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND chmod go-w $<TARGET_FILE:${target}> $<TARGET_FILE_DIR:${target}> VERBATIM)
  set_property(GLOBAL APPEND PROPERTY KREG_PLUGIN_TARGETS ${target})
endfunction()
