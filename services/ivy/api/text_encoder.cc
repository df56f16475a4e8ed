#include "services/ivy/api/text_encoder.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace garden::ivy {
namespace {

// libsentencepiece lives behind garden_spm_shim, loaded in isolation; see spm_shim.cc
// [TAG_SPM_ISOLATION].
struct SpmApi {
  void* (*load)(const char*, int*, char*, size_t) = nullptr;
  void (*free_handle)(void*) = nullptr;
  int32_t (*vocab_size)(void*) = nullptr;
  int (*encode)(void*, const char*, size_t, int32_t**, size_t*, char*, size_t) = nullptr;
  void (*free_ids)(int32_t*) = nullptr;
};

// GARDEN_ASAN: any sanitizer runtime (ASan or TSan), which refuses RTLD_DEEPBIND.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GARDEN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GARDEN_ASAN 1
#endif
#endif

// Where the shim may be, in order: $GARDEN_SPM_SHIM, next to the running executable, the build
// tree's copy (GARDEN_SPM_SHIM_PATH, set by CMake).
std::vector<std::string> shimCandidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("GARDEN_SPM_SHIM"); env != nullptr && *env != '\0') {
    c.emplace_back(env);
  }
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) c.push_back((exe.parent_path() / "libgarden_spm_shim.so").string());
#ifdef GARDEN_SPM_SHIM_PATH
  c.emplace_back(GARDEN_SPM_SHIM_PATH);
#endif
  return c;
}

Result<const SpmApi*> spmApi() {
  static std::once_flag once;
  static SpmApi api;
  static Status error;
  std::call_once(once, [] {
    int flags = RTLD_NOW | RTLD_LOCAL;
#ifndef GARDEN_ASAN
    flags |= RTLD_DEEPBIND;  // the sanitizer runtimes refuse RTLD_DEEPBIND
#endif
#ifdef GARDEN_ASAN
    // Without RTLD_DEEPBIND sentencepiece binds to an already loaded libprotobuf and crashes the
    // process; refuse cleanly instead (ASan builds of binaries that link gRPC get no tokenizer).
    if (void* pb = dlopen("libprotobuf.so.32", RTLD_NOW | RTLD_NOLOAD); pb != nullptr) {
      dlclose(pb);
      error = failedPrecondition(
          "sentencepiece cannot be loaded beside libprotobuf in a sanitizer build "
          "[TAG_SPM_ISOLATION]");
      return;
    }
#endif
    void* lib = nullptr;
    std::string tried;
    for (const std::string& path : shimCandidates()) {
      if (!std::filesystem::exists(path)) {
        tried += " " + path + " (missing)";
        continue;
      }
      lib = dlopen(path.c_str(), flags);
      if (lib != nullptr) break;
      tried += " " + path + " (" + dlerror() + ")";
    }
    if (lib == nullptr) {
      error = failedPrecondition("cannot load libgarden_spm_shim.so (set GARDEN_SPM_SHIM); tried:" +
                                 tried);
      return;
    }
    api.load = reinterpret_cast<decltype(api.load)>(dlsym(lib, "garden_spm_load"));
    api.free_handle = reinterpret_cast<decltype(api.free_handle)>(dlsym(lib, "garden_spm_free"));
    api.vocab_size =
        reinterpret_cast<decltype(api.vocab_size)>(dlsym(lib, "garden_spm_vocab_size"));
    api.encode = reinterpret_cast<decltype(api.encode)>(dlsym(lib, "garden_spm_encode"));
    api.free_ids = reinterpret_cast<decltype(api.free_ids)>(dlsym(lib, "garden_spm_free_ids"));
    if (!api.load || !api.free_handle || !api.vocab_size || !api.encode || !api.free_ids) {
      error = failedPrecondition("libgarden_spm_shim.so lacks an expected symbol");
    }
  });
  if (!error.isOk()) return error;
  return &api;
}

class SentencePieceEncoder final : public TextEncoder {
 public:
  SentencePieceEncoder(const SpmApi* api, void* handle) : api_(api), handle_(handle) {}
  ~SentencePieceEncoder() override { api_->free_handle(handle_); }

  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    int32_t* ids = nullptr;
    size_t n = 0;
    char err[256] = {0};
    int code = api_->encode(handle_, text.data(), text.size(), &ids, &n, err, sizeof err);
    if (code != 0) return invalidArgument(std::string("tokenizer: ") + err);
    std::vector<int32_t> out(ids, ids + n);
    api_->free_ids(ids);
    return out;
  }

  uint32_t vocabSize() const override { return static_cast<uint32_t>(api_->vocab_size(handle_)); }

 private:
  const SpmApi* api_;
  void* handle_;
};

}  // namespace

Result<std::unique_ptr<TextEncoder>> loadSentencePieceEncoder(const std::string& path) {
  ASSIGN_OR_RETURN(const SpmApi* api, spmApi());
  int code = 0;
  char err[512] = {0};
  void* handle = api->load(path.c_str(), &code, err, sizeof err);
  if (handle == nullptr) {
    std::string m = "tokenizer " + path + ": " + err;
    if (code == static_cast<int>(StatusCode::kNotFound)) return notFound(std::move(m));
    return invalidArgument(std::move(m));
  }
  return std::unique_ptr<TextEncoder>(std::make_unique<SentencePieceEncoder>(api, handle));
}

}  // namespace garden::ivy
