set(UNIT_DEPS garden_loadgen garden_common)
