// garden_spm_shim: a C ABI around libsentencepiece, built as its own shared object and loaded by
// text_encoder.cc with dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Only text_encoder.cc uses it.
//
// Why [TAG_SPM_ISOLATION]: Debian's libsentencepiece.so.0 carries a private copy of
// protobuf-lite 3.14 and exports those symbols. Linked into a process that also uses
// libprotobuf.so.32 (3.21; ivy links it for gRPC) one copy interposes the other: the process
// either segfaults while registering generated descriptors or aborts in sentencepiece's protobuf
// version check. Loading sentencepiece behind this shim with RTLD_DEEPBIND makes it bind to its
// own copy, and RTLD_LOCAL keeps its symbols out of everyone else's lookups.
// Remove the shim once ivy's own tokenizers replace libsentencepiece.

#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void copyError(const std::string& msg, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  size_t n = msg.size() < err_len - 1 ? msg.size() : err_len - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

// Returns a handle, or nullptr with *code set to sentencepiece's status code (5 = NOT_FOUND) and
// `err` holding its message.
__attribute__((visibility("default"))) void* garden_spm_load(const char* path, int* code, char* err,
                                                             size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->Load(path);
  if (!st.ok()) {
    *code = static_cast<int>(st.code());
    copyError(st.ToString(), err, err_len);
    delete sp;
    return nullptr;
  }
  *code = 0;
  return sp;
}

__attribute__((visibility("default"))) void garden_spm_free(void* handle) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

__attribute__((visibility("default"))) int32_t garden_spm_vocab_size(void* handle) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize();
}

// Encodes `text` into plain piece ids (no BOS/EOS). On success returns 0 and sets *ids (malloc'd,
// release with garden_spm_free_ids) and *n. On failure returns the status code and fills `err`.
__attribute__((visibility("default"))) int garden_spm_encode(void* handle, const char* text,
                                                             size_t len, int32_t** ids, size_t* n,
                                                             char* err, size_t err_len) {
  std::vector<int> out;
  auto st = static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Encode(
      absl::string_view(text, len), &out);
  if (!st.ok()) {
    copyError(st.ToString(), err, err_len);
    return static_cast<int>(st.code());
  }
  *n = out.size();
  *ids = static_cast<int32_t*>(std::malloc(out.size() * sizeof(int32_t) + 1));
  for (size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
  return 0;
}

__attribute__((visibility("default"))) void garden_spm_free_ids(int32_t* ids) { std::free(ids); }

}  // extern "C"
