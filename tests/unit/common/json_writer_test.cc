// Tests for common/json_writer: structure, escaping (checked against simdjson as the reference
// parser), shortest round-trip numbers, non-finite handling and base64 (against coreutils).

#include "common/json_writer.h"

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace garden {
namespace {

// Parses `json` with simdjson (which validates UTF-8 and structure) and returns the string value
// of the single-element array ["..."].
std::string parseStringBack(const std::string& json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  auto err = parser.parse(json).get(doc);
  EXPECT_EQ(err, simdjson::SUCCESS) << "invalid JSON: " << json;
  if (err) return "<invalid>";
  std::string_view s;
  err = doc.at(0).get(s);
  EXPECT_EQ(err, simdjson::SUCCESS);
  return std::string(s);
}

std::string jsonQuoted(std::string_view s) {
  std::string out;
  JsonWriter::appendQuoted(out, s);
  return out;
}

TEST(JsonWriter, ObjectsArraysAndCommas) {
  JsonWriter w;
  w.beginObject()
      .field("a", 1)
      .field("b", "x")
      .key("c")
      .beginArray()
      .value(true)
      .value(false)
      .null()
      .beginObject()
      .endObject()
      .beginArray()
      .endArray()
      .value(-7)
      .endArray()
      .nullField("d")
      .key("e")
      .raw("{\"r\":[1,2]}")
      .field("f", std::string("s"))
      .endObject();
  EXPECT_EQ(w.depth(), 0);
  EXPECT_EQ(w.take(),
            R"({"a":1,"b":"x","c":[true,false,null,{},[],-7],"d":null,"e":{"r":[1,2]},"f":"s"})");
  EXPECT_EQ(w.view(), "");  // take() resets
  w.beginArray().value(1).endArray();
  EXPECT_EQ(w.take(), "[1]");
}

TEST(JsonWriter, AppendsToExternalString) {
  std::string out = "prefix:";
  JsonWriter w(&out);
  w.beginArray().value(1).value(2).endArray();
  EXPECT_EQ(out, "prefix:[1,2]");
  EXPECT_EQ(w.view(), "prefix:[1,2]");
}

TEST(JsonWriter, IntegersAtTheLimits) {
  JsonWriter w;
  w.beginArray()
      .value(std::numeric_limits<int64_t>::min())
      .value(std::numeric_limits<int64_t>::max())
      .value(std::numeric_limits<uint64_t>::max())
      .value(int8_t{-128})
      .value(uint16_t{65535})
      .value(0u)
      .endArray();
  EXPECT_EQ(w.take(),
            "[-9223372036854775808,9223372036854775807,18446744073709551615,-128,65535,0]");
}

TEST(JsonWriter, EscapesQuotesBackslashAndEveryControlCharacter) {
  EXPECT_EQ(jsonQuoted("a\"b\\c/d"), R"("a\"b\\c/d")");
  EXPECT_EQ(jsonQuoted("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  const char* expected[32] = {
      "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
      "\\b",     "\\t",     "\\n",     "\\u000b", "\\f",     "\\r",     "\\u000e", "\\u000f",
      "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
      "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f"};
  for (int c = 0; c < 32; ++c) {
    std::string in(1, static_cast<char>(c));
    EXPECT_EQ(jsonQuoted(in), "\"" + std::string(expected[c]) + "\"") << "char " << c;
    EXPECT_EQ(parseStringBack("[" + jsonQuoted(in) + "]"), in) << "char " << c;
  }
  // DEL and the JS line separators are valid JSON unescaped.
  EXPECT_EQ(jsonQuoted("\x7f"), "\"\x7f\"");
  EXPECT_EQ(jsonQuoted("\xE2\x80\xA8\xE2\x80\xA9"), "\"\xE2\x80\xA8\xE2\x80\xA9\"");
  // Embedded NUL in the middle of a view.
  EXPECT_EQ(jsonQuoted(std::string_view("a\0b", 3)), R"("a\u0000b")");
}

TEST(JsonWriter, ValidUtf8PassesThrough) {
  const std::string s =
      "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 \xEF\xBF\xBF \xF4\x8F\xBF\xBF";
  EXPECT_EQ(jsonQuoted(s), "\"" + s + "\"");
  EXPECT_EQ(parseStringBack("[" + jsonQuoted(s) + "]"), s);
}

TEST(JsonWriter, InvalidUtf8BecomesReplacementCharacterPerMaximalSubpart) {
  const std::string r = "\xEF\xBF\xBD";
  struct Case {
    std::string in, out;
  } cases[] = {
      {"\x80", r},                          // lone continuation
      {"\xFF", r},                          // never valid
      {"\xC0\xAF", r + r},                  // overlong lead C0 + stray continuation
      {"\xC1\xBF", r + r},                  // overlong
      {"\xE0\x80\xAF", r + r + r},          // overlong 3-byte
      {"\xED\xA0\x80", r + r + r},          // UTF-16 surrogate D800
      {"\xF4\x90\x80\x80", r + r + r + r},  // > U+10FFFF
      {"\xF5\x80", r + r},                  // F5 never valid
      {"\xE2\x82", r},                      // truncated at end: one maximal subpart
      {"\xE2\x82"
       "A",
       r + "A"},  // truncated before ASCII
      {"\xF0\x9F\x98"
       "x",
       r + "x"},           // truncated 4-byte
      {"a\xC3", "a" + r},  // truncated 2-byte at end
      {"\xC3\xA9\x80\xC3\xA9", "\xC3\xA9" + r + "\xC3\xA9"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(jsonQuoted(c.in), "\"" + c.out + "\"") << "input bytes size " << c.in.size();
  }
}

TEST(JsonWriter, RandomValidUnicodeRoundTripsThroughSimdjson) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      uint32_t cp;
      switch (rng() % 4) {
        case 0:
          cp = rng() % 0x80;
          break;
        case 1:
          cp = 0x80 + rng() % (0x800 - 0x80);
          break;
        case 2:
          do cp = 0x800 + rng() % (0x10000 - 0x800);
          while (cp >= 0xD800 && cp <= 0xDFFF);
          break;
        default:
          cp = 0x10000 + rng() % (0x110000 - 0x10000);
      }
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    ASSERT_EQ(parseStringBack("[" + jsonQuoted(s) + "]"), s);
  }
}

TEST(JsonWriter, RandomBytesAlwaysGiveValidJson) {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 5000; ++iter) {
    std::string s(rng() % 16, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    std::string json = "[" + jsonQuoted(s) + "]";
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << "iteration " << iter;
  }
}

TEST(JsonWriter, DoublesAreShortestAndRoundTrip) {
  auto fmt = [](double d) {
    std::string s;
    JsonWriter::appendDouble(s, d);
    return s;
  };
  EXPECT_EQ(fmt(0.1), "0.1");
  EXPECT_EQ(fmt(1.0), "1");
  EXPECT_EQ(fmt(-0.0), "-0");
  EXPECT_EQ(fmt(1e21), "1e+21");
  EXPECT_EQ(fmt(123456.789), "123456.789");
  EXPECT_EQ(fmt(5e-324), "5e-324");
  EXPECT_EQ(fmt(std::numeric_limits<double>::max()), "1.7976931348623157e+308");
  std::mt19937_64 rng(42);
  simdjson::dom::parser parser;
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (!std::isfinite(d)) continue;
    std::string s = fmt(d);
    ASSERT_EQ(std::strtod(s.c_str(), nullptr), d) << s;
    // And a JSON parser reads the same value.
    simdjson::dom::element doc;
    std::string json = "[" + s + "]";
    ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << s;
    double back = 0;
    ASSERT_EQ(doc.at(0).get(back), simdjson::SUCCESS) << s;
    ASSERT_EQ(back, d) << s;
  }
}

TEST(JsonWriter, FloatsUseFloatShortestForm) {
  auto fmt = [](float f) {
    std::string s;
    JsonWriter::appendFloat(s, f);
    return s;
  };
  EXPECT_EQ(fmt(0.1f), "0.1");
  EXPECT_EQ(fmt(1.0f / 3.0f), "0.33333334");
  EXPECT_EQ(fmt(std::numeric_limits<float>::denorm_min()), "1e-45");
  std::mt19937 rng(9);
  for (int i = 0; i < 20000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (!std::isfinite(f)) continue;
    std::string s = fmt(f);
    ASSERT_EQ(std::strtof(s.c_str(), nullptr), f) << s;
  }
  JsonWriter w;
  w.value(0.1f);
  EXPECT_EQ(w.take(), "0.1");
}

TEST(JsonWriter, NonFiniteNumbersAreNull) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  JsonWriter w;
  w.beginArray().value(nan).value(inf).value(-inf).value(static_cast<float>(nan)).endArray();
  EXPECT_EQ(w.take(), "[null,null,null,null]");
  const float fv[] = {1.5f, std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::infinity(), 2.0f};
  w.beginObject().key("e").floatArray(fv).key("d").doubleArray(std::vector<double>{inf, 0.5});
  w.endObject();
  std::string json = w.take();
  EXPECT_EQ(json, R"({"e":[1.5,null,null,2],"d":[null,0.5]})");
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  EXPECT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS);
}

