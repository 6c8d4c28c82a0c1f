#include "edgellm/session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "edgellm/model_store.h"
#include "edgellm/thread_pool.h"
#include "io/safetensors.h"
#include "models/gguf_config.h"
#include "models/gguf_weights.h"
#include "models/transformer.h"
#include "models/weights.h"

namespace edgellm {

struct Model::State {
  std::filesystem::path model_dir;
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  ChatTemplate chat_template;
  std::unique_ptr<ThreadPool> pool;
  Profiler profiler;
  std::unique_ptr<Transformer> model;
  int max_context = 0;
  std::string rounded_from;  // the dtype of weights rounded to bf16 at load ("": none)
  std::mutex forward_mutex;  // one forward pass at a time: the pool takes one caller
  Scratch batch_scratch;     // decode_batch's activations (under forward_mutex)
};

struct Context::State {
  std::shared_ptr<Model::State> model;
  KvCache kv;
  Scratch scratch;
  std::vector<float> logits;
  int position = 0;
};

Model::Model() = default;
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Context::Context() = default;
Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
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
void check_memory(const ModelConfig& c, size_t weight_bytes, int max_context,
                  kernels::KvDtype kv_dtype) {
  const double ctx = max_context, L = c.num_layers, H = c.hidden_size, I = c.intermediate_size;
  const double D = c.head_dim, heads = c.num_heads, kv_heads = c.num_kv_heads;
  const double kv = 2.0 * L * kv_heads * ctx * D * static_cast<double>(kv_dtype_bytes(kv_dtype));
  std::set<std::pair<float, bool>> rope_bases;
  for (const LayerSpec& l : c.layers) rope_bases.insert({l.rope_theta, l.rope_scaled});
  const double rope = static_cast<double>(rope_bases.size()) * ctx * D * sizeof(float);
  const double per_token = 3 * H + (heads + 2 * kv_heads) * D + 2 * heads * D + 3 * I;
  const double scratch = (ctx * per_token + c.vocab_size) * sizeof(float);
  const double need = static_cast<double>(weight_bytes) + kv + rope + scratch;
  const double available = available_bytes();
  if (need > available)
    throw Error("setup needs " + gb_str(need) + " (weights " + gb_str(weight_bytes) + ", " +
                std::string(kernels::kv_dtype_name(kv_dtype)) + " KV cache " + gb_str(kv) +
                " for " + std::to_string(max_context) + " positions, scratch " +
                gb_str(rope + scratch) + "), " + gb_str(available) +
                " available: lower max_context (--max-context)");
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

size_t prefill_chunk_size(size_t left, size_t budget) {
  const size_t min = kMinPrefillChunk;
  if (left <= std::max(budget, min) || left < 2 * min) return left;
  const size_t n = std::max(budget, min);
  return left - n < min ? left - min : n;
}

void Model::setup(const std::filesystem::path& model, const SessionOptions& options) {
  // A .gguf file runs inside the converted checkpoint directory that holds it,
  // or, with none there, from its own metadata alone.
  const bool is_gguf = model.extension() == ".gguf";
  check(!is_gguf || std::filesystem::is_regular_file(model),
        model.string() + ": GGUF file not found");
  const bool bare = is_bare_gguf(model);
  const auto model_dir = checkpoint_dir(model);
  check(std::filesystem::is_directory(model_dir),
        model_dir.string() +
            ": checkpoint directory not found (fetch it with `make fetch` or set MODEL=<dir>)");
  check(options.max_context > 0,
        "max_context must be positive, got " + std::to_string(options.max_context));
  const int threads = checked_threads(options.threads);
  const kernels::ExecConfig cfg = resolve_exec_config(options);
  auto s = std::make_shared<State>();
  s->profiler.enable(options.profile);
  const auto t0 = std::chrono::steady_clock::now();
  // Names the step an out-of-memory error interrupted.
  std::string step = bare ? "reading the GGUF metadata" : "reading config.json";
  try {
    s->model_dir = model_dir;
    // A bare GGUF's tensors, opened first: its metadata is the config.
    std::unique_ptr<GgufWeights> gguf = bare ? open_bare_gguf_weights(model) : nullptr;
    if (bare) {
      s->config = model_config_from_gguf(gguf->file);
    } else {
      s->config = load_model_config(model_dir / "config.json");
      merge_generation_eos(model_dir, s->config);
    }
    check(cfg.kv != kernels::KvDtype::q8_0 || s->config.head_dim % kernels::kKvQ8Block == 0,
          "a q8_0 KV cache quantizes blocks of 32 head dims, and this model's head_dim is " +
              std::to_string(s->config.head_dim) + ": use --kv-cache fp32 or bf16");
    step = "loading the tokenizer";
    s->tokenizer.emplace(bare ? Tokenizer::from_gguf(model) : Tokenizer::load(model_dir));
    s->chat_template = chat_template_of(model);
    check(s->tokenizer->vocab_size() <= static_cast<size_t>(s->config.vocab_size),
          (bare ? model : model_dir / "tokenizer.json").string() + ": " +
              std::to_string(s->tokenizer->vocab_size()) +
              " tokens do not fit the model's vocab_size " + std::to_string(s->config.vocab_size));
    step = bare ? "reading the GGUF tensors" : "reading the safetensors headers";
    // The mappings live only through setup: the packed weights hold copies, so a
    // model file truncated or edited while a chat runs cannot fault or change it.
    const std::optional<Checkpoint> own =
        bare ? std::nullopt : std::optional<Checkpoint>(Checkpoint::open(model_dir));
    const Checkpoint& checkpoint = bare ? *gguf->checkpoint : *own;
    step = "reading the GGUF file";
    if (is_gguf && !bare) gguf = open_gguf_weights(model, s->config);
    const auto quant = quant_source(gguf, options.weights);
    const size_t weight_bytes = check_weights(checkpoint, s->config, quant ? &*quant : nullptr);
    s->max_context = std::min(options.max_context, s->config.position_limit());
    check_memory(s->config, weight_bytes, s->max_context, cfg.kv);
    step = "starting the worker threads";
    s->pool = std::make_unique<ThreadPool>(threads);
    step = "packing " + gb_str(weight_bytes) + " of weights";
    ModelWeights weights =
        load_weights(checkpoint, s->config, s->pool.get(), quant ? &*quant : nullptr, cfg.isa);
    if (weights.rounded_from) {  // said once, at load: the exact path's promise does not hold
      s->rounded_from = weights.rounded_from;
      std::fprintf(stderr,
                   "note: %s: its %s weight matrices hold values bf16 cannot, rounded to bf16 at "
                   "load (the engine's weight format); verify judges them as bf16 weights\n",
                   model.string().c_str(), weights.rounded_from);
    }
    step = "building the RoPE tables for " + std::to_string(s->max_context) + " positions";
    s->model = std::make_unique<Transformer>(s->config, std::move(weights), s->max_context,
                                             *s->pool, s->profiler, cfg);
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

namespace {

const Model::State& ready_model(const std::shared_ptr<Model::State>& s) {
  // Plain if, not check(): this runs per call and must not build a message on success.
  if (!s) throw Error("the model is not set up (setup() was not called or failed)");
  return *s;
}

}  // namespace

const ModelConfig& Model::config() const {
  return ready_model(state_).config;
}
const Tokenizer& Model::tokenizer() const {
  return *ready_model(state_).tokenizer;
}
const ChatTemplate& Model::chat_template() const {
  return ready_model(state_).chat_template;
}
Profiler& Model::profiler() const {
  ready_model(state_);
  return state_->profiler;
}
int Model::max_context() const {
  return ready_model(state_).max_context;
}
int Model::threads() const {
  return ready_model(state_).pool->size();
}
std::string Model::rounded_weights() const {
  return ready_model(state_).rounded_from;
}
size_t Model::weight_bytes() const {
  return ready_model(state_).model->decode_bytes();
}
std::string Model::kv_cache_dtype() const {
  return std::string(kernels::kv_dtype_name(ready_model(state_).model->kv_dtype()));
}
const kernels::ExecConfig& Model::exec_config() const {
  return ready_model(state_).model->exec_config();
}
size_t Model::kv_cache_bytes() const {
  return ready_model(state_).model->kv_cache_bytes();
}

Context::Context(const Model& model) : state_(std::make_unique<State>()) {
  ready_model(model.state_);
  state_->model = model.state_;
  try {
    state_->kv = model.state_->model->new_kv_cache();
    state_->logits.resize(static_cast<size_t>(model.state_->config.vocab_size));
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while allocating the KV cache for " +
                std::to_string(model.state_->max_context) + " positions");
  }
}

std::span<const float> Context::prefill(std::span<const int32_t> tokens, int start_pos,
                                        PrefillCapture* capture) {
  // Plain ifs, not check(): these run per call and must not build messages on success.
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  Model::State& m = *state_->model;
  if (tokens.empty()) throw Error("prefill needs at least one token");
  if (start_pos < 0 ||
      static_cast<size_t>(start_pos) + tokens.size() > static_cast<size_t>(m.max_context))
    throw Error("prompt of " + std::to_string(tokens.size()) + " tokens at position " +
                std::to_string(start_pos) + " exceeds the context of " +
                std::to_string(m.max_context) + " tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= m.config.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  const std::lock_guard lock(m.forward_mutex);
  m.profiler.set_phase(Phase::prefill);
  Profiler::Scope z(m.profiler, Zone::prefill);
  try {
    m.model->forward(state_->kv, state_->scratch, tokens.data(), tokens.size(),
                     static_cast<size_t>(start_pos), state_->logits.data(), capture);
  } catch (const std::bad_alloc&) {  // scratch grows with the longest prompt seen
    throw Error("out of memory while allocating scratch for a prefill of " +
                std::to_string(tokens.size()) + " tokens");
  }
  state_->position = start_pos + static_cast<int>(tokens.size());
  return state_->logits;
}

void Context::prefill_packed(std::span<const std::span<const int32_t>> inputs,
                             std::span<float> hidden, std::span<float> logits) {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  Model::State& m = *state_->model;
  const size_t H = static_cast<size_t>(m.config.hidden_size);
  const size_t V = static_cast<size_t>(m.config.vocab_size);
  if (inputs.empty()) throw Error("prefill_packed needs at least one input");
  if (hidden.size() != inputs.size() * H || (!logits.empty() && logits.size() != inputs.size() * V))
    throw Error("prefill_packed: the output buffers do not hold one row per input");
  std::vector<SequenceRows> seqs;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) throw Error("input " + std::to_string(i) + " has no tokens");
    if (tokens.size() + inputs[i].size() > static_cast<size_t>(m.max_context))
      throw Error("inputs of " + std::to_string(tokens.size() + inputs[i].size()) +
                  "+ tokens in all exceed the context of " + std::to_string(m.max_context) +
                  " tokens");
    for (int32_t t : inputs[i])
      if (t < 0 || t >= m.config.vocab_size)
        throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
    seqs.push_back({&state_->kv, 0, inputs[i].size(), logits.empty() ? nullptr : &logits[i * V],
                    tokens.size()});
    tokens.insert(tokens.end(), inputs[i].begin(), inputs[i].end());
  }
  const std::lock_guard lock(m.forward_mutex);
  m.profiler.set_phase(Phase::prefill);
  Profiler::Scope z(m.profiler, Zone::prefill);
  state_->position = 0;  // the packed rows are no one sequence's history
  try {
    m.model->prefill_packed(seqs, state_->scratch, tokens.data(), tokens.size(), hidden.data());
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while allocating scratch for a prefill of " +
                std::to_string(tokens.size()) + " tokens");
  }
}

namespace {

void check_decode(const Model::State& m, int32_t token, int pos) {
  if (pos < 0 || pos >= m.max_context)
    throw Error("decode position " + std::to_string(pos) + " is outside the context of " +
                std::to_string(m.max_context) + " tokens");
  if (token < 0 || token >= m.config.vocab_size)
    throw Error("token id " + std::to_string(token) + " is outside the vocabulary");
}

}  // namespace

std::span<const float> Context::decode_step(int32_t token, int pos) {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  Model::State& m = *state_->model;
  check_decode(m, token, pos);
  const std::lock_guard lock(m.forward_mutex);
  m.profiler.set_phase(Phase::decode);
  Profiler::Scope z(m.profiler, Zone::decode);
  m.model->forward(state_->kv, state_->scratch, &token, 1, static_cast<size_t>(pos),
                   state_->logits.data(), nullptr);
  state_->position = pos + 1;
  return state_->logits;
}

namespace {

// Names the bad argument of a KV save or load; `bytes` is the buffer's size.
void check_kv_span(const Model::State& m, int start, int n, size_t bytes, const char* what) {
  if (start < 0 || n < 0 ||
      static_cast<size_t>(start) + static_cast<size_t>(n) > static_cast<size_t>(m.max_context))
    throw Error(std::string(what) + ": positions [" + std::to_string(start) + ", " +
                std::to_string(static_cast<int64_t>(start) + n) + ") outside the context of " +
                std::to_string(m.max_context) + " tokens");
  const size_t need = m.model->kv_span_bytes(static_cast<size_t>(n));
  if (bytes != need)
    throw Error(std::string(what) + ": " + std::to_string(n) + " positions take " +
                std::to_string(need) + " bytes, the buffer has " + std::to_string(bytes));
}

}  // namespace

size_t Context::kv_bytes(int n) const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  if (n < 0) throw Error("kv_bytes: negative position count");
  return state_->model->model->kv_span_bytes(static_cast<size_t>(n));
}

