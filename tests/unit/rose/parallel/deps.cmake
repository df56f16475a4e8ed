set(UNIT_DEPS garden_rose_parallel garden_rose_mkmodel garden_rose_model garden_common)
# The sharded-model sweep runs 37 layouts of up to 8 rank threads; minutes on a loaded 2-core box.
set(UNIT_TIMEOUT 1200)
