// A model directory's config.json (and generation_config.json) as --model=DIR
// meets them: the input is parsed as config.json, then applied as a
// generation_config.json to the result when that parses. Any input must end
// in a Status: a field of another JSON type included.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = tandem::ParseLlamaConfig(text, "config.json");
  if (config.ok()) {
    (void)config->Fingerprint();
    for (int layer = 0; layer < config->num_hidden_layers && layer < 64; ++layer) {
      (void)config->IsSparseLayer(layer);
    }
    (void)tandem::ApplyGenerationConfig(text, "generation_config.json", &*config);
  }
  return 0;
}
