set(UNIT_DEPS garden_rose_ops garden_common)
