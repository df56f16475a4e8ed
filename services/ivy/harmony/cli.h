#pragma once
// `ivy harmony-render`: reads an OpenAI chat-completions request (JSON) on stdin, renders the
// Harmony completion prompt and prints {"text": ..., "ids": [...]} as one JSON line on stdout.
//   --tokenizer=PATH   o200k_harmony tokenizer.json; without it only "text" is printed
//   --date=YYYY-MM-DD  "Current date:" line of the system message (default: none)
//   --keep-analysis    do not drop analysis of earlier turns
//   --format=text      print the text, then the ids on one line, instead of JSON
// Exit status: 0 on success, 2 on bad input (message on stderr naming the field), 1 otherwise.
// Called from ivy's main on the main thread.

namespace garden::ivy::harmony {

int runHarmonyRenderCli(int argc, char** argv);

}  // namespace garden::ivy::harmony
