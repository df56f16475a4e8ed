#include "common/grammar/harmony_header.h"

#include <vector>

namespace garden::grammar {
namespace {

constexpr std::string_view kChannelText = "<|channel|>";
constexpr std::string_view kConstrainText = "<|constrain|>";

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isSpace(s.back())) s.remove_suffix(1);
  return s;
}

bool isRoleName(std::string_view w) {
  return w == "user" || w == "assistant" || w == "system" || w == "developer" || w == "tool";
}

}  // namespace

// Mirrors parseHeaderLenient step by step (its recipient / channel results only); a change to
// one must be made to the other [TAG_STRICT_TOOLS]. tests/unit/ivy/harmony checks they agree.
HarmonyHeaderRoute parseHarmonyHeaderRoute(std::string_view text, std::string_view given_role) {
  HarmonyHeaderRoute r;
  std::string s(text);
  if (size_t idx = s.find(kChannelText); idx != std::string::npos) {
    const size_t start = idx + kChannelText.size();
    size_t end = start;
    while (end < s.size() && !isSpace(s[end]) && s[end] != '<') ++end;
    if (end > start) r.channel = s.substr(start, end - start);
    s = s.substr(0, idx) + s.substr(end);
  }
  s = std::string(trim(s));
  if (s.find(kConstrainText) != std::string::npos) {
    std::string spaced;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, kConstrainText.size(), kConstrainText) == 0) {
        spaced += ' ';
        spaced += kConstrainText;
        i += kConstrainText.size();
      } else {
        spaced += s[i++];
      }
    }
    s = std::string(trim(spaced));
  }
  std::vector<std::string_view> parts;
  for (size_t i = 0; i < s.size();) {
    while (i < s.size() && isSpace(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !isSpace(s[j])) ++j;
    if (j > i) parts.push_back(std::string_view(s).substr(i, j - i));
    i = j;
  }
  std::string& role = r.role;
  if (!given_role.empty()) role = std::string(given_role);
  if (given_role.empty() && !parts.empty()) {
    if (isRoleName(parts[0])) {
      role = std::string(parts[0]);
    } else if (parts.size() > 1 || parts[0].starts_with("to=")) {
      role = "tool";  // the first word is the tool's (author's) name
      parts.erase(parts.begin());
    } else {
      parts.clear();  // an unknown role: the parser keeps nothing of the header
    }
  }
  if (!parts.empty() && parts[0] == role) parts.erase(parts.begin());
  if (parts.empty()) return r;
  const size_t num_parts = parts.size();
  const std::string_view last = parts.back();
  parts.pop_back();
  if (last.starts_with("to=")) {
    r.recipient = std::string(last.substr(3));
  } else if (num_parts == 1 && !last.starts_with(kConstrainText)) {
    r.recipient = std::string(last);
  } else if (!parts.empty()) {  // `last` is the content type; the recipient precedes it
    const std::string_view rec = parts.back();
    r.recipient = std::string(rec.starts_with("to=") ? rec.substr(3) : rec);
  }
  return r;
}

std::string_view harmonyFunctionName(std::string_view recipient) {
  constexpr std::string_view kPrefix = "functions.";
  if (recipient.starts_with(kPrefix) && recipient.size() > kPrefix.size()) {
    return recipient.substr(kPrefix.size());
  }
  return recipient;
}

}  // namespace garden::grammar