void Context::save_kv(int start, int n, std::span<uint8_t> out) const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  check_kv_span(*state_->model, start, n, out.size(), "save_kv");
  state_->model->model->save_kv(state_->kv, static_cast<size_t>(start), static_cast<size_t>(n),
                                out.data());
}

void Context::load_kv(int start, int n, std::span<const uint8_t> in) {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  check_kv_span(*state_->model, start, n, in.size(), "load_kv");
  state_->model->model->load_kv(state_->kv, static_cast<size_t>(start), static_cast<size_t>(n),
                                in.data());
  state_->position = start + n;
}

void Context::rewind(int pos) {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  if (pos < 0 || pos > state_->position)
    throw Error("rewind to position " + std::to_string(pos) + ": the context holds " +
                std::to_string(state_->position) + " positions");
  state_->position = pos;
}

std::span<const float> Context::logits() const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  return state_->logits;
}
int Context::position() const {
  return state_ ? state_->position : 0;
}
const ModelConfig& Context::config() const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  return state_->model->config;
}
const Tokenizer& Context::tokenizer() const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  return *state_->model->tokenizer;
}
int Context::max_context() const {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  return state_->model->max_context;
}

void decode_batch(std::span<Context* const> contexts, std::span<const int32_t> tokens,
                  std::span<const int> positions) {
  if (contexts.empty()) return;
  if (tokens.size() != contexts.size() || positions.size() != contexts.size())
    throw Error("decode_batch: one token and one position per context");
  for (const Context* c : contexts)
    if (!c || !c->state_) throw Error("decode_batch: a context is not set up");
  Model::State& m = *contexts[0]->state_->model;
  std::vector<SequenceRows> rows;
  rows.reserve(contexts.size());
  for (size_t i = 0; i < contexts.size(); ++i) {
    Context::State& c = *contexts[i]->state_;
    if (c.model.get() != &m) throw Error("decode_batch: contexts of different models");
    for (size_t j = 0; j < i; ++j)
      if (contexts[j] == contexts[i]) throw Error("decode_batch: a context appears twice");
    check_decode(m, tokens[i], positions[i]);
    rows.push_back({&c.kv, static_cast<size_t>(positions[i]), 1, c.logits.data()});
  }
  const std::lock_guard lock(m.forward_mutex);
  m.profiler.set_phase(Phase::decode);
  Profiler::Scope z(m.profiler, Zone::decode);
  m.model->decode_batch(rows, m.batch_scratch, tokens.data());
  for (size_t i = 0; i < contexts.size(); ++i) contexts[i]->state_->position = positions[i] + 1;
}

