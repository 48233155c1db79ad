# kreg_add_plugin(<group> VERSION x.y.z SOURCES <cpu sources...> [CUDA_SOURCES <.cu sources...>]
#                 [JIT_SOURCES <files the core compiles at run time...>])
#
# Builds one ops group as its own shared object, libkreg_<group>.so. CPU sources (the
# registration file and the CPU references) always build; CUDA sources only when CUDA is
# available, in which case KREG_PLUGIN_HAS_CUDA=1 is defined so the registration file can
# list the CUDA implementations (KREG_IF_CUDA). Plugins link the ABI headers only
# (kreg::plugin_api), never the core library.
#
# The same function serves two callers:
# - kreg's own tree (plugins/, tests/fixtures/plugins): CUDA when the top level found a
#   toolkit (KREG_HAVE_CUDA), output in KREG_PLUGIN_OUTPUT_DIR (build/plugins, where
#   registry.yaml looks), kreg's warnings (KREG_WARNINGS);
# - a project outside the tree, after find_package(kreg): none of those variables is set,
#   so CUDA sources build when the calling project enabled the CUDA language, the library
#   lands in CMAKE_CURRENT_BINARY_DIR (or KREG_PLUGIN_OUTPUT_DIR if the project sets it),
#   and no warning flags are imposed.
function(kreg_add_plugin group)
  cmake_parse_arguments(ARG "" "VERSION" "SOURCES;CUDA_SOURCES;JIT_SOURCES" ${ARGN})
  if(NOT ARG_VERSION)
    message(FATAL_ERROR "kreg_add_plugin(${group}): VERSION x.y.z is required (it reaches the "
                        "plugin's descriptor; registry.yaml may pin it)")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "kreg_add_plugin(${group}): SOURCES is empty (the registration file "
                        "and the CPU references are needed)")
  endif()
  if(NOT TARGET kreg::plugin_api)
    message(FATAL_ERROR "kreg_add_plugin(${group}): no target kreg::plugin_api; call "
                        "find_package(kreg) first")
  endif()

  if(DEFINED KREG_HAVE_CUDA)
    set(with_cuda ${KREG_HAVE_CUDA})
  else()
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if("CUDA" IN_LIST languages)
      set(with_cuda ON)
    else()
      set(with_cuda OFF)
      if(ARG_CUDA_SOURCES)
        message(STATUS "kreg_add_plugin(${group}): the CUDA language is not enabled: building "
                       "the CPU implementations only")
      endif()
    endif()
  endif()
  if(DEFINED KREG_PLUGIN_OUTPUT_DIR)
    set(output_dir ${KREG_PLUGIN_OUTPUT_DIR})
  else()
    set(output_dir ${CMAKE_CURRENT_BINARY_DIR})
  endif()

  set(target kreg_${group})
  set(sources ${ARG_SOURCES})
  if(with_cuda)
    list(APPEND sources ${ARG_CUDA_SOURCES})
  endif()
  add_library(${target} MODULE ${sources})
  target_link_libraries(${target} PRIVATE kreg::plugin_api)
  # The SDK is C++20 (designated initializers, constexpr records). In kreg's tree
  # CMAKE_CXX_STANDARD is already 20, so this adds no flag there.
  target_compile_features(${target} PRIVATE cxx_std_20)
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME kreg_${group}
    LIBRARY_OUTPUT_DIRECTORY ${output_dir}
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # GNU unique symbols would pin the library in memory forever (no real unload). Only GCC
  # makes them (and only GCC knows the flag).
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${KREG_WARNINGS}>
    $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-fno-gnu-unique>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-gnu-unique --expt-relaxed-constexpr>)
  target_link_options(${target} PRIVATE LINKER:--no-undefined)
  target_compile_definitions(${target} PRIVATE KREG_PLUGIN_VERSION="${ARG_VERSION}")
  if(with_cuda)
    if(NOT DEFINED CMAKE_CUDA_STANDARD)
      # Outside kreg's tree: the SDK's CUDA side is C++20 too. CMake 3.25 does not know
      # nvcc 12+'s flag for it (kreg's top level sets CMAKE_CUDA20_STANDARD_COMPILE_OPTION).
      if(CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
        set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
      else()
        target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
      endif()
    endif()
    if(NOT TARGET CUDA::cudart)
      find_package(CUDAToolkit REQUIRED)
    endif()
    string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${CMAKE_CUDA_COMPILER_VERSION}")
    math(EXPR cuda_version "${CMAKE_MATCH_1} * 1000 + ${CMAKE_MATCH_2} * 10")
    # The target's own architectures (the project's CMAKE_CUDA_ARCHITECTURES unless the
    # caller set the property): the capabilities kreg::cuda() claims are derived from them.
    get_target_property(cuda_archs ${target} CUDA_ARCHITECTURES)
    if(NOT cuda_archs)
      set(cuda_archs "")  # unset or OFF: the claim is sm75+, narrowed at load to the images
    endif()
    string(REPLACE ";" "," archs "${cuda_archs}")
    target_compile_definitions(${target} PRIVATE
      KREG_PLUGIN_HAS_CUDA=1
      KREG_PLUGIN_CUDA_VERSION=${cuda_version}
      KREG_PLUGIN_CUDA_ARCHS="${archs}")
    # One CUDA runtime per process, shared with the host (torch, kreg's tools): a
    # static copy in each plugin besides CUDA::cudart would be two runtimes in one library.
    set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
    target_link_libraries(${target} PRIVATE CUDA::cudart)
    if(ARG_JIT_SOURCES)
      kreg_embed_jit_sources(${target} ${group} ${ARG_JIT_SOURCES})
    endif()
    # A source whose device code depends on __CUDA_ARCH__ (a path guarded for sm_90) must
    # still compile in the sm_80 pass of the default architectures (80-real;90). A build
    # that leaves sm_80 out, as CI's sm_90-only one does, compiles those sources once more
    # for sm_80 into an object library that nothing links: a break there fails the build.
    # (Headers with such guards are covered only through a source that has its own.)
    if(KREG_CHECK_SM80_PASS AND NOT "${cuda_archs}" MATCHES "(^|;)80")
      set(guarded "")
      foreach(src IN LISTS ARG_CUDA_SOURCES)
        file(READ ${CMAKE_CURRENT_SOURCE_DIR}/${src} text)
        if(text MATCHES "__CUDA_ARCH__")
          list(APPEND guarded ${src})
        endif()
      endforeach()
      if(guarded)
        set(check ${target}_sm80_pass)
        add_library(${check} OBJECT ${guarded})
        target_link_libraries(${check} PRIVATE kreg::plugin_api CUDA::cudart)
        target_compile_features(${check} PRIVATE cxx_std_20)
        target_compile_definitions(${check} PRIVATE
          $<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>)
        target_compile_options(${check} PRIVATE $<TARGET_PROPERTY:${target},COMPILE_OPTIONS>)
        target_include_directories(${check} PRIVATE
          $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
        set_target_properties(${check} PROPERTIES CUDA_ARCHITECTURES 80-real
          CUDA_RUNTIME_LIBRARY Shared)
        add_dependencies(${check} ${target})  # generated headers (JIT sources) first
      endif()
    endif()
  endif()
  # kreg refuses a library that its group or others may write, or that sits in such a
  # folder (path-safety); under a umask of 002 the linker would produce exactly that.
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND chmod go-w $<TARGET_FILE:${target}> $<TARGET_FILE_DIR:${target}> VERBATIM)
  set_property(GLOBAL APPEND PROPERTY KREG_PLUGIN_TARGETS ${target})
endfunction()

# kreg_embed_jit_sources(<target> <group> <files...>): the JIT sources of a group (docs/
# jit.md) and kreg's JIT prelude (kreg_jit/prelude.cuh) as string constants in a
# generated header, <group>_jit_sources.h: `kreg_jit_text::<name>` for each file, its
# name with every character that is not a letter or digit made '_' (rmsnorm.cu.jit ->
# rmsnorm_cu_jit). Editing a file re-runs CMake, which rewrites the header only when its
# content changes.
function(kreg_embed_jit_sources target group)
  # Beside this file in kreg's tree (core/cmake -> core/include).
  set(files "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include/kreg/jit/prelude.cuh")
  foreach(f ${ARGN})
    get_filename_component(abs ${f} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    list(APPEND files ${abs})
  endforeach()
  set(text "// Generated by kreg_embed_jit_sources from ${group}'s JIT sources: do not edit.\n")
  string(APPEND text "#pragma once\nnamespace kreg_jit_text {\n")
  foreach(f ${files})
    if(NOT EXISTS ${f})
      message(FATAL_ERROR "kreg_embed_jit_sources(${group}): no file ${f}")
    endif()
    file(READ ${f} content)
    if(content MATCHES "\\)kreg_jit\"")
      message(FATAL_ERROR "kreg_embed_jit_sources(${group}): ${f} contains the delimiter )kreg_jit\"")
    endif()
    get_filename_component(name ${f} NAME)
    string(MAKE_C_IDENTIFIER "${name}" ident)
    string(APPEND text "inline constexpr char ${ident}[] = R\"kreg_jit(${content})kreg_jit\";\n")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${f})
  endforeach()
  string(APPEND text "}  // namespace kreg_jit_text\n")
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/kreg_jit_generated)
  file(WRITE ${out_dir}/${group}_jit_sources.h.tmp "${text}")
  configure_file(${out_dir}/${group}_jit_sources.h.tmp ${out_dir}/${group}_jit_sources.h COPYONLY)
  target_include_directories(${target} PRIVATE ${out_dir})
endfunction()
