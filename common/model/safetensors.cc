#include "common/model/safetensors.h"

#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

std::string ShapeText(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

absl::Status SafetensorsCheckpoint::AddFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path));
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (!in || header_len > (100u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a safetensors file (bad header length)"));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header"));
  auto j = nlohmann::json::parse(header, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  const uint64_t data_start = 8 + header_len;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    SafetensorsEntry e;
    e.file = path;
    // Field types are checked, not assumed: a malformed header is an error,
    // never an exception (found by the safetensors fuzzer).
    std::vector<uint64_t> offsets;
    try {
      if (!v.is_object()) throw std::invalid_argument("entry is not an object");
      e.dtype = v.value("dtype", "");
      e.shape = v.value("shape", std::vector<int64_t>{});
      offsets = v.value("data_offsets", std::vector<uint64_t>{});
    } catch (const std::exception& ex) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' has a malformed entry: ", ex.what()));
    }
    if (offsets.size() != 2 || offsets[1] < offsets[0]) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has bad data_offsets"));
    }
    e.begin = data_start + offsets[0];
    e.end = data_start + offsets[1];
    if (e.end > file_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", name, "' ends at byte ", e.end, " past the end of the file (", file_size, ")"));
    }
    entries_[name] = std::move(e);
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::OpenFile(const std::string& path) {
  SafetensorsCheckpoint c;
  c.description_ = path;
  if (auto s = c.AddFile(path); !s.ok()) return s;
  return c;
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::Open(const std::string& dir) {
  SafetensorsCheckpoint c;
  c.description_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  auto index = ReadWholeFile(index_path);
  if (index.ok()) {
    auto j = nlohmann::json::parse(*index, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing 'weight_map'"));
    }
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry '", name, "' is not a file name"));
      }
      shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) {
      if (auto s = c.AddFile(dir + "/" + shard); !s.ok()) return s;
    }
    return c;
  }
  const std::string single = dir + "/model.safetensors";
  if (auto s = c.AddFile(single); !s.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "no weights in ", dir, ": neither model.safetensors.index.json nor model.safetensors (",
        s.message(), ")"));
  }
  return c;
}

std::vector<std::string> SafetensorsCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

absl::Status SafetensorsCheckpoint::ReadF32(const std::string& name,
                                            const std::vector<int64_t>& expected_shape,
                                            float* dst) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing from ", description_));
  }
  const SafetensorsEntry& e = it->second;
  if (e.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", e.file, " has shape ", ShapeText(e.shape), ", expected ",
        ShapeText(expected_shape)));
  }
  int64_t numel = 1;
  for (int64_t d : e.shape) numel *= d;
  size_t elem = 0;
  if (e.dtype == "F32") {
    elem = 4;
  } else if (e.dtype == "F16" || e.dtype == "BF16") {
    elem = 2;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", e.file, " has dtype ", e.dtype, "; F32, F16 and BF16 are supported"));
  }
  if (e.end - e.begin != static_cast<uint64_t>(numel) * elem) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", e.file, ": ", e.end - e.begin, " bytes for ", numel, " ",
        e.dtype, " values"));
  }
  std::ifstream in(e.file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", e.file));
  in.seekg(static_cast<std::streamoff>(e.begin));
  if (elem == 4) {
    in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(numel * 4));
  } else {
    std::vector<uint16_t> raw(numel);
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(numel * 2));
    const bool bf16 = e.dtype == "BF16";
    ForRanges(numel, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = bf16 ? Bf16ToFloat(raw[i]) : HalfToFloat(raw[i]);
    });
  }
  if (!in) return absl::DataLossError(absl::StrCat("short read of tensor '", name, "' from ", e.file));
  return absl::OkStatus();
}

absl::Status WriteSafetensorsF32(
    const std::string& path,
    const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = t.second.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) {
    out.write(reinterpret_cast<const char*>(t.second.data()),
              static_cast<std::streamsize>(t.second.size() * 4));
  }
  return out ? absl::OkStatus() : absl::DataLossError(absl::StrCat("short write to ", path));
}

}  // namespace tandem
