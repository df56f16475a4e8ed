#pragma once
// Where a Harmony message header sends its message: the channel and the recipient, read from the
// header's text exactly as ivy's lenient output parser reads them (services/ivy/harmony/parser.cc,
// parseHeaderLenient), so that tulip's constrained decoder and ivy agree on which messages are
// calls to which function [TAG_STRICT_TOOLS]. The header text is the decoded header tokens with
// <|channel|> and <|constrain|> written as their literal texts, e.g.
//   "<|channel|>commentary to=functions.get_weather <|constrain|>json"   (role given: assistant)
//   "assistant to=functions.f<|channel|>commentary json"                 (role read from the text)
// A pure function; any thread.

#include <optional>
#include <string>
#include <string_view>

namespace garden::grammar {

struct HarmonyHeaderRoute {
  std::string role = "assistant";  // ivy exposes only the assistant's messages
  std::optional<std::string> channel;
  std::optional<std::string> recipient;  // "functions.get_weather", "browser.search", ...
};

// `given_role`: the role written before the header began ("assistant" for a turn that starts
// after "<|start|>assistant"); empty: the header's first word is the role (or an author name).
HarmonyHeaderRoute parseHarmonyHeaderRoute(std::string_view text, std::string_view given_role);

// The function a recipient calls, as ivy's chat output routes it: "functions.NAME" -> NAME; a
// bare recipient -> itself (ivy treats it as a call when it is a declared function's name).
std::string_view harmonyFunctionName(std::string_view recipient);

}  // namespace garden::grammar
