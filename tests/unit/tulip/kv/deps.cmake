set(UNIT_DEPS garden_tulip_core garden_common)
