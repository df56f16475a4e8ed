#pragma once
// The conversations behind the reference render vectors (openai/harmony src/tests.rs and
// tests/test_harmony.py, as listed in shared/spec/harmony.md §1.14), shared by the string-level
// and the id-level conformance tests. Header-only, test code.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "services/ivy/harmony/chat.h"

namespace garden::ivy::harmony::conformance {

// A vector file's text with trailing whitespace trimmed (how the reference tests read them).
inline std::string readVector(const std::string& name) {
  std::ifstream in(std::string(GARDEN_HARMONY_VECTORS_DIR) + "/" + name, std::ios::binary);
  if (!in.good()) return "<missing vector " + name + ">";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) {
    s.pop_back();
  }
  return s;
}

struct RenderVector {
  std::string file;
  std::vector<Message> messages;
  bool for_completion = true;  // append <|start|>assistant
  bool drop_analysis = false;  // the reference passes no config (no dropping) unless stated
  // The reference compares token ids (not only the decoded text) for this vector.
  bool reference_compares_ids = false;
};

inline Message systemMessage(SystemContent sys) {
  Message m;
  m.author.role = Role::kSystem;
  m.content.push_back(Content::fromSystem(std::move(sys)));
  return m;
}

inline Message developerMessage(DeveloperContent dev) {
  Message m;
  m.author.role = Role::kDeveloper;
  m.content.push_back(Content::fromDeveloper(std::move(dev)));
  return m;
}

