#include "edgellm/session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/thread_pool.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "models/transformer.h"
#include "models/weights.h"

namespace edgellm {

struct Session::State {
  std::filesystem::path model_dir;
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  ChatTemplate chat_template;
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
  const nlohmann::json j = read_json_file(path);
  if (!j.is_object() || !j.contains("eos_token_id")) return;
  auto add = [&](const nlohmann::json& v) {
    // Compared as int64 so 2^32 + 2 cannot wrap to the valid id 2.
    const bool ok = v.is_number_integer() &&
                    !(v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) &&
                    v.get<int64_t>() >= 0 && v.get<int64_t>() < config.vocab_size;
    if (!ok)
      throw Error(path.string() + ": field 'eos_token_id' holds " + json_excerpt(v) +
                  ", outside the vocabulary of " + std::to_string(config.vocab_size));
    const int id = static_cast<int>(v.get<int64_t>());
    if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) ==
        config.eos_token_ids.end())
      config.eos_token_ids.push_back(id);
  };
  if (j["eos_token_id"].is_array())
    for (const auto& v : j["eos_token_id"]) add(v);
  else if (!j["eos_token_id"].is_null())
    add(j["eos_token_id"]);
}

// More threads than this per hardware thread only adds contention.
constexpr int kThreadsPerHardwareThread = 4;

int checked_threads(int requested) {
  const int hardware = std::max(1u, std::thread::hardware_concurrency());
  const int max = kThreadsPerHardwareThread * hardware;
  if (requested > max)
    throw Error("threads must be at most " + std::to_string(max) + " (" +
                std::to_string(kThreadsPerHardwareThread) + " x the " + std::to_string(hardware) +
                " hardware threads), got " + std::to_string(requested));
  return requested;
}

std::string gb_str(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  return buf;
}

// Memory the kernel would give us now without swapping: MemAvailable, or free
// pages where /proc/meminfo is absent.
double available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) *
         static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Refuses a setup that cannot fit before allocating any of it: packed weights,
// the KV cache, the RoPE tables and the scratch a full-context prefill grows to
// (models/transformer.cpp allocates exactly these). Doubles, so a 2^31-position
// request cannot overflow the sum.
void check_memory(const ModelConfig& c, size_t weight_bytes, int max_context) {
  const double ctx = max_context, L = c.num_layers, H = c.hidden_size, I = c.intermediate_size;
  const double D = c.head_dim, heads = c.num_heads, kv_heads = c.num_kv_heads;
  const double kv = 2.0 * L * kv_heads * ctx * D * sizeof(float);
  std::set<std::pair<float, bool>> rope_bases;
  for (const LayerSpec& l : c.layers) rope_bases.insert({l.rope_theta, l.rope_scaled});
  const double rope = static_cast<double>(rope_bases.size()) * ctx * D * sizeof(float);
  const double per_token = 3 * H + (heads + 2 * kv_heads) * D + 2 * heads * D + 3 * I;
  const double scratch = (ctx * per_token + c.vocab_size) * sizeof(float);
  const double need = static_cast<double>(weight_bytes) + kv + rope + scratch;
  const double available = available_bytes();
  if (need > available)
    throw Error("setup needs " + gb_str(need) + " (weights " + gb_str(weight_bytes) +
                ", KV cache " + gb_str(kv) + " for " + std::to_string(max_context) +
                " positions, scratch " + gb_str(rope + scratch) + "), " + gb_str(available) +
                " available: lower max_context (--max-context)");
}

}  // namespace

