#pragma once
// A Harmony message header's text split into its fields, leniently, the way openai_harmony's
// parser reads it. The one implementation behind ivy's output parser (services/ivy/harmony,
// parseHeaderText / StreamParser) and tulip's constrained decoder, which must agree on which
// messages are calls to which function [TAG_STRICT_TOOLS]. The header text is the decoded header
// tokens with <|channel|> and <|constrain|> written as their literal texts, e.g.
//   "<|channel|>commentary to=functions.get_weather <|constrain|>json"   (role given: assistant)
//   "assistant to=functions.f<|channel|>commentary json"                 (role read from the text)
// Pure functions; any thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace garden {

struct HarmonyHeaderFields {
  // The role: the given one, else the header's first word when it names a role, else "tool"
  // (the first word is then the tool's author name), else "assistant" (see role_problem).
  std::string role = "assistant";
  std::optional<std::string> author_name;  // role "tool" read from the text: its first word
  std::optional<std::string> channel;
  std::optional<std::string> recipient;     // "functions.get_weather", "browser.search", ...
  std::optional<std::string> content_type;  // "<|constrain|>json", "json", ...
  std::optional<std::string> leftover;      // words no field took, space-joined
  // What a strict parse rejects: "<|channel|>" without a value; no role given and none in the
  // text (role_missing); a first word that is no role and no author (unknown_role: that word;
  // the rest of the header is then dropped).
  bool channel_without_value = false;
  bool role_missing = false;
  std::optional<std::string> unknown_role;
};

// `given_role`: the role written before the header began ("assistant" for a turn that starts
// after "<|start|>assistant"); empty: the header's first word is the role (or an author name).
// `recipient_and_type` false: recipient and content type are not read (their words stay leftover).
HarmonyHeaderFields parseHarmonyHeaderFields(std::string_view text, std::string_view given_role,
                                             bool recipient_and_type = true);

// Whether `word` is one of Harmony's role names (user, assistant, system, developer, tool).
bool isHarmonyRoleName(std::string_view word);

// The function a recipient calls, as ivy's chat output routes it: "functions.NAME" -> NAME; a
// bare recipient -> itself (ivy treats it as a call when it is a declared function's name).
std::string_view harmonyFunctionName(std::string_view recipient);

}  // namespace garden
