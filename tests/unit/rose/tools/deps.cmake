set(UNIT_DEPS garden_rose_mkmodel garden_rose_model garden_rose_llm garden_common
  PkgConfig::SENTENCEPIECE)
