// NFC and general categories against facts from the Unicode Character Database (the expected
// strings are what Python's unicodedata.normalize("NFC", ...) returns).
#include <gtest/gtest.h>

#include "services/ivy/tokenizer/unicode_tables.h"

namespace garden::ivy::unicode {
namespace {

std::string nfc(std::string_view s) {
  std::string out;
  appendNfc(s, &out);
  return out;
}

TEST(Nfc, ComposesDecomposesAndReorders) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                  // e + U+0301 -> U+00E9
  EXPECT_EQ(nfc("A\xCC\x8A"), "\xC3\x85");                  // A + ring -> U+00C5
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");               // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> U+AC01
  // q + dot below (220) + dot above (230): canonical order puts 0323 first; no composite.
  EXPECT_EQ(nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
  // U+1E9B U+0323 stays (U+1E9B is a composition of 017F + 0307).
  EXPECT_EQ(nfc("\xE1\xBA\x9B\xCC\xA3"), "\xE1\xBA\x9B\xCC\xA3");
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("\xEF\xAC\x81"), "\xEF\xAC\x81");  // U+FB01 is compatibility-only: unchanged
  EXPECT_TRUE(isNfcQuick("h\xC3\xA9llo \xE4\xB8\xAD"));
  EXPECT_FALSE(isNfcQuick("e\xCC\x81"));
}

TEST(Categories, SpotChecks) {
  EXPECT_EQ(category('a'), kLl);
  EXPECT_EQ(category('A'), kLu);
  EXPECT_EQ(category(0x01C5), kLt);   // Dz with caron, titlecase
  EXPECT_EQ(category(0x02B0), kLm);
  EXPECT_EQ(category(0x4E2D), kLo);
  EXPECT_EQ(category(0x0301), kMn);
  EXPECT_EQ(category(0x0663), kNd);
  EXPECT_EQ(category(0x216B), kNl);
  EXPECT_EQ(category(0x00BD), kNo);
  EXPECT_EQ(category(0x1F600), kSo);
  EXPECT_TRUE(isWhiteSpace(0x85));
  EXPECT_TRUE(isWhiteSpace(0x3000));
  EXPECT_FALSE(isWhiteSpace(0xFEFF));
  EXPECT_FALSE(isWhiteSpace(0x200B));
}

}  // namespace
}  // namespace garden::ivy::unicode
