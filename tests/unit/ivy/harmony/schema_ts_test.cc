// JSON Schema -> TypeScript rules not covered by the reference vectors, and serde_json-compatible
// default values.

#include "services/ivy/harmony/schema_ts.h"

#include <gtest/gtest.h>

namespace garden::ivy::harmony {
namespace {

std::string ts(const std::string& schema) {
  auto r = jsonSchemaToTypeScript(schema, "");
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? *r : "";
}

std::string serde(const std::string& json) {
  auto r = serdeCompactJson(json);
  EXPECT_TRUE(r.isOk());
  return r.isOk() ? *r : "";
}

TEST(HarmonySchemaTs, ScalarsArraysUnions) {
  EXPECT_EQ(ts(R"({"type":"integer"})"), "number");
  EXPECT_EQ(ts(R"({"type":"boolean"})"), "boolean");
  EXPECT_EQ(ts(R"({"type":"null"})"), "any");
  EXPECT_EQ(ts(R"({"type":["integer","null"]})"), "number | null");
  EXPECT_EQ(ts(R"({"type":[]})"), "any");
  EXPECT_EQ(ts(R"({"type":"array","items":{"type":["number","string"]}})"), "number | string[]");
  EXPECT_EQ(ts(R"({"type":"array"})"), "Array<any>");
  EXPECT_EQ(ts(R"({"type":"string","enum":["a",1,"b"]})"), "\"a\" | \"b\"");
  EXPECT_EQ(ts(R"({"type":"string","enum":[1]})"), "string");
  EXPECT_EQ(ts(R"({"enum":["a"]})"), "any");
  EXPECT_EQ(ts(R"({"anyOf":[{"type":"string"}]})"), "any");
  EXPECT_EQ(ts("true"), "any");
  EXPECT_EQ(ts(R"({"oneOf":[{"type":"string","description":"s","default":"x"},
                            {"type":"number","nullable":true,"default":1.5}]})"),
            "\n | string // s default: \"x\"\n | number | null // default: 1.5");
  EXPECT_FALSE(jsonSchemaToTypeScript("{", "").isOk());
}

TEST(HarmonySchemaTs, ObjectProperties) {
  EXPECT_EQ(ts(R"({"type":"object","properties":{"e":{"type":"string","enum":["x","y"],
                "default":"x"},"n":{"type":"number","default":null},"o":{"type":"object",
                "properties":{"d":{"type":"array","default":[1,2]}}}},"required":["e"]})"),
            "{\ne: \"x\" | \"y\", // default: x\nn?: number, // default: null\no?: {\n"
            "    d?: Array<any>, // default: [1,2]\n    },\n}");
  // A oneOf property whose description equals the first variant's is not repeated.
  EXPECT_EQ(ts(R"({"type":"object","properties":{"p":{"description":"same",
                "oneOf":[{"type":"string","description":"same"},{"type":"number"}]}}})"),
            "{\np?:\n | string\n | number\n,\n}");
}

TEST(HarmonySchemaTs, SerdeDefaults) {
  EXPECT_EQ(serde("10"), "10");
  EXPECT_EQ(serde("-1"), "-1");
  EXPECT_EQ(serde("0.5"), "0.5");
  EXPECT_EQ(serde("1.0"), "1.0");
  EXPECT_EQ(serde("-0.0"), "-0.0");
  EXPECT_EQ(serde("1e15"), "1000000000000000.0");
  EXPECT_EQ(serde("1e16"), "1e16");
  EXPECT_EQ(serde("1.5e-7"), "1.5e-7");
  EXPECT_EQ(serde("0.0001"), "0.0001");
  EXPECT_EQ(serde("123.456"), "123.456");
  EXPECT_EQ(serde("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(serde(R"( { "a" : [ true, null, "q\"\u0001\n" ] } )"),
            R"({"a":[true,null,"q\"\u0001\n"]})");
}

TEST(HarmonySchemaTs, ToolsSectionNamespacesSortedAndRawDescriptions) {
  std::map<std::string, ToolNamespace> tools;
  tools["zeta"] = ToolNamespace{"zeta", "Line one.\r\nLine two.\n", {}};
  tools["alpha"] = ToolNamespace{"alpha", "Alpha tools.", {{"go", "", std::nullopt}}};
  auto r = renderToolsSection(tools);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r,
            "# Tools\n\n## alpha\n\n// Alpha tools.\nnamespace alpha {\n\ntype go = () => any;\n\n"
            "} // namespace alpha\n\n## zeta\n\nLine one.\nLine two.");
}

}  // namespace
}  // namespace garden::ivy::harmony