void Context::decode_rows(std::span<const int32_t> tokens, int start_pos,
                          std::vector<float>& logits) {
  if (!state_) throw Error("the context is not set up (setup() was not called or failed)");
  Model::State& m = *state_->model;
  const size_t vocab = static_cast<size_t>(m.config.vocab_size);
  logits.resize(tokens.size() * vocab);
  // One decode batch whose rows share this KV cache: every row's K/V is stored
  // before any row attends, so row i sees positions [0, start_pos + i].
  std::vector<SequenceRows> rows;
  rows.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    check_decode(m, tokens[i], start_pos + static_cast<int>(i));
    rows.push_back({&state_->kv, static_cast<size_t>(start_pos) + i, 1, &logits[i * vocab]});
  }
  const std::lock_guard lock(m.forward_mutex);
  m.profiler.set_phase(Phase::decode);
  Profiler::Scope z(m.profiler, Zone::decode);
  m.model->decode_batch(rows, m.batch_scratch, tokens.data());
  state_->position = start_pos + static_cast<int>(tokens.size());
}

// ---- Session: one Model, one Context ----------------------------------------

void Session::setup(const std::filesystem::path& model_dir, const SessionOptions& options) {
  Model model;
  model.setup(model_dir, options);
  Context context(model);
  model_ = std::move(model);
  context_ = std::move(context);
}

std::span<const float> Session::prefill(std::span<const int32_t> tokens, int start_pos,
                                        PrefillCapture* capture) {
  if (!context_.ready())
    throw Error("the session is not set up (setup() was not called or failed)");
  return context_.prefill(tokens, start_pos, capture);
}

std::span<const float> Session::decode_step(int32_t token, int pos) {
  if (!context_.ready())
    throw Error("the session is not set up (setup() was not called or failed)");
  return context_.decode_step(token, pos);
}

const ModelConfig& Session::config() const {
  return model_.config();
}
const Tokenizer& Session::tokenizer() const {
  return model_.tokenizer();
}
const ChatTemplate& Session::chat_template() const {
  return model_.chat_template();
}
Profiler& Session::profiler() {
  return model_.profiler();
}
int Session::max_context() const {
  return model_.max_context();
}
int Session::threads() const {
  return model_.threads();
}
size_t Session::weight_bytes() const {
  return model_.weight_bytes();
}

}  // namespace edgellm
