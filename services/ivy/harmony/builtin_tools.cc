// The built-in tool namespaces of openai_harmony (`ToolNamespaceConfig::browser()` and
// `::python()`), text copied byte for byte from the reference vectors (spec §1.7).

#include "services/ivy/harmony/chat.h"

namespace garden::ivy::harmony {

ToolNamespace browserToolNamespace() {
  ToolNamespace ns;
  ns.name = "browser";
  ns.description =
      "Tool for browsing.\n"
      "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
      "Cite information from the tool using the following format:\n"
      "`\u3010{cursor}\u2020L{line_start}(-L{line_end})?\u3011`, for example: "
      "`\u30106\u2020L9-L11\u3011` or `\u30108\u2020L3\u3011`.\n"
      "Do not quote more than 10 words directly from the tool output.\n"
      "sources=web (default: web)";
  ns.tools.push_back(ToolDescription{
      "search", "Searches for information related to `query` and displays `topn` results.",
      R"({"type":"object","properties":{"query":{"type":"string"},)"
      R"("topn":{"type":"number","default":10},"source":{"type":"string"}},"required":["query"]})"});
  ns.tools.push_back(ToolDescription{
      "open",
      "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, "
      "showing `num_lines` lines.\n"
      "Valid link ids are displayed with the formatting: `\u3010{id}\u2020.*\u3011`.\n"
      "If `cursor` is not provided, the most recent page is implied.\n"
      "If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
      "If `loc` is not provided, the viewport will be positioned at the beginning of the document "
      "or centered on the most relevant passage, if available.\n"
      "Use this function without `id` to scroll to a new location of an opened page.",
      R"({"type":"object","properties":{"id":{"type":["number","string"],"default":-1},)"
      R"("cursor":{"type":"number","default":-1},"loc":{"type":"number","default":-1},)"
      R"("num_lines":{"type":"number","default":-1},"view_source":{"type":"boolean","default":false},)"
      R"("source":{"type":"string"}}})"});
  ns.tools.push_back(ToolDescription{
      "find",
      "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.",
      R"({"type":"object","properties":{"pattern":{"type":"string"},)"
      R"("cursor":{"type":"number","default":-1}},"required":["pattern"]})"});
  return ns;
}

ToolNamespace pythonToolNamespace() {
  ToolNamespace ns;
  ns.name = "python";
  ns.description =
      "Use this tool to execute Python code in your chain of thought. The code will not be shown "
      "to the user. This tool should be used for internal reasoning, but not for code that is "
      "intended to be visible to the user (e.g. when creating plots, tables, or files).\n\n"
      "When you send a message containing Python code to python, it will be executed in a "
      "stateful Jupyter notebook environment. python will respond with the output of the "
      "execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save "
      "and persist user files. Internet access for this session is UNKNOWN. Depends on the "
      "cluster.";
  return ns;
}

}  // namespace garden::ivy::harmony
