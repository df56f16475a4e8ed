#pragma once
// `ivy tokenize --tokenizer PATH [--decode]`: a command-line front end to the tokenizers.
// Encode mode (default): every stdin line is a JSON string; writes one JSON array of ids per
// line (caller text: special tokens are never produced). --decode: every line is a JSON array
// of ids; writes one JSON string per line. A bad line gets {"error": "..."} on its output line
// and exit status 1 at the end; a bad flag or tokenizer file exits 2 before reading stdin.
// Single-threaded; owns nothing beyond the call.

namespace garden::ivy {

// argv[0] is the subcommand name ("tokenize"); flags follow.
int runTokenizeCli(int argc, char** argv);

}  // namespace garden::ivy
