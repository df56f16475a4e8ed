set(UNIT_DEPS garden_tokenizer garden_common)
