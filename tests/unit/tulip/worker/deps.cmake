set(UNIT_DEPS garden_tulip_core garden_common)
# The worker tests spawn tests/fakes/fake-rose.
cmake_language(DEFER CALL add_dependencies unit_tulip_worker fake-rose)