TEST(JsonWriter, NumberArrays) {
  JsonWriter w;
  w.beginArray()
      .floatArray(std::vector<float>{})
      .intArray(std::vector<int32_t>{1, -2, 2147483647})
      .floatArray(std::vector<float>{0.25f})
      .endArray();
  EXPECT_EQ(w.take(), "[[],[1,-2,2147483647],[0.25]]");
}

// ---- base64 ----

TEST(Base64, Rfc4648Vectors) {
  const std::pair<std::string, std::string> v[] = {{"", ""},
                                                   {"f", "Zg=="},
                                                   {"fo", "Zm8="},
                                                   {"foo", "Zm9v"},
                                                   {"foob", "Zm9vYg=="},
                                                   {"fooba", "Zm9vYmE="},
                                                   {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, enc] : v) {
    EXPECT_EQ(base64Encode(plain), enc);
    auto dec = base64Decode(enc);
    ASSERT_TRUE(dec.isOk()) << dec.status().toString();
    EXPECT_EQ(*dec, plain);
  }
}

// Compares with the coreutils `base64` binary on random inputs of every length 0..200.
TEST(Base64, MatchesCoreutils) {
  std::mt19937 rng(5);
  char path[] = "/tmp/garden_b64_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  for (size_t len = 0; len <= 200; len += (len < 20 ? 1 : 13)) {
    std::string bytes(len, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    FILE* f = std::fopen(path, "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    std::string cmd = std::string("base64 -w0 ") + path;
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string ref;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) ref.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << "coreutils base64 failed";
    EXPECT_EQ(base64Encode(bytes), ref) << "length " << len;
    auto dec = base64Decode(ref);
    ASSERT_TRUE(dec.isOk());
    EXPECT_EQ(*dec, bytes);
  }
  std::remove(path);
}

TEST(Base64, AppendsFloat32LittleEndian) {
  const float v[] = {1.0f, -2.0f};  // 0x3F800000, 0xC0000000 little-endian
  std::string out = "x";
  appendBase64(out, v, sizeof(v));
  EXPECT_EQ(out, "x" + base64Encode(std::string("\x00\x00\x80\x3F\x00\x00\x00\xC0", 8)));
  EXPECT_EQ(out, "xAACAPwAAAMA=");
}

TEST(Base64, DecodeRejectsBadInput) {
  auto bad = [](std::string_view s) {
    auto r = base64Decode(s);
    EXPECT_FALSE(r.isOk()) << s;
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
    return r.isOk() ? std::string() : r.status().message();
  };
  EXPECT_NE(bad("Zg=").find("multiple of 4"), std::string::npos);
  EXPECT_NE(bad("Zm9v!A==").find("offset 4"), std::string::npos);
  bad("Zg==Zg==");  // padding in the middle
  bad("Z===");
  bad("=g==");
  bad("Zm 9");
  bad("Zh==");  // non-zero padding bits
  bad("Zm9=");  // non-zero padding bits
  EXPECT_TRUE(base64Decode("Zm8=").isOk());
}

}  // namespace
}  // namespace garden
