#pragma once
// JSON Schema -> the TypeScript-like text that Harmony puts in tool definitions, and the whole
// "# Tools" section of a system or developer message (spec §1.6). Byte-compatible with
// openai_harmony's `json_schema_to_typescript` / `template_tools_section`, quirks included
// (object keys in input order, a nested object's description written twice, ...).
// Pure functions; any thread.

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"
#include "services/ivy/harmony/chat.h"

namespace garden::ivy::harmony {

// Renders one schema given as JSON text. `indent` is the current indentation (spec's TS(s, i)).
// InvalidArgument when `schema_json` is not valid JSON.
Result<std::string> jsonSchemaToTypeScript(std::string_view schema_json, std::string_view indent);

// "# Tools\n\n## ns\n\n..." for the namespaces in name order. Errors name the tool whose
// parameters are not valid JSON.
Result<std::string> renderToolsSection(const std::map<std::string, ToolNamespace>& tools);

// Compact JSON text of a parsed value exactly as serde_json's Display writes it (used for
// `// default: ...` comments): integers verbatim, floats in ryu's shortest form ("0.5", "1.0",
// "1e20"), strings escaped as serde_json does. Exposed for tests.
Result<std::string> serdeCompactJson(std::string_view json);

}  // namespace garden::ivy::harmony
