set(UNIT_DEPS ivy_http ivy_api_generate ivy_balance ivy_api garden_harmony garden_tokenizer
    garden_proto garden_common)
