#include "common/serving/gguf_vocab.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<GgufVocab> ReadGgufVocab(const GgufFile& f) {
  GgufVocab v;
  const GgufValue* model = f.Find("tokenizer.ggml.model");
  if (model == nullptr) return v;
  ASSIGN_OR_RETURN(v.model, f.GetString("tokenizer.ggml.model"));
  if (f.Find("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(v.pre, f.GetString("tokenizer.ggml.pre"));
  }
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->elem_type != GgufValueType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": tokenizer.ggml.tokens is missing or not strings"));
  }
  v.tokens = tokens->strings;
  if (const GgufValue* m = f.Find("tokenizer.ggml.merges")) v.merges = m->strings;
  if (const GgufValue* s = f.Find("tokenizer.ggml.scores")) {
    v.scores.assign(s->floats.begin(), s->floats.end());
  }
  if (const GgufValue* t = f.Find("tokenizer.ggml.token_type")) {
    v.token_types.assign(t->ints.begin(), t->ints.end());
  }
  auto id = [&](const char* key, int32_t* dst) {
    if (const GgufValue* x = f.Find(key); x && x->is_integer()) *dst = static_cast<int32_t>(x->i);
  };
  id("tokenizer.ggml.bos_token_id", &v.bos_id);
  id("tokenizer.ggml.eos_token_id", &v.eos_id);
  id("tokenizer.ggml.unknown_token_id", &v.unk_id);
  // llama.cpp's defaults when the file does not say: SentencePiece models
  // add BOS and a space prefix, byte-level ones neither.
  v.add_bos = v.model == "llama";
  v.add_space_prefix = v.model == "llama";
  auto flag = [&](const char* key, bool* dst) {
    if (const GgufValue* x = f.Find(key); x && x->type == GgufValueType::kBool) *dst = x->i != 0;
  };
  flag("tokenizer.ggml.add_bos_token", &v.add_bos);
  flag("tokenizer.ggml.add_eos_token", &v.add_eos);
  flag("tokenizer.ggml.add_space_prefix", &v.add_space_prefix);
  return v;
}

}  // namespace tandem
