#include "common/harmony_header.h"

namespace garden {
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

std::vector<std::string> splitWords(std::string_view s) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.size();) {
    while (i < s.size() && isSpace(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !isSpace(s[j])) ++j;
    if (j > i) parts.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

}  // namespace

bool isHarmonyRoleName(std::string_view w) {
  return w == "user" || w == "assistant" || w == "system" || w == "developer" || w == "tool";
}

HarmonyHeaderFields parseHarmonyHeaderFields(std::string_view text, std::string_view given_role,
                                             bool recipient_and_type) {
  HarmonyHeaderFields h;
  std::string s(text);
  // The channel: the word after <|channel|> (up to a space or the next marker), cut out.
  if (size_t idx = s.find(kChannelText); idx != std::string::npos) {
    const size_t start = idx + kChannelText.size();
    size_t end = start;
    while (end < s.size() && !isSpace(s[end]) && s[end] != '<') ++end;
    if (end == start) {
      h.channel_without_value = true;
    } else {
      h.channel = s.substr(start, end - start);
    }
    s = s.substr(0, idx) + s.substr(end);
  }
  s = std::string(trim(s));
  // <|constrain|> starts a word of its own ("to=functions.f<|constrain|>json").
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
  std::vector<std::string> parts = splitWords(s);
  std::optional<std::string> first_word;
  if (!given_role.empty()) {
    h.role = std::string(given_role);
  } else if (parts.empty()) {
    h.role_missing = true;
  } else {
    first_word = parts[0];
    if (isHarmonyRoleName(parts[0])) {
      h.role = parts[0];
    } else if (parts.size() > 1 || parts[0].starts_with("to=")) {
      h.role = "tool";  // the first word is the tool's (author's) name
      parts.erase(parts.begin());
    } else {
      h.unknown_role = parts[0];
      first_word.reset();
      parts.clear();  // an unknown role: nothing of the header is kept
    }
  }
  if (!parts.empty() && parts[0] == h.role) parts.erase(parts.begin());
  if (recipient_and_type && !parts.empty()) {
    const size_t num_parts = parts.size();
    std::string last = std::move(parts.back());
    parts.pop_back();
    if (last.starts_with("to=")) {
      h.recipient = last.substr(3);
    } else if (num_parts == 1 && !last.starts_with(kConstrainText)) {
      h.recipient = std::move(last);
    } else {
      h.content_type = std::move(last);
      if (!parts.empty()) {  // the recipient precedes the content type
        std::string rec = std::move(parts.back());
        parts.pop_back();
        h.recipient = rec.starts_with("to=") ? rec.substr(3) : std::move(rec);
      }
    }
  }
  if (!parts.empty()) {
    std::string joined;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) joined += ' ';
      joined += parts[i];
    }
    h.leftover = std::move(joined);
  }
  if (h.role == "tool") h.author_name = std::move(first_word);
  return h;
}

std::string_view harmonyFunctionName(std::string_view recipient) {
  constexpr std::string_view kPrefix = "functions.";
  if (recipient.starts_with(kPrefix) && recipient.size() > kPrefix.size()) {
    return recipient.substr(kPrefix.size());
  }
  return recipient;
}

}  // namespace garden
