set(UNIT_DEPS garden_rose_engine garden_rose_model garden_rose_mkmodel
  garden_rose_ops garden_common PkgConfig::SENTENCEPIECE)
# rose_binary_test.cc and rose_llm_binary_test.cc run the rose binary: build it first (deferred:
# the test target is created after this file is included).
cmake_language(DEFER CALL add_dependencies unit_rose_engine rose)
