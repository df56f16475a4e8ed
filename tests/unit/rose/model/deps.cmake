set(UNIT_DEPS garden_rose_model garden_common)
