set(UNIT_DEPS ivy_balance ivy_api garden_proto garden_common)
