#include "edgellm/session.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/thread_pool.h"
#include "io/safetensors.h"
#include "models/gguf_weights.h"
#include "models/transformer.h"

namespace edgellm {

struct Session::State {
  std::filesystem::path model_dir;
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  ChatTemplate chat_template;
  std::optional<Checkpoint> checkpoint;  // mapped for the embedding rows
  std::unique_ptr<ThreadPool> pool;
  Profiler profiler;
  std::unique_ptr<Transformer> model;
  std::vector<float> logits;
  int max_context = 0;
};

Session::Session() = default;
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

namespace {

// generation_config.json may list extra stop ids (e.g. Llama 3 instruct's <|eot_id|>).
void merge_generation_eos(const std::filesystem::path& dir, ModelConfig& config) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return;
  nlohmann::json j;
  try {
    std::ifstream in(path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object() || !j.contains("eos_token_id")) return;
  auto add = [&](const nlohmann::json& v) {
    check(v.is_number_integer() && v.get<int>() >= 0 && v.get<int>() < config.vocab_size,
          path.string() + ": field 'eos_token_id' holds " + v.dump() + ", outside the vocabulary");
    if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), v.get<int>()) ==
        config.eos_token_ids.end())
      config.eos_token_ids.push_back(v.get<int>());
  };
  if (j["eos_token_id"].is_array())
    for (const auto& v : j["eos_token_id"]) add(v);
  else if (!j["eos_token_id"].is_null())
    add(j["eos_token_id"]);
}

// The quantized form of the matrices, if any: the GGUF's blocks or --weights.
std::optional<QuantSource> quant_source(const std::unique_ptr<GgufWeights>& gguf,
                                        const std::string& weights) {
  if (gguf) {
    check(weights.empty(),
          "--weights " + weights + " applies to bf16 checkpoints, not a GGUF file");
    return gguf->source;
  }
  if (weights.empty()) return std::nullopt;
  QuantSource q;
  if (weights == "q8_0")
    q.quantize = kernels::BlockFormat::q8_0;
  else if (weights == "q4_0")
    q.quantize = kernels::BlockFormat::q4_0;
  else
    throw Error("--weights " + weights + ": expected q8_0 or q4_0");
  return q;
}

}  // namespace

void Session::setup(const std::filesystem::path& model, const SessionOptions& options) {
  // A .gguf file runs inside the converted checkpoint directory that holds it.
  const bool is_gguf = model.extension() == ".gguf";
  check(!is_gguf || std::filesystem::is_regular_file(model),
        model.string() + ": GGUF file not found");
  const auto model_dir = is_gguf ? model.parent_path() : model;
  check(std::filesystem::is_directory(model_dir),
        model_dir.string() +
            ": checkpoint directory not found (fetch it with `make fetch` or set MODEL=<dir>)");
  check(!is_gguf || std::filesystem::exists(model_dir / "config.json"),
        model.string() +
            ": no converted checkpoint beside it (config.json, tokenizer.json, "
            "model.safetensors); scripts/fetch_model.py writes one from the same GGUF");
  check(options.max_context > 0,
        "max_context must be positive, got " + std::to_string(options.max_context));
  auto s = std::make_unique<State>();
  s->profiler.enable(options.profile);
  const auto t0 = std::chrono::steady_clock::now();
  s->model_dir = model_dir;
  s->config = load_model_config(model_dir / "config.json");
  merge_generation_eos(model_dir, s->config);
  s->tokenizer.emplace(Tokenizer::load(model_dir));
  s->chat_template = ChatTemplate::load(model_dir);
  check(s->tokenizer->vocab_size() <= static_cast<size_t>(s->config.vocab_size),
        (model_dir / "tokenizer.json").string() + ": " +
            std::to_string(s->tokenizer->vocab_size()) +
            " tokens do not fit the model's vocab_size " + std::to_string(s->config.vocab_size));
  s->checkpoint.emplace(Checkpoint::open(model_dir));
  s->max_context = std::min(options.max_context, s->config.max_position_embeddings);
  s->pool = std::make_unique<ThreadPool>(options.threads);
  {
    const auto gguf = is_gguf ? open_gguf_weights(model, s->config) : nullptr;
    const auto quant = quant_source(gguf, options.weights);
    s->model = std::make_unique<Transformer>(
        s->config,
        load_weights(*s->checkpoint, s->config, s->pool->size(), quant ? &*quant : nullptr),
        s->max_context, *s->pool, s->profiler);
  }  // the GGUF is unmapped: its blocks are repacked
  s->logits.resize(static_cast<size_t>(s->config.vocab_size));
  s->profiler.add(Zone::setup,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0,
                  0);
  state_ = std::move(s);
}

std::span<const float> Session::prefill(std::span<const int32_t> tokens, int start_pos,
                                        PrefillCapture* capture) {
  // Plain ifs, not check(): these run per call and must not build messages on success.
  if (!state_) throw Error("Session::prefill called before setup()");
  if (tokens.empty()) throw Error("prefill needs at least one token");
  if (start_pos < 0 ||
      static_cast<size_t>(start_pos) + tokens.size() > static_cast<size_t>(state_->max_context))
    throw Error("prompt of " + std::to_string(tokens.size()) + " tokens at position " +
                std::to_string(start_pos) + " exceeds the context of " +
                std::to_string(state_->max_context) + " tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= state_->config.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  state_->profiler.set_phase(Phase::prefill);
  Profiler::Scope z(state_->profiler, Zone::prefill);
  state_->model->forward(tokens.data(), tokens.size(), static_cast<size_t>(start_pos),
                         state_->logits.data(), capture);
  return state_->logits;
}

std::span<const float> Session::decode_step(int32_t token, int pos) {
  if (!state_) throw Error("Session::decode_step called before setup()");
  if (pos < 0 || pos >= state_->max_context)
    throw Error("decode position " + std::to_string(pos) + " is outside the context of " +
                std::to_string(state_->max_context) + " tokens");
  if (token < 0 || token >= state_->config.vocab_size)
    throw Error("token id " + std::to_string(token) + " is outside the vocabulary");
  state_->profiler.set_phase(Phase::decode);
  Profiler::Scope z(state_->profiler, Zone::decode);
  state_->model->forward(&token, 1, static_cast<size_t>(pos), state_->logits.data(), nullptr);
  return state_->logits;
}

const ModelConfig& Session::config() const {
  return state_->config;
}
const Tokenizer& Session::tokenizer() const {
  return *state_->tokenizer;
}
const ChatTemplate& Session::chat_template() const {
  return state_->chat_template;
}
Profiler& Session::profiler() {
  return state_->profiler;
}
int Session::max_context() const {
  return state_->max_context;
}
int Session::threads() const {
  return state_->pool->size();
}
size_t Session::weight_bytes() const {
  return state_->model->decode_bytes();
}

}  // namespace edgellm
