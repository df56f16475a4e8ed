set(UNIT_DEPS garden_grammar garden_common)
