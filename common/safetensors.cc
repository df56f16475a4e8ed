#include "common/safetensors.h"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/json_writer.h"

namespace garden {

size_t dtypeSize(DType d) {
  switch (d) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 1;
  }
  return 0;
}

std::string_view dtypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

Result<DType> parseDType(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  if (s == "U8") return DType::kU8;
  if (s == "I8") return DType::kI8;
  return invalidArgument("unsupported safetensors dtype '" + std::string(s) + "'");
}

float bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32ToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, keep sign
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32ToF16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                                      // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < half of smallest subnormal
    // value / 2^-24 = mant24 · 2^(exp - 126); shift is in [14, 24] here.
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // a carry makes the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t exp = ((abs >> 23) - 127 + 15);
  uint32_t mant = abs & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

Status convertToF32(const void* src, DType src_dtype, size_t count, float* dst) {
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * 4);
      return okStatus();
    case DType::kBF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        dst[i] = bf16ToF32(v);
      }
      return okStatus();
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        dst[i] = f16ToF32(v);
      }
      return okStatus();
    }
    default:
      return invalidArgument("cannot convert " + std::string(dtypeName(src_dtype)) + " to float32");
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Result<std::vector<float>> TensorView::toF32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  RETURN_IF_ERROR(convertToF32(data, dtype, out.size(), out.data()).withContext(name));
  return out;
}

// ---------------------------------------------------------------------------------------------

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool mulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errnoStatus("open " + path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return errnoStatus("stat " + path, e);
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return invalidArgument(path + ": not a safetensors file (" + std::to_string(size) +
                           " bytes, need at least 8)");
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) return errnoStatus("mmap " + path, e);
  f->map_ = m;
  f->map_size_ = size;
  RETURN_IF_ERROR(f->parse({static_cast<const std::byte*>(m), size}).withContext(path));
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::fromBytes(
    std::span<const std::byte> bytes, std::string label) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(label);
  RETURN_IF_ERROR(f->parse(bytes).withContext(f->path_));
  return f;
}

Status SafetensorsFile::parse(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) return invalidArgument("file too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (n > kMaxHeaderBytes) {
    return invalidArgument("header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  }
  if (n > bytes.size() - 8) {
    return invalidArgument("header length " + std::to_string(n) +
                           " runs past the end of the file (" + std::to_string(bytes.size()) +
                           " bytes)");
  }
  const char* hdr = reinterpret_cast<const char*>(bytes.data() + 8);
  const std::byte* data = bytes.data() + 8 + n;
  const uint64_t data_size = bytes.size() - 8 - n;

  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(hdr, static_cast<size_t>(n), true).get(root); err) {
    return invalidArgument(std::string("header is not valid JSON: ") +
                           simdjson::error_message(err));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) return invalidArgument("header is not a JSON object");

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto field : obj) {
    std::string key(field.key);
    if (key == "__metadata__") {
      simdjson::dom::object meta;
      if (field.value.get_object().get(meta)) {
        return invalidArgument("__metadata__ is not an object");
      }
      for (auto m : meta) {
        std::string_view v;
        if (m.value.get_string().get(v)) {
          return invalidArgument("__metadata__." + std::string(m.key) + " is not a string");
        }
        metadata_[std::string(m.key)] = std::string(v);
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return invalidArgument("tensor '" + key + "': " + what);
    };
    simdjson::dom::object t;
    if (field.value.get_object().get(t)) return bad("entry is not an object");
    std::string_view dtype_s;
    if (t["dtype"].get_string().get(dtype_s)) return bad("missing or non-string 'dtype'");
    auto dt = parseDType(dtype_s);
    if (!dt.isOk()) return bad(dt.status().message());
    simdjson::dom::array shape_a;
    if (t["shape"].get_array().get(shape_a)) return bad("missing or non-array 'shape'");
    TensorView tv;
    tv.name = key;
    tv.dtype = *dt;
    uint64_t numel = 1;
    for (auto d : shape_a) {
      int64_t v;
      if (d.get_int64().get(v) || v < 0) return bad("shape entries must be non-negative integers");
      tv.shape.push_back(v);
      if (mulOverflow(numel, static_cast<uint64_t>(v), &numel)) return bad("shape overflows");
    }
    simdjson::dom::array off_a;
    if (t["data_offsets"].get_array().get(off_a)) return bad("missing or non-array 'data_offsets'");
    std::vector<uint64_t> offs;
    for (auto o : off_a) {
      uint64_t v;
      if (o.get_uint64().get(v)) return bad("data_offsets entries must be non-negative integers");
      offs.push_back(v);
    }
    if (offs.size() != 2) return bad("data_offsets must have two entries");
    if (offs[0] > offs[1]) return bad("data_offsets begin > end");
    if (offs[1] > data_size) {
      return bad("data_offsets end " + std::to_string(offs[1]) + " beyond the data section (" +
                 std::to_string(data_size) + " bytes)");
    }
    uint64_t want;
    if (mulOverflow(numel, dtypeSize(tv.dtype), &want)) return bad("byte size overflows");
    if (want != offs[1] - offs[0]) {
      return bad("shape and dtype need " + std::to_string(want) + " bytes but data_offsets span " +
                 std::to_string(offs[1] - offs[0]));
    }
    tv.data = data + offs[0];
    tv.bytes = static_cast<size_t>(want);
    if (tensors_.count(key) != 0) return bad("duplicate name");
    tensors_.emplace(key, std::move(tv));
    if (offs[1] > offs[0]) ranges.emplace_back(offs[0], offs[1]);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return invalidArgument("tensor data ranges overlap");
    }
  }
  return okStatus();
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------