inline std::vector<RenderVector> renderVectors() {
  std::vector<RenderVector> v;
  {
    SystemContent sys;
    v.push_back({"test_simple_convo.txt",
                 {systemMessage(sys), Message::text(Role::kUser, "What is 2 + 2?")},
                 true,
                 false,
                 true});
  }
  const struct {
    ReasoningEffort effort;
    const char* file;
    bool instructions;
  } efforts[] = {
      {ReasoningEffort::kLow, "test_simple_convo_low_effort.txt", true},
      {ReasoningEffort::kMedium, "test_simple_convo_medium_effort.txt", true},
      {ReasoningEffort::kHigh, "test_simple_convo_high_effort.txt", true},
      {ReasoningEffort::kLow, "test_simple_convo_low_effort_no_instruction.txt", false},
      {ReasoningEffort::kMedium, "test_simple_convo_medium_effort_no_instruction.txt", false},
      {ReasoningEffort::kHigh, "test_simple_convo_high_effort_no_instruction.txt", false},
  };
  for (const auto& c : efforts) {
    SystemContent sys;
    sys.reasoning_effort = c.effort;
    std::vector<Message> convo = {systemMessage(sys)};
    if (c.instructions) {
      DeveloperContent dev;
      dev.instructions = "Answer the user's questions like a robot.";
      convo.push_back(developerMessage(dev));
    }
    convo.push_back(
        Message::text(Role::kUser, "What is the capital of the largest country in the world?"));
    v.push_back({c.file, convo, true, false, true});
  }
  {
    SystemContent a;
    a.channel_config = ChannelConfig{{"analysis", "final"}, true};
    v.push_back({"test_reasoning_system_message.txt",
                 {systemMessage(a), Message::text(Role::kUser, "What is 2 + 2?")},
                 true,
                 false,
                 true});
    SystemContent b = a;
    b.reasoning_effort = ReasoningEffort::kHigh;
    v.push_back({"test_reasoning_system_message_no_instruction.txt",
                 {systemMessage(b),
                  Message::text(Role::kUser, "What is the best place to eat candy in the world?")},
                 true,
                 false,
                 true});
    SystemContent c = a;
    c.conversation_start_date = "2021-01-01";
    c.knowledge_cutoff = "2021-01";
    v.push_back({"test_reasoning_system_message_with_dates.txt",
                 {systemMessage(c), Message::text(Role::kUser, "What is 42 * pi?")},
                 true,
                 false,
                 true});
  }
  {
    SystemContent sys;
    sys.reasoning_effort = ReasoningEffort::kHigh;
    sys.conversation_start_date = "2025-06-28";
    DeveloperContent dev;
    dev.instructions = "Always respond in riddles";
    ToolNamespace fns{"functions", std::nullopt, {}};
    fns.tools.push_back({"get_location", "Gets the location of the user.", std::nullopt});
    fns.tools.push_back({"get_current_weather",
                         "Gets the current weather in the provided location.",
                         R"({"type":"object","properties":{"location":{"type":"string",
         "description":"The city and state, e.g. San Francisco, CA"},
         "format":{"type":"string","enum":["celsius","fahrenheit"],
         "default":"celsius"}},"required":["location"]})"});
    fns.tools.push_back(
        {"get_multiple_weathers", "Gets the current weather in the provided list of locations.",
         R"({"type":"object","properties":{"locations":{"type":"array","items":{"type":"string"},
         "description":"List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]"},
         "format":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"}},
         "required":["locations"]})"});
    fns.tools.push_back({"kitchensink", "A function with various complex schemas.",
                         R"({"description":"params object","type":"object","properties":{
         "string":{"type":"string","title":"STRING","description":"A string",
                   "examples":["hello","world"]},
         "string_nullable":{"type":"string","nullable":true,"description":"A nullable string",
                            "default":"the default"},
         "string_enum":{"type":"string","enum":["a","b","c"]},
         "oneof_string_or_number":{"oneOf":[{"type":"string","default":"default_string_in_oneof"},
                                   {"type":"number","description":"numbers can happen too"}],
                                   "description":"a oneof","default":20}}})"});
    dev.tools["functions"] = fns;
    v.push_back({"test_render_functions_with_parameters.txt",
                 {systemMessage(sys), developerMessage(dev),
                  Message::text(Role::kUser, "What is the weather like in SF?")}});
  }
  {
    SystemContent sys;
    sys.conversation_start_date = "2025-06-28";
    v.push_back({"test_no_tools.txt", {systemMessage(sys)}});
    SystemContent browser = sys;
    browser.tools["browser"] = browserToolNamespace();
    v.push_back({"test_browser_tool_only.txt", {systemMessage(browser)}});
    SystemContent both = browser;
    both.tools["python"] = pythonToolNamespace();
    v.push_back({"test_browser_and_python_tool.txt", {systemMessage(both)}});
    DeveloperContent dev;
    ToolNamespace fns{"functions", std::nullopt, {}};
    fns.tools.push_back({"lookup_weather",
                         "Use this tool to lookup the weather in a given location. Call it with "
                         "the parameter 'location', can be any textual description of a location.",
                         R"({"type":"object","properties":{"location":{"type":"string"}},
                            "required":["location"]})"});
    dev.tools["functions"] = fns;
    v.push_back(
        {"test_browser_and_function_tool.txt", {systemMessage(browser), developerMessage(dev)}});
  }
  {
    std::vector<Message> convo = {
        Message::text(Role::kUser, "What is 2 + 2?"),
        Message::text(Role::kAssistant,
                      "User asks: \u201cWhat is 2 + 2?\u201d Simple arithmetic. Provide answer.")
            .withChannel("analysis"),
        Message::text(Role::kAssistant, "2 + 2 equals 4.").withChannel("final"),
        Message::text(Role::kUser, "What about 9 / 2?"),
    };
    v.push_back({"test_dropping_cot_by_default.txt", convo, true, true});
    convo[1] = Message::text(Role::kAssistant,
                             "User asks a simple question: \"What is 2 + 2?\" The answer: 4.")
                   .withChannel("analysis");
    v.push_back({"test_preserve_cot.txt", convo, true, false});

    Message tool_result =
        Message::text(Role::kTool, "{\"temperature\": 20, \"description\": \"sunny\"}");
    tool_result.author.name = "functions.lookup_weather";
    v.push_back({"test_does_not_drop_if_ongoing_analysis.txt",
                 {Message::text(Role::kUser, "What is the weather in SF?"),
                  Message::text(Role::kAssistant,
                                "User asks: \u201cWhat is the weather in SF?\u201d We need to use "
                                "lookup_weather tool.")
                      .withChannel("analysis"),
                  Message::text(Role::kAssistant, "{\"location\": \"San Francisco\"}")
                      .withChannel("commentary")
                      .withRecipient("functions.lookup_weather")
                      .withContentType("<|constrain|>json"),
                  tool_result},
                 true,
                 true});
    v.push_back({"test_keep_analysis_between_finals.txt",
                 {Message::text(Role::kUser, "What is 2 + 2?"),
                  Message::text(Role::kAssistant, "4").withChannel("final"),
                  Message::text(Role::kUser, "What is 3 + 5?"),
                  Message::text(Role::kAssistant, "thinking 3+5").withChannel("analysis"),
                  Message::text(Role::kAssistant, "8").withChannel("final")},
                 false,
                 true});
  }
  return v;
}

}  // namespace garden::ivy::harmony::conformance
