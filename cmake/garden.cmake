# Helpers shared by every CMakeLists in the tree.

# garden_library(NAME SRCS... [DEPS ...]): a static library with the project's warnings.
function(garden_library name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SRCS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GARDEN_WARN_FLAGS}>)
  target_link_libraries(${name} PUBLIC ${A_PUBLIC_DEPS} ${A_DEPS})
endfunction()

# garden_binary(NAME SRCS... DEPS ...)
function(garden_binary name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GARDEN_WARN_FLAGS}>)
  target_link_libraries(${name} PRIVATE ${A_DEPS})
endfunction()

# garden_test(NAME SRCS... DEPS ... [LABELS ...]): a GoogleTest binary registered with ctest.
# Tests run with the build tree's working directory; GARDEN_SOURCE_DIR and GARDEN_BUILD_DIR are
# in their environment so they can find fixtures and binaries.
function(garden_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GARDEN_WARN_FLAGS}>)
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "GARDEN_SOURCE_DIR=${PROJECT_SOURCE_DIR};GARDEN_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
