set(UNIT_DEPS ivy_api garden_common)
