# `cmake --install build --prefix P`: what a project outside this tree needs to build and
# run plugins (docs/adding-a-group.md, "Out-of-tree plugins").
#   P/include/kreg/**           the headers: abi.h, plugin.hpp, device/*.cuh, the core API
#   P/lib/libkreg.so*           kreg_core with its SONAME and links           (runtime)
#   P/bin/kreg                  the CLI (tools/CMakeLists.txt)                (runtime)
#   P/libexec/kreg/kreg-probe   the child probe_plugin loads plugins in       (runtime)
#   P/lib/cmake/kreg/           kregConfig.cmake, kregConfigVersion.cmake, the exported
#                               targets kreg::core and kreg::plugin_api, KregPlugin.cmake
#                               (kreg_add_plugin)                             (development)
# Included from the top level after core/ and tools/ are defined. Two components, so that
# a tree where only kreg_core and kreg were built can install just these:
#   cmake --install build --prefix P --component runtime
#   cmake --install build --prefix P --component development
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KREG_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kreg
    CACHE STRING "Where `cmake --install` puts kreg's CMake package (under the prefix)")

# The headers are found in the source tree while building and under the prefix once
# installed; core/CMakeLists.txt names the source folder only, which must not reach the
# exported targets.
set(kreg_include_dirs "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/core/include>"
                      "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
set_target_properties(kreg_plugin_api PROPERTIES
  EXPORT_NAME plugin_api
  INTERFACE_INCLUDE_DIRECTORIES "${kreg_include_dirs}")
# Boost.DLL and yaml-cpp are private to libkreg (no public header includes them), so the
# exported kreg::core links kreg::plugin_api (dlpack) and Threads only.
set_target_properties(kreg_core PROPERTIES
  EXPORT_NAME core
  INTERFACE_INCLUDE_DIRECTORIES "${kreg_include_dirs}")

install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/kreg
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(TARGETS kreg_core kreg_plugin_api EXPORT kregTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
                NAMELINK_COMPONENT development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The probe's child program (core/CMakeLists.txt says how probe_plugin finds it there).
install(TARGETS kreg-probe RUNTIME DESTINATION ${KREG_PROBE_INSTALL_DIR} COMPONENT runtime)
install(EXPORT kregTargets NAMESPACE kreg:: DESTINATION ${KREG_INSTALL_CMAKEDIR}
        COMPONENT development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/core/cmake/kregConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kregConfig.cmake INSTALL_DESTINATION ${KREG_INSTALL_CMAKEDIR})
# The plugin ABI is checked at load time (abi.h's major/minor); the package version says
# which SDK the headers are, and a 0.x minor may change the SDK's C++ side.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kregConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kregConfig.cmake ${PROJECT_BINARY_DIR}/kregConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/core/cmake/KregPlugin.cmake
        DESTINATION ${KREG_INSTALL_CMAKEDIR} COMPONENT development)
