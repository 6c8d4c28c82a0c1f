// Loading tokenizer.json / tokenizer_config.json and the encode / decode entry
// points of edgellm::Tokenizer.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace edgellm {

namespace {

using tok::json;

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> token_setting(const json& config, const char* key,
                                         const std::string& where) {
  const json* v = tok::find_field(config, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  return tok::string_field(*v, "content", tok::at_key(where, key));
}

// transformers' PreTrainedTokenizerBase.clean_up_tokenization.
std::string clean_up_tokenization(std::string s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t prev = 0;
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, prev)) {
      out.append(s, prev, p - prev);
      out += to;
      prev = p + from.size();
    }
    out.append(s, prev);
    s = std::move(out);
  }
  return s;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::apply_config(const tok::json& config, const std::string& where) {
  using tok::json;
  clean_up_spaces = tok::bool_field(config, "clean_up_tokenization_spaces", false, where);

  // LlamaTokenizerFast / GemmaTokenizerFast rebuild the post-processor from
  // add_bos_token / add_eos_token at load (update_post_processor), whatever
  // tokenizer.json says.
  std::string cls = tok::optional_string(config, "tokenizer_class", where).value_or("");
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  const bool gemma = cls == "GemmaTokenizer";
  if (!(gemma || cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizer")) return;
  const bool add_bos = tok::bool_field(config, "add_bos_token", true, where);
  const bool add_eos = tok::bool_field(config, "add_eos_token", false, where);
  auto resolve = [&](const char* key, const char* def) {
    const std::string name = token_setting(config, key, where).value_or(def);
    int32_t id = added.id_of(name);
    if (id < 0) id = model->token_to_id(name);
    if (id < 0) tok::fail(tok::at_key(where, key), "'" + name + "' is not a token");
    return id;
  };
  auto pp = std::make_unique<tok::PostProcessor>();
  if (add_bos) pp->prefix.push_back(resolve("bos_token", gemma ? "<bos>" : "<s>"));
  if (add_eos) pp->suffix.push_back(resolve("eos_token", gemma ? "<eos>" : "</s>"));
  post_processor = pp->prefix.empty() && pp->suffix.empty() ? nullptr : std::move(pp);
}

namespace {

// transformers' PreTrainedTokenizerFast.__init__ forces the top-level
// pre-tokenizer's add_prefix_space to the tokenizer's own setting (from
// tokenizer_config.json; False by default, None for the Llama classes, where
// None leaves it alone).
void apply_add_prefix_space(json& root, const json& config, const std::string& where) {
  std::string cls = tok::optional_string(config, "tokenizer_class", where).value_or("");
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  json value = cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizer" ? json(nullptr) : json(false);
  if (config.contains("add_prefix_space")) value = config["add_prefix_space"];
  if (!value.is_boolean() || !root.contains("pre_tokenizer")) return;
  json& pre = root["pre_tokenizer"];
  if (pre.is_object() && pre.contains("add_prefix_space")) pre["add_prefix_space"] = value;
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "tokenizer.json";
  if (!std::filesystem::exists(path)) throw Error(path.string() + ": not found");
  json root = read_json_file(path);
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  json config = json::object();
  if (std::filesystem::exists(config_path)) {
    config = read_json_file(config_path);
    if (!config.is_object())
      tok::fail(config_path.string(), "expected a JSON object at the top level");
  }
  return Tokenizer(Impl::build(std::move(root), config, path.string(), config_path.string()));
}

std::unique_ptr<Tokenizer::Impl> Tokenizer::Impl::build(tok::json root, const tok::json& config,
                                                        const std::string& file,
                                                        const std::string& config_file,
                                                        std::unique_ptr<tok::Model> model) {
  const std::string where = file + ": ";
  if (!root.is_object()) tok::fail(file, "expected a JSON object at the top level");
  if (auto v = tok::optional_string(root, "version", where); v && *v != "1.0")
    tok::fail(tok::at_key(where, "version"), "unknown tokenizer.json version '" + *v + "'");
  apply_add_prefix_space(root, config, config_file + ": ");

  auto impl = std::make_unique<Impl>();
  auto field = [&](const char* key) -> const json& {
    static const json null_json;
    const json* f = tok::find_field(root, key);
    return f ? *f : null_json;
  };
  impl->normalizer = tok::make_normalizer(field("normalizer"), tok::at_key(where, "normalizer"));
  impl->pre_tokenizer =
      tok::make_pre_tokenizer(field("pre_tokenizer"), tok::at_key(where, "pre_tokenizer"));
  impl->model = model ? std::move(model)
                      : tok::make_model(tok::require_field(root, "model", where),
                                        tok::at_key(where, "model"));
  impl->decoder = tok::make_decoder(field("decoder"), tok::at_key(where, "decoder"));
  impl->added.load(field("added_tokens"), tok::at_key(where, "added_tokens"),
                   impl->normalizer.get(), *impl->model);
  impl->post_processor =
      tok::make_post_processor(field("post_processor"), tok::at_key(where, "post_processor"));
  impl->apply_config(config, config_file + ": ");
  return impl;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode(text, add_special_tokens, {});
}

std::vector<tok::Segment> Tokenizer::Impl::split_added(std::string_view text,
                                                       std::span<const TextSpan> plain) const {
  // Regexes need valid UTF-8; like Python's errors="replace", bad bytes become U+FFFD.
  std::vector<tok::Segment> segments;
  segments.push_back(
      {tok::is_valid_utf8(text) ? std::string(text) : tok::utf8_lossy(text), -1, true});
  std::vector<std::pair<size_t, size_t>> plain_ranges;
  for (const TextSpan& p : plain) plain_ranges.emplace_back(p.begin, p.end);
  added.split(segments, /*normalized_tokens=*/false, plain_ranges);
  // Normalization moves bytes, so from here on a segment that touched a plain
  // span is plain as a whole (chat markers are normalized=false tokens, so
  // they were already split off above).
  for (tok::Segment& s : segments) {
    for (const auto& [b, e] : plain_ranges)
      s.plain = s.plain || (s.token < 0 && s.offset < e && b < s.offset + s.text.size());
  }
  if (normalizer) {
    for (tok::Segment& s : segments)
      if (s.token < 0) normalizer->normalize(s.text);
  }
  added.split(segments, /*normalized_tokens=*/true);
  return segments;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                       std::span<const TextSpan> plain) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  if (add_special_tokens && m.post_processor)
    ids.insert(ids.end(), m.post_processor->prefix.begin(), m.post_processor->prefix.end());
  std::vector<tok::Segment> segments = m.split_added(text, plain);

  std::vector<tok::Piece> pieces;
  for (tok::Segment& s : segments) {
    if (s.token >= 0) {
      ids.push_back(s.token);
      continue;
    }
    if (s.text.empty()) continue;
    pieces.clear();
    pieces.push_back({std::move(s.text), s.at_origin});
    if (m.pre_tokenizer) m.pre_tokenizer->split(pieces);
    for (const tok::Piece& p : pieces) m.model->tokenize(p.text, ids);
  }

  if (add_special_tokens && m.post_processor)
    ids.insert(ids.end(), m.post_processor->suffix.begin(), m.post_processor->suffix.end());
  return ids;
}

const std::string* Tokenizer::Impl::id_to_token(int32_t id) const {
  if (const tok::AddedToken* a = added.by_id(id)) return &a->match_text;
  return model->id_to_token(id);
}

std::string Tokenizer::Impl::decode_raw(std::span<const int32_t> ids, bool skip_special,
                                        bool keep_bytes, std::span<const std::string> kept) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = id_to_token(id);
    if (t == nullptr) continue;  // HF drops ids it does not know
    if (skip_special && added.is_special_content(*t) &&
        std::find(kept.begin(), kept.end(), *t) == kept.end())
      continue;
    tokens.push_back(*t);
  }
  if (!decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder->decode_chain(tokens, keep_bytes);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  return impl_->decode_raw(std::span<const int32_t>(&id, 1), false, /*keep_bytes=*/true);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string text = impl_->decode_raw(ids, skip_special_tokens);
  return impl_->clean_up_spaces ? clean_up_tokenization(std::move(text)) : text;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const int32_t id = impl_->added.id_of(token);
  return id >= 0 ? id : impl_->model->token_to_id(token);
}

size_t Tokenizer::vocab_size() const {
  return std::max(impl_->model->id_count(), static_cast<size_t>(impl_->added.max_id() + 1));
}

std::vector<int32_t> Tokenizer::special_tokens_in(std::string_view text,
                                                  std::span<const TextSpan> plain) const {
  std::vector<int32_t> ids;
  for (const tok::Segment& s : impl_->split_added(text, plain))
    if (s.token >= 0 && is_special(s.token)) ids.push_back(s.token);
  return ids;
}

bool Tokenizer::is_special(int32_t id) const {
  const std::string* t = impl_->id_to_token(id);
  return t != nullptr && impl_->added.is_special_content(*t);
}

}  // namespace edgellm
