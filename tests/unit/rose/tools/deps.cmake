set(UNIT_DEPS garden_rose_mkmodel garden_rose_model garden_common
  PkgConfig::SENTENCEPIECE)
