set(UNIT_DEPS ivy_http ivy_balance ivy_api garden_common)