namespace {

Result<std::string> readSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound("cannot read " + path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

}  // namespace

Result<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::openDir(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return notFound(dir + ": not a directory");
  auto ck = std::make_unique<SafetensorsCheckpoint>();

  std::vector<std::string> files;
  std::vector<fs::path> indexes;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 24 && name.ends_with(".safetensors.index.json")) indexes.push_back(e.path());
  }
  std::sort(indexes.begin(), indexes.end());
  std::map<std::string, std::string> weight_map;  // tensor → shard
  if (!indexes.empty()) {
    const std::string ipath = indexes.front().string();
    ASSIGN_OR_RETURN(std::string text, readSmallFile(ipath));
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (auto err = parser.parse(text).get(root); err) {
      return invalidArgument(ipath + ": not valid JSON: " + simdjson::error_message(err));
    }
    simdjson::dom::object wm;
    if (root["weight_map"].get_object().get(wm)) {
      return invalidArgument(ipath + ": missing or non-object 'weight_map'");
    }
    std::set<std::string> shard_set;
    for (auto f : wm) {
      std::string_view shard;
      if (f.value.get_string().get(shard)) {
        return invalidArgument(ipath + ": weight_map." + std::string(f.key) + " is not a string");
      }
      if (shard.find('/') != std::string_view::npos || shard.empty() || shard == "." ||
          shard == "..") {
        return invalidArgument(ipath + ": shard name '" + std::string(shard) +
                               "' must be a plain file name");
      }
      weight_map[std::string(f.key)] = std::string(shard);
      shard_set.insert(std::string(shard));
    }
    if (shard_set.empty()) return invalidArgument(ipath + ": empty weight_map");
    files.assign(shard_set.begin(), shard_set.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(".safetensors")) files.push_back(name);
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) return notFound(dir + ": no *.safetensors files");

  std::map<std::string, size_t> file_index;
  for (const auto& name : files) {
    ASSIGN_OR_RETURN(auto f, SafetensorsFile::open((fs::path(dir) / name).string()));
    file_index[name] = ck->files_.size();
    ck->files_.push_back(std::move(f));
  }
  for (const auto& f : ck->files_) {
    for (const auto& [name, tv] : f->tensors()) {
      if (!ck->index_.emplace(name, &tv).second) {
        return invalidArgument(dir + ": tensor '" + name + "' appears in more than one file");
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsFile& f = *ck->files_[file_index[shard]];
    if (f.find(tensor) == nullptr) {
      return invalidArgument(dir + ": index lists '" + tensor + "' in " + shard +
                             " but that file does not hold it");
    }
  }
  return ck;
}

const TensorView* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [n, _] : index_) out.push_back(n);
  return out;
}

// ---------------------------------------------------------------------------------------------


std::vector<std::byte> serializeSafetensors(const std::vector<TensorToWrite>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      JsonWriter::appendQuoted(h, k);
      h += ':';
      JsonWriter::appendQuoted(h, v);
    }
    h += '}';
    first = false;
  }
  uint64_t off = 0;
  for (const auto& t : tensors) {
    if (!first) h += ',';
    first = false;
    JsonWriter::appendQuoted(h, t.name);
    h += ":{\"dtype\":\"";
    h += dtypeName(t.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.data.size()) +
         "]}";
    off += t.data.size();
  }
  h += '}';
  while (h.size() % 8 != 0) h += ' ';
  std::vector<std::byte> out(8 + h.size() + off);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, h.data(), h.size());
  size_t pos = 8 + h.size();
  for (const auto& t : tensors) {
    if (!t.data.empty()) std::memcpy(out.data() + pos, t.data.data(), t.data.size());
    pos += t.data.size();
  }
  return out;
}

Status writeSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    if (n * dtypeSize(t.dtype) != t.data.size()) {
      return invalidArgument("writeSafetensors: tensor '" + t.name + "' has " +
                             std::to_string(t.data.size()) + " bytes, shape needs " +
                             std::to_string(n * dtypeSize(t.dtype)));
    }
  }
  std::vector<std::byte> bytes = serializeSafetensors(tensors, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return errnoStatus("open " + path + " for writing", errno);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) return errnoStatus("write " + path, errno);
  return okStatus();
}

}  // namespace garden
