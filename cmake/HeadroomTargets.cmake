# Shared target conventions so every folder's CMakeLists stays a few lines.

# Designated initializers leave members at their defaults on purpose (options
# structs, STYLE.md #7), so -Wmissing-field-initializers is off.
set(HEADROOM_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  -Wno-missing-field-initializers)
if(HEADROOM_WERROR)
  list(APPEND HEADROOM_WARNINGS -Werror)
endif()

# headroom_library(<target> EXPORT_NAME <name> SOURCES ... HEADERS ...
#                  [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Declares a compiled library exported as headroom::<name>. Headers are
# included by their path from the repository root ("hardware/gpu_catalog.h") both
# in the tree and after installation (under include/headroom).
function(headroom_library target)
  cmake_parse_arguments(ARG "" "EXPORT_NAME" "SOURCES;HEADERS;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${target} ${ARG_SOURCES})
  add_library(headroom::${ARG_EXPORT_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME} POSITION_INDEPENDENT_CODE ON)
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS ${PROJECT_SOURCE_DIR} FILES ${ARG_HEADERS})
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${HEADROOM_WARNINGS}>")
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  install(TARGETS ${target} EXPORT headroomTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
    FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/headroom)
endfunction()

# headroom_embed_files(<output.cc> <namespace-qualified function> FILES ...)
# Generates a C++ source whose function returns the files' contents keyed by
# file name, so data (the GPU catalog, model presets) ships inside the library
# and installed binaries need no data directory. Each file becomes a byte
# array rather than a string literal: compilers need not accept literals over
# 64 KiB (clang's -Woverlength-strings), and a config.json with ImageNet's
# 1000 labels is longer.
function(headroom_embed_files output function)
  cmake_parse_arguments(ARG "" "" "FILES" ${ARGN})
  set(arrays "")
  set(entries "")
  set(index 0)
  foreach(file IN LISTS ARG_FILES)
    get_filename_component(name ${file} NAME)
    file(READ ${file} hex HEX)
    string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
    string(APPEND arrays "constexpr unsigned char kFile${index}[] = {${bytes}};\n")
    string(APPEND entries "      {\"${name}\", std::string_view(reinterpret_cast<const char*>(kFile${index}),\n"
                          "                                    sizeof(kFile${index}))},\n")
    math(EXPR index "${index} + 1")
  endforeach()
  set(HEADROOM_EMBED_FUNCTION ${function})
  set(HEADROOM_EMBED_ARRAYS "${arrays}")
  set(HEADROOM_EMBED_ENTRIES "${entries}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/embedded_files.cc.in ${output} @ONLY)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ARG_FILES})
endfunction()
