set(UNIT_DEPS garden_rose_parallel garden_rose_engine garden_rose_mkmodel garden_rose_model
  garden_rose_ops garden_common PkgConfig::SENTENCEPIECE)
# rose_ranks_test.cc runs the rose binary with --tp/--dp/--ep (rank processes): build it first.
cmake_language(DEFER CALL add_dependencies unit_rose_ranks rose)
