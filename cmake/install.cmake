# Install rules, the exported CMake package and nofrag.pc (issue 14).
#
#   cmake --install build --prefix P   installs:
#     P/include/nofrag.h
#     P/lib/libnofrag.so.X.Y.Z (+ SONAME link libnofrag.so.X, dev link libnofrag.so), P/lib/libnofrag.a
#                                       (lib is CMAKE_INSTALL_LIBDIR: lib64, lib/<multiarch> on some systems)
#     P/bin/nofrag                      the CLI
#     P/share/nofrag/python/nofrag/     the Python package: the CLI runs `python3 -m nofrag.torch_trace`
#                                       from there to read PyTorch snapshot pickles (tools/input.c)
#     P/lib/cmake/nofrag/               find_package(nofrag) -> nofrag::nofrag (shared), nofrag::nofrag_static
#     P/lib/pkgconfig/nofrag.pc         pkg-config --cflags --libs nofrag
#
# Included at the end of the top-level CMakeLists.txt: it only refers to the
# targets nofrag, nofrag_static and nofrag_cli by name, so the layout of the
# sources does not matter here. Link dependencies (threads, zlib, dl) are read
# from the targets, not hard-coded, so nofrag.pc and nofragConfig.cmake follow
# whatever libnofrag links.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(NF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nofrag)
set(NF_PYTHON_DIR ${CMAKE_INSTALL_DATADIR}/nofrag/python)

# Include directories given as plain source paths cannot be exported: keep them
# for the build tree only, and point installed users at P/include.
foreach(tgt nofrag nofrag_static)
  get_target_property(dirs ${tgt} INTERFACE_INCLUDE_DIRECTORIES)
  set(fixed "")
  foreach(d IN LISTS dirs)
    if(d MATCHES "^\\$<")
      list(APPEND fixed "${d}")
    else()
      get_filename_component(d "${d}" ABSOLUTE BASE_DIR ${PROJECT_SOURCE_DIR})
      list(APPEND fixed "$<BUILD_INTERFACE:${d}>")
    endif()
  endforeach()
  list(APPEND fixed "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  set_target_properties(${tgt} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${fixed}")
endforeach()

install(TARGETS nofrag nofrag_static EXPORT nofragTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/nofrag.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The Python package beside the CLI, plus _version.py (a checkout reads the
# version from include/nofrag.h instead). _version.py also says where
# libnofrag.so is (nofrag._lib reads it): CMAKE_INSTALL_LIBDIR may be lib,
# lib64, lib/x86_64-linux-gnu... Relative to the installed package when both
# directories are under the prefix, so that `cmake --install --prefix`,
# DESTDIR and a moved tree all keep working; absolute otherwise.
file(GLOB NF_PY_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/nofrag/*.py)
list(FILTER NF_PY_FILES EXCLUDE REGEX "/_version\\.py$")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_DATADIR}")
  set(NF_PY_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
else()
  file(RELATIVE_PATH NF_PY_LIBDIR "/nf_root/${NF_PYTHON_DIR}/nofrag" "/nf_root/${CMAKE_INSTALL_LIBDIR}")
endif()
file(WRITE ${PROJECT_BINARY_DIR}/nf_python/_version.py
     "# Written by the build (cmake/install.cmake, setup.py) from include/nofrag.h.\n"
     "version = \"${PROJECT_VERSION}\"\n"
     "# libnofrag.so's directory (CMAKE_INSTALL_LIBDIR): relative to this package's, or absolute.\n"
     "libdir = \"${NF_PY_LIBDIR}\"\n")
install(FILES ${NF_PY_FILES} ${PROJECT_BINARY_DIR}/nf_python/_version.py DESTINATION ${NF_PYTHON_DIR}/nofrag)

if(TARGET nofrag_cli)
  install(TARGETS nofrag_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  # Last place the CLI looks for the Python package (after NOFRAG_PYTHON_DIR
  # and paths relative to its own executable): this source tree, so that a
  # build directory anywhere (out of tree) reads PyTorch pickles too.
  target_compile_definitions(nofrag_cli PRIVATE NF_SOURCE_PYTHON_DIR="${PROJECT_SOURCE_DIR}/python")
endif()

# Dependencies of libnofrag as the targets declare them, for nofrag.pc
# (Requires.private / Libs.private: what a static link needs) and for
# nofragConfig.cmake (find_dependency).
set(NF_PC_REQUIRES_PRIVATE "")
set(NF_PC_LIBS_PRIVATE "")
set(NF_CONFIG_DEPS "")
get_target_property(nf_links nofrag_static INTERFACE_LINK_LIBRARIES)
get_target_property(nf_links_shared nofrag INTERFACE_LINK_LIBRARIES)
list(APPEND nf_links ${nf_links_shared})
list(REMOVE_DUPLICATES nf_links)
foreach(l IN LISTS nf_links)
  string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
  if(l STREQUAL "Threads::Threads")
    string(APPEND NF_PC_LIBS_PRIVATE " -pthread")
    string(APPEND NF_CONFIG_DEPS "find_dependency(Threads)\n")
  elseif(l STREQUAL "ZLIB::ZLIB")
    string(APPEND NF_PC_REQUIRES_PRIVATE " zlib")
    string(APPEND NF_CONFIG_DEPS "find_dependency(ZLIB)\n")
  elseif(l MATCHES "^[A-Za-z0-9_.+-]+$" AND NOT TARGET ${l})
    string(APPEND NF_PC_LIBS_PRIVATE " -l${l}")
  elseif(l AND NOT l MATCHES "-NOTFOUND$")
    message(FATAL_ERROR "cmake/install.cmake: libnofrag links '${l}', which nofrag.pc and "
                        "nofragConfig.cmake do not know how to express: teach this file")
  endif()
endforeach()
string(STRIP "${NF_PC_REQUIRES_PRIVATE}" NF_PC_REQUIRES_PRIVATE)
string(STRIP "${NF_PC_LIBS_PRIVATE}" NF_PC_LIBS_PRIVATE)

install(EXPORT nofragTargets NAMESPACE nofrag:: DESTINATION ${NF_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/nofragConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/nofragConfig.cmake INSTALL_DESTINATION ${NF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/nofragConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/nofragConfig.cmake ${PROJECT_BINARY_DIR}/nofragConfigVersion.cmake
        DESTINATION ${NF_CMAKE_DIR})

# prefix= is ${pcfiledir} relative, so nofrag.pc is right for whatever
# `cmake --install --prefix P` (or DESTDIR, or a moved tree) puts it under; the
# configure-time CMAKE_INSTALL_PREFIX would not be.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(NF_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH nf_up "/nf_root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/nf_root")
  string(REGEX REPLACE "/$" "" nf_up "${nf_up}")
  set(NF_PC_PREFIX "\${pcfiledir}/${nf_up}")
endif()
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(NF_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(NF_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/nofrag.pc.in ${PROJECT_BINARY_DIR}/nofrag.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/nofrag.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
