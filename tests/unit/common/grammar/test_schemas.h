#pragma once
// The schemas the grammar tests and the bench share: each with texts it must accept and texts it
// must reject (whole documents, default whitespace policy: at most one space per place).

#include <string>
#include <vector>

namespace garden::grammar::testing {

struct SchemaCase {
  std::string name;
  std::string schema;  // "json_object" = response_format json_object mode
  std::vector<std::string> accept;
  std::vector<std::string> reject;
};

inline std::string manyWordsEnum() {
  std::string s = R"({"enum":[)";
  for (int i = 0; i < 200; ++i) {
    if (i) s += ",";
    s += "\"w" + std::to_string(i * 7919 % 1000) + "_" + std::to_string(i) + "\"";
  }
  return s + "]}";
}

inline const std::vector<SchemaCase>& schemaCases() {
  static const std::vector<SchemaCase> k = {
      {"string", R"({"type":"string"})",
       {R"("")", R"("hello")", R"("a\"b\\c\n\u00e9")", "\"caf\xC3\xA9 \xE2\x82\xAC\xF0\x9F\x98\x80\""},
       {R"(hello)", R"("a)", R"("a"b")", "\"\x01\"", "\"\xC3\"", "\"\xED\xA0\x80\"", R"("\x")",
        R"("\u12")", R"( "a")"}},
      {"integer", R"({"type":"integer"})",
       {"0", "-7", "1234567890"},
       {"01", "-", "1.5", "1e3", "+1", "--1", "1 "}},
      {"number", R"({"type":"number"})",
       {"0", "-0.5", "3.25e-10", "1E+3", "42"},
       {".5", "1.", "1e", "01.5", "NaN", "-"}},
      {"boolean", R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null", "tru"}},
      {"null", R"({"type":"null"})", {"null"}, {"nil", "\"null\"", "0"}},
      {"string_or_null", R"({"type":["string","null"]})",
       {"null", R"("x")"},
       {"1", "true"}},
      {"enum_strings", R"({"enum":["red","green","blue","greenish"]})",
       {R"("red")", R"("green")", R"("greenish")"},
       {R"("gree")", R"("yellow")", R"("green ")", "red"}},
      {"const_object", R"({"const":{"a":[1,2],"b":null}})",
       {R"({"a":[1,2],"b":null})"},
       {R"({"a":[1,2]})", R"({"b":null,"a":[1,2]})"}},
      {"person_strict",
       R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false})",
       {R"({"name":"Ann","age":31})", R"({ "name": "Ann", "age": 31 })"},
       {R"({"name":"Ann"})", R"({"age":31,"name":"Ann"})", R"({"name":"Ann","age":31,"x":1})",
        R"({"name":"Ann","age":"31"})", R"({"name":  "Ann","age":31})", R"({"name":"Ann",})"}},
      {"optional_props",
       R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"number"},"c":{"type":"boolean"}},"required":["a","c"],"additionalProperties":false})",
       {R"({"a":"x","c":true})", R"({"a":"x","b":1.5,"c":false})"},
       {R"({"a":"x"})", R"({"a":"x","b":1})", R"({"c":true})", R"({"b":1,"a":"x","c":true})"}},
      {"extra_props_allowed",
       R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]})",
       {R"({"id":1})", R"({"id":1,"note":"x","tags":[1,{"a":null}]})"},
       {R"({"note":"x"})", R"({"id":1,"id":2})", R"({"id":"1"})"}},
      {"int_array_2_4",
       R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":4})",
       {"[1,2]", "[1, 2, 3]", "[1,2,3,4]"},
       {"[1]", "[]", "[1,2,3,4,5]", "[1,2,]", "[1,\"2\"]"}},
      {"array_of_objects",
       R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"string"},"v":{"type":"number"}},"required":["k","v"],"additionalProperties":false}})",
       {"[]", R"([{"k":"a","v":1},{"k":"b","v":-2.5}])"},
       {R"([{"k":"a"}])", R"([{"v":1,"k":"a"}])", R"({"k":"a","v":1})"}},
      {"deeply_nested",
       R"({"type":"object","properties":{"l1":{"type":"object","properties":{"l2":{"type":"array","items":{"type":"object","properties":{"l3":{"type":"object","properties":{"l4":{"enum":["x","y"]}},"required":["l4"],"additionalProperties":false}},"required":["l3"],"additionalProperties":false},"minItems":1}},"required":["l2"],"additionalProperties":false}},"required":["l1"],"additionalProperties":false})",
       {R"({"l1":{"l2":[{"l3":{"l4":"x"}},{"l3":{"l4":"y"}}]}})"},
       {R"({"l1":{"l2":[]}})", R"({"l1":{"l2":[{"l3":{"l4":"z"}}]}})", R"({"l1":{}})"}},
      {"any_of", R"({"anyOf":[{"type":"string"},{"type":"integer"},{"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"],"additionalProperties":false}]})",
       {R"("s")", "12", R"({"x":true})"},
       {"1.5", "null", R"({"x":1})"}},
      {"one_of_disjoint", R"({"oneOf":[{"type":"string","pattern":"^a"},{"type":"integer"}]})",
       {R"("abc")", "-3"},
       {R"("bc")", "true"}},
      {"defs_ref",
       R"({"type":"object","properties":{"home":{"$ref":"#/$defs/addr"},"work":{"$ref":"#/definitions/addr2"}},"required":["home","work"],"additionalProperties":false,"$defs":{"addr":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city","zip"],"additionalProperties":false}},"definitions":{"addr2":{"$ref":"#/$defs/addr"}}})",
       {R"({"home":{"city":"A","zip":"12345"},"work":{"city":"B","zip":"00000"}})"},
       {R"({"home":{"city":"A","zip":"1234"},"work":{"city":"B","zip":"00000"}})"}},
      {"recursive_tree",
       R"({"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#"}}},"required":["v","kids"],"additionalProperties":false})",
       {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"},
       {R"({"v":1,"kids":[{"v":2}]})", R"({"v":1})"}},
      {"pattern_code", R"({"type":"string","pattern":"^[A-Z]{3}-\\d{3}$"})",
       {R"("ABC-123")"},
       {R"("AB-123")", R"("ABC-1234")", R"("abc-123")"}},
      {"pattern_search", R"({"type":"string","pattern":"(cat|dog)s?"})",
       {R"("a cat")", R"("dogs here")", R"("cat")"},
       {R"("cow")", R"("")"}},
      {"date", R"({"type":"string","format":"date"})",
       {R"("2024-02-29")", R"("1999-12-31")"},
       {R"("2024-13-01")", R"("2024-1-01")", R"("24-01-01")"}},
      {"date_time", R"({"type":"string","format":"date-time"})",
       {R"("2024-02-29T13:45:00Z")", R"("2024-02-29T13:45:00.123+02:00")"},
       {R"("2024-02-29 13:45:00Z")", R"("2024-02-29T25:00:00Z")", R"("2024-02-29T13:45:00")"}},
      {"time", R"({"type":"string","format":"time"})",
       {R"("08:30:00Z")"},
       {R"("8:30:00Z")"}},
      {"uuid", R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
      {"email", R"({"type":"string","format":"email"})",
       {R"("a.b+c@example.co.uk")"},
       {R"("a@b")", R"("ab.com")", R"("a b@c.com")"}},
      {"string_len_2_5", R"({"type":"string","minLength":2,"maxLength":5})",
       {R"("ab")", R"("abcde")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\t")"},
       {R"("a")", R"("abcdef")", R"("")"}},
      {"enum_heavy", manyWordsEnum(), {R"("w0_0")", R"("w919_1")", R"("w838_2")"}, {R"("w0_1")", R"("w")"}},
      {"json_object", "json_object",
       {"{}", R"({"a":[1,{"b":null}],"c":"d"})", R"({ "x": true })"},
       {"[]", "1", R"({"a"})", R"({"a":1,})"}},
      {"nullable_openapi", R"({"type":"integer","nullable":true})", {"null", "5"}, {"\"5\""}},
      {"additional_schema",
       R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"a":1,"b":2})"},
       {R"({"a":"x"})"}},
      {"all_of_single",
       R"({"allOf":[{"type":"object","properties":{"q":{"type":"null"}},"required":["q"],"additionalProperties":false}],"title":"T"})",
       {R"({"q":null})"},
       {"{}"}},
      {"any_value", R"({})", {"1", R"("s")", R"({"a":[true,null]})", "[[[]]]"}, {"", "tru", "{,}"}},
      // [TAG_NUMBER_RANGE] Number bounds (appended: the indices above are used by name).
      {"order_bounds",
       R"({"type":"object","properties":{"qty":{"type":"integer","minimum":1,"maximum":250},"price":{"type":"number","minimum":0},"discount":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},"delta":{"type":"integer","minimum":-40,"exclusiveMaximum":0}},"required":["qty","price","discount","delta"],"additionalProperties":false})",
       {R"({"qty":1,"price":0,"discount":0.5,"delta":-40})",
        R"({"qty":250,"price":19.99,"discount":0.05,"delta":-1})"},
       {R"({"qty":0,"price":0,"discount":0.5,"delta":-1})",
        R"({"qty":251,"price":0,"discount":0.5,"delta":-1})",
        R"({"qty":1,"price":-1,"discount":0.5,"delta":-1})",
        R"({"qty":1,"price":0,"discount":0,"delta":-1})",
        R"({"qty":1,"price":0,"discount":0.0,"delta":-1})",
        R"({"qty":1,"price":0,"discount":1,"delta":-1})",
        R"({"qty":1,"price":0,"discount":0.5,"delta":0})",
        R"({"qty":1,"price":0,"discount":0.5,"delta":-41})",
        R"({"qty":1.5,"price":0,"discount":0.5,"delta":-1})"}},
  };
  return k;
}

}  // namespace garden::grammar::testing
