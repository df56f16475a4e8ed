set(UNIT_DEPS garden_harmony garden_grammar garden_common)
if(TARGET garden_harmony_cli)
  list(APPEND UNIT_DEPS garden_harmony_cli)
endif()