void Session::setup(const std::filesystem::path& model_dir, const SessionOptions& options) {
  check(std::filesystem::is_directory(model_dir),
        model_dir.string() +
            ": checkpoint directory not found (fetch it with `make fetch` or set MODEL=<dir>)");
  check(options.max_context > 0,
        "max_context must be positive, got " + std::to_string(options.max_context));
  const int threads = checked_threads(options.threads);
  auto s = std::make_unique<State>();
  s->profiler.enable(options.profile);
  const auto t0 = std::chrono::steady_clock::now();
  // Names the step an out-of-memory error interrupted.
  std::string step = "reading config.json";
  try {
    s->model_dir = model_dir;
    s->config = load_model_config(model_dir / "config.json");
    merge_generation_eos(model_dir, s->config);
    step = "loading the tokenizer";
    s->tokenizer.emplace(Tokenizer::load(model_dir));
    s->chat_template = ChatTemplate::load(model_dir);
    check(s->tokenizer->vocab_size() <= static_cast<size_t>(s->config.vocab_size),
          (model_dir / "tokenizer.json").string() + ": " +
              std::to_string(s->tokenizer->vocab_size()) +
              " tokens do not fit the model's vocab_size " + std::to_string(s->config.vocab_size));
    step = "reading the safetensors headers";
    // The mapping lives only through setup: the packed weights hold copies, so a
    // model file truncated or edited while a chat runs cannot fault or change it.
    const Checkpoint checkpoint = Checkpoint::open(model_dir);
    const size_t weight_bytes = check_weights(checkpoint, s->config);
    s->max_context = std::min(options.max_context, s->config.max_position_embeddings);
    check_memory(s->config, weight_bytes, s->max_context);
    step = "starting the worker threads";
    s->pool = std::make_unique<ThreadPool>(threads);
    step = "packing " + gb_str(weight_bytes) + " of weights";
    ModelWeights weights = load_weights(checkpoint, s->config, s->pool->size());
    step = "allocating the KV cache for " + std::to_string(s->max_context) + " positions";
    s->model = std::make_unique<Transformer>(s->config, std::move(weights), s->max_context,
                                             *s->pool, s->profiler);
    s->logits.resize(static_cast<size_t>(s->config.vocab_size));
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while " + step);
  } catch (const std::length_error&) {
    throw Error("out of memory while " + step);
  } catch (const std::system_error& e) {  // e.g. a thread the OS would not create
    throw Error(std::string(e.what()) + " while " + step);
  }
  s->profiler.add(Zone::setup,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0,
                  0);
  state_ = std::move(s);
}

Session::State& Session::state() const {
  // Plain if, not check(): this runs per call and must not build a message on success.
  if (!state_) throw Error("the session is not set up (setup() was not called or failed)");
  return *state_;
}

std::span<const float> Session::prefill(std::span<const int32_t> tokens, int start_pos,
                                        PrefillCapture* capture) {
  // Plain ifs, not check(): these run per call and must not build messages on success.
  State& st = state();
  if (tokens.empty()) throw Error("prefill needs at least one token");
  if (start_pos < 0 ||
      static_cast<size_t>(start_pos) + tokens.size() > static_cast<size_t>(st.max_context))
    throw Error("prompt of " + std::to_string(tokens.size()) + " tokens at position " +
                std::to_string(start_pos) + " exceeds the context of " +
                std::to_string(st.max_context) + " tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= st.config.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  st.profiler.set_phase(Phase::prefill);
  Profiler::Scope z(st.profiler, Zone::prefill);
  try {
    st.model->forward(tokens.data(), tokens.size(), static_cast<size_t>(start_pos),
                      st.logits.data(), capture);
  } catch (const std::bad_alloc&) {  // scratch grows with the longest prompt seen
    throw Error("out of memory while allocating scratch for a prefill of " +
                std::to_string(tokens.size()) + " tokens");
  }
  return st.logits;
}

std::span<const float> Session::decode_step(int32_t token, int pos) {
  State& st = state();
  if (pos < 0 || pos >= st.max_context)
    throw Error("decode position " + std::to_string(pos) + " is outside the context of " +
                std::to_string(st.max_context) + " tokens");
  if (token < 0 || token >= st.config.vocab_size)
    throw Error("token id " + std::to_string(token) + " is outside the vocabulary");
  st.profiler.set_phase(Phase::decode);
  Profiler::Scope z(st.profiler, Zone::decode);
  st.model->forward(&token, 1, static_cast<size_t>(pos), st.logits.data(), nullptr);
  return st.logits;
}

const ModelConfig& Session::config() const {
  return state().config;
}
const Tokenizer& Session::tokenizer() const {
  return *state().tokenizer;
}
const ChatTemplate& Session::chat_template() const {
  return state().chat_template;
}
Profiler& Session::profiler() {
  return state().profiler;
}
int Session::max_context() const {
  return state().max_context;
}
int Session::threads() const {
  return state().pool->size();
}
size_t Session::weight_bytes() const {
  return state().model->decode_bytes();
}

}  // namespace edgellm
