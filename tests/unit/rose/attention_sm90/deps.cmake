set(UNIT_DEPS garden_common)
