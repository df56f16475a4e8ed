#pragma once
// Small helpers for HTTP header values shared by the router (Content-Type, Content-Encoding) and
// the framing check (Transfer-Encoding). Header-only, pure, any thread.

#include <string_view>
#include <vector>

namespace garden::ivy {

// `s` without leading and trailing blanks (SP, HTAB: RFC 9110's OWS).
inline std::string_view trimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// ASCII case-insensitive equality (tokens, media types, codings).
inline bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Appends the elements of a comma-separated header list to `out`, trimmed; empty elements are
// skipped (RFC 9110 section 5.6.1).
inline void appendListElements(std::string_view value, std::vector<std::string_view>* out) {
  while (true) {
    const size_t comma = value.find(',');
    std::string_view e = trimBlanks(value.substr(0, comma));
    if (!e.empty()) out->push_back(e);
    if (comma == std::string_view::npos) return;
    value.remove_prefix(comma + 1);
  }
}

}  // namespace garden::ivy
