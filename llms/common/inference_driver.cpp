#include "inference_driver.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "chat_repl.h"
#include "deployment.h"
#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "edgellm/json_grammar.h"
#include "edgellm/session.h"
#include "profile_report.h"
#include "progress.h"

namespace edgellm {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

using Options = InferenceOptions;

// What one run measured.
struct Figures {
  size_t prompt_tokens = 0;
  int answer_tokens = 0;  // up to (not counting) EOS
  bool hit_eos = false;
  bool hit_stop = false;          // a --stop string ended the answer
  bool hit_document_end = false;  // --json-schema / --json-object: the document is complete
  double setup_ms = 0, ttft_ms = 0, decode_ms = 0;
  int decode_steps = 0;
  double tps() const { return decode_steps > 0 ? decode_steps * 1000.0 / decode_ms : 0.0; }
};

std::string fmt_number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.ends_with('.')) s.pop_back();
  return s;
}

// A numeric option's check whose message reads "must be >= 1 (got 0)".
template <class T>
CLI::Validator in_range(T lo, std::optional<T> hi = std::nullopt) {
  const std::string range = hi ? "in [" + fmt_number(static_cast<double>(lo)) + ", " +
                                     fmt_number(static_cast<double>(*hi)) + "]"
                               : ">= " + fmt_number(static_cast<double>(lo));
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        T value{};
        const bool negative_unsigned = std::is_unsigned_v<T> && text.find('-') != std::string::npos;
        if (negative_unsigned || !CLI::detail::lexical_cast(text, value))
          return std::string("must be ") + (std::is_integral_v<T> ? "an integer" : "a number") +
                 " " + range + " (got " + text + ")";
        if (!(value >= lo) || (hi && !(value <= *hi)))
          return "must be " + range + " (got " + text + ")";
        return "";
      },
      range);
}

std::vector<int32_t> prompt_tokens(const Session& session, const Options& opt,
                                   PromptFormat format) {
  if (format == PromptFormat::chat) {
    std::vector<ChatMessage> messages;
    if (!opt.system.empty()) messages.push_back({"system", opt.system});
    messages.push_back({"user", opt.prompt});
    return encode_conversation(session.tokenizer(), session.chat_template(), messages, true);
  }
  return session.tokenizer().encode(opt.prompt, /*add_special_tokens=*/true);
}

// -f: the file's text, less one trailing newline (as llama.cpp's -f reads it).
std::string read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in && !std::filesystem::is_directory(path), "--file " + path + ": cannot read it");
  std::ostringstream text;
  text << in.rdbuf();
  std::string prompt = text.str();
  if (prompt.ends_with('\n')) prompt.pop_back();
  check(!prompt.empty(), "--file " + path + ": the prompt file is empty");
  return prompt;
}

// --json-schema's value: JSON text when it starts with '{' (or is true / false),
// else the path of a file holding it; --json-object: any JSON object.
std::shared_ptr<const JsonGrammar> output_grammar(const Options& opt) {
  if (opt.json_object) return any_json_object();
  if (opt.json_schema.empty()) return nullptr;
  const std::string& v = opt.json_schema;
  const size_t first = v.find_first_not_of(" \t\r\n");
  const bool inline_json =
      (first != std::string::npos && v[first] == '{') || v == "true" || v == "false";
  std::string text = v;
  if (!inline_json) {
    std::ifstream in(v, std::ios::binary);
    if (!in || std::filesystem::is_directory(v))
      throw JsonSchemaError("file", "cannot read the file " + v);
    std::ostringstream content;
    content << in.rdbuf();
    text = content.str();
  }
  return compile_json_schema(text);
}

// The process's resident set now and at its peak (VmRSS, VmHWM), in bytes; 0 where
// /proc cannot say. The peak is what a model too large for a second copy must keep low.
struct ResidentMemory {
  size_t now = 0, peak = 0;
};
ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    size_t* field = line.starts_with("VmRSS:")   ? &m.now
                    : line.starts_with("VmHWM:") ? &m.peak
                                                 : nullptr;
    if (field) *field = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "  123 kB"
  }
  return m;
}

void print_figures(const Options& opt, const Figures& f, const Session& session, std::FILE* err) {
  std::fprintf(err, "\nprompt tokens:    %zu\n", f.prompt_tokens);
  std::fprintf(err, "answer tokens:    %d (%s)\n", f.answer_tokens,
               f.hit_eos            ? "ended at EOS"
               : f.hit_document_end ? "ended with the JSON document"
               : f.hit_stop         ? "ended at a --stop string"
                                    : "reached --n-tokens");
  std::fprintf(err, "setup:            %.1f ms (untimed: load, pack, allocate; %d threads)\n",
               f.setup_ms, session.threads());
  std::fprintf(err, "arithmetic:       %s\n", describe_exec_config(session.exec_config()).c_str());
  std::fprintf(err, "KV cache:         %s, %.1f MB for %d positions\n",
               session.kv_cache_dtype().c_str(), session.kv_cache_bytes() / 1e6,
               session.max_context());
  const ResidentMemory mem = resident_memory();
  std::fprintf(err, "resident memory:  %.1f MB (peak %.1f MB)\n", mem.now / 1e6, mem.peak / 1e6);
  std::fprintf(err, "TTFT (prefill):   %.1f ms\n", f.ttft_ms);
  std::fprintf(err, "TPS (decode):     %.2f tokens/s over %d decode steps (%.2f ms/token)\n",
               f.tps(), f.decode_steps, f.decode_steps > 0 ? f.decode_ms / f.decode_steps : 0.0);
  const char* where = f.hit_eos            ? "EOS"
                      : f.hit_document_end ? "the JSON document's end"
                                           : "the stop string";
  if ((f.hit_eos || f.hit_stop || f.hit_document_end) && opt.ignore_eos)
    std::fprintf(err, "                  (decoding went on past %s, unprinted, for the timing)\n",
                 where);
  else if (f.decode_steps + 1 < opt.n_tokens)
    std::fprintf(err,
                 "                  (generation stopped early at %s: TPS over %d steps only; "
                 "--ignore-eos times all %d)\n",
                 where, f.decode_steps, opt.n_tokens - 1);
}

void print_json(const Options& opt, const Figures& f, const Session& session,
                const std::string& deployment, const std::string& answer) {
  const ResidentMemory mem = resident_memory();
  nlohmann::json j = {
      {"deployment", deployment},
      {"model", opt.model},
      {"answer", answer},
      {"prompt_tokens", f.prompt_tokens},
      {"answer_tokens", f.answer_tokens},
      {"stopped_at_eos", f.hit_eos},
      {"stopped_at_stop_string", f.hit_stop},
      {"stopped_at_document_end", f.hit_document_end},
      {"setup_ms", f.setup_ms},
      {"ttft_ms", f.ttft_ms},
      {"decode_steps", f.decode_steps},
      {"decode_ms", f.decode_ms},
      {"tokens_per_s", f.tps()},
      {"threads", session.threads()},
      {"isa", std::string(kernels::isa_name(session.exec_config().isa))},
      {"precision", describe_exec_config(session.exec_config())},
      {"kv_cache_dtype", session.kv_cache_dtype()},
      {"kv_cache_bytes", session.kv_cache_bytes()},
      {"resident_bytes", mem.now},
      {"peak_resident_bytes", mem.peak},
      {"temperature", opt.sampling.temperature},
  };
  if (opt.sampling.temperature > 0) j["seed"] = opt.sampling.seed;
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

int run_inference(const Deployment& deployment, Options opt, InferenceMode mode) {
  if (opt.chat) mode = InferenceMode::chat;
  std::shared_ptr<const JsonGrammar> grammar;
  try {
    grammar = output_grammar(opt);  // before setup: a refused schema costs no model load
  } catch (const JsonSchemaError& e) {
    std::string message = e.what();
    if (message.starts_with("response_format: ")) message.erase(0, 17);
    std::fprintf(stderr, "error: --json-schema: %s\n", message.c_str());
    return 2;
  }
  if (mode == InferenceMode::bench) opt.ignore_eos = true;  // TPS over all --n-tokens
  if (!opt.prompt_file.empty()) opt.prompt = read_prompt_file(opt.prompt_file);
  check(mode == InferenceMode::chat || !opt.prompt.empty(),
        "--prompt is empty (leave PROMPT unset for the default prompt)");
  if (opt.sampling.temperature > 0) {
    if (!opt.seed) {
      opt.seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
      std::fprintf(stderr, "sampling with a random seed %llu (--seed / SEED= repeats this run)\n",
                   static_cast<unsigned long long>(*opt.seed));
    }
    opt.sampling.seed = *opt.seed;
  }

  // ---- setup: ONE-TIME, outside the timed region ---------------------------
  const auto setup_start = Clock::now();
  const std::filesystem::path model_dir = deployment.resolve_model(opt.model);
  const PromptFormat format = deployment.prompt_format_for(model_dir, opt.model, opt.raw);
  check(opt.system.empty() || format == PromptFormat::chat,
        "--system needs the chat template, and this checkpoint takes raw text (a base model, "
        "or --raw)");
  Session session;
  SessionOptions so;
  so.threads = opt.threads;
  so.max_context = opt.max_context;
  so.profile = opt.profile;
  so.weights = opt.weights;
  so.kv_cache = opt.kv_cache;
  if (opt.exact) so.precision = "exact";
  session.setup(model_dir, with_environment_defaults(so));
  Figures f;
  f.setup_ms = ms_since(setup_start);
  if (mode == InferenceMode::chat) {
    GenerateOptions chat;
    chat.sampling = opt.sampling;
    chat.stop_strings = opt.stop;
    chat.grammar = grammar;  // every reply
    LineReader reader(std::cin, std::cout);
    run_chat(session, chat, opt.n_tokens, format == PromptFormat::chat, opt.system, reader,
             std::cout);
    return 0;
  }
  const std::vector<int32_t> prompt = prompt_tokens(session, opt, format);
  f.prompt_tokens = prompt.size();
  check(prompt.size() < static_cast<size_t>(session.max_context()),
        "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
            std::to_string(session.max_context()) +
            " tokens (raise --max-context or shorten --prompt)");
  const int room = session.max_context() - static_cast<int>(prompt.size());
  if (opt.n_tokens > room) {
    std::fprintf(stderr, "note: --n-tokens %d capped at %d by the context of %d positions\n",
                 opt.n_tokens, room, session.max_context());
    opt.n_tokens = room;
  }
  GenerateOptions go;
  go.max_tokens = opt.n_tokens;
  go.sampling = opt.sampling;
  go.stop_strings = opt.stop;
  // The answer ends at EOS (or a stop string); with --ignore-eos decoding goes
  // on, unseen, so TPS is timed over all --n-tokens.
  go.decode_past_stop = opt.ignore_eos;
  go.lookup = !opt.no_lookup;
  go.grammar = grammar;
  std::string answer;
  // The note's thread starts before the clock; the first token's callback
  // (after TTFT is taken, before the decode clock starts) joins it.
  std::optional<Progress> note(std::in_place,
                               "prefill of " + std::to_string(prompt.size()) + " tokens");
  auto on_token = [&](int32_t token, std::string_view text) {
    note.reset();
    f.hit_eos = f.hit_eos || session.config().is_eos(token);  // the stop step carries its token
    answer += text;
    if (!opt.json && mode == InferenceMode::run) std::cout << text << std::flush;
    return true;
  };

  // ---- timed region (inside generate()): prefill + decode loop -------------
  const GenerateResult r = generate(session.context(), prompt, go, on_token);
  // ---------------------------------------------------------------------------
  note.reset();
  f.ttft_ms = r.ttft_ms;
  f.decode_ms = r.decode_ms;
  f.decode_steps = r.decode_steps;
  f.answer_tokens = static_cast<int>(r.tokens.size());
  // Under a grammar a complete document that nothing may extend ends the answer
  // too ("stop" without EOS); a --stop string cuts it short of one.
  f.hit_document_end =
      grammar && r.finish == FinishReason::stop && !f.hit_eos && nlohmann::json::accept(answer);
  f.hit_stop = r.finish == FinishReason::stop && !f.hit_eos && !f.hit_document_end;

  if (opt.json) {
    print_json(opt, f, session, deployment.name, answer);
  } else if (mode == InferenceMode::bench) {
    print_figures(opt, f, session, stdout);
  } else {
    std::cout << std::endl;
    print_figures(opt, f, session, stderr);
  }
  if (opt.profile) print_profile(session, prompt.size(), f.decode_steps);
  return 0;
}

void add_arithmetic_options(CLI::App& cmd, std::string& kv_cache, bool& exact) {
  cmd.add_option("--kv-cache", kv_cache,
                 "KV cache element type: fp32, bf16 or q8_0 (default: EDGELLM_KV_CACHE, else "
                 "the precision's: fast bf16, exact fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "q8_0"}));
  cmd.add_flag("--exact", exact,
               "the gate's exact fp32 arithmetic instead of the fast default (EDGELLM_PRECISION="
               "exact)");
}

void add_inference_options(CLI::App& cmd, Options& opt, const Deployment& deployment,
                           InferenceMode mode) {
  opt.model = deployment.default_model;
  opt.prompt = deployment.default_prompt;
  opt.max_context = deployment.max_context;
  cmd.add_option("-m,--model", opt.model,
                 "checkpoint: a choice of the deployment, a checkpoint directory or a .gguf file "
                 "in one")
      ->capture_default_str();
  if (mode != InferenceMode::chat) {
    CLI::Option* prompt =
        cmd.add_option("-p,--prompt", opt.prompt, "prompt text")->capture_default_str();
    cmd.add_option("-f,--file", opt.prompt_file,
                   "read the prompt from this file (less one trailing newline)")
        ->excludes(prompt);
  }
  cmd.add_option("--system", opt.system,
                 "system message before the prompt (checkpoints with a chat template)");
  cmd.add_option("-n,--n-tokens,--n-predict", opt.n_tokens,
                 mode == InferenceMode::chat ? "most tokens per reply" : "tokens to generate")
      ->check(in_range(1))
      ->capture_default_str();
  cmd.add_option("-t,--threads", opt.threads, "worker threads (0 = all cores)")->check(in_range(0));
  cmd.add_option("-c,--max-context,--ctx-size", opt.max_context, "KV cache positions")
      ->check(in_range(1))
      ->capture_default_str();
  cmd.add_option("--weights", opt.weights,
                 "quantize a bf16 checkpoint's matrices at setup (GGUF files run as stored)")
      ->check(CLI::IsMember({"q8_0", "q4_0"}));
  add_arithmetic_options(cmd, opt.kv_cache, opt.exact);
  cmd.add_flag("--raw", opt.raw, "feed the prompt as raw text, without the chat template");
  cmd.add_option("--temperature,--temp", opt.sampling.temperature, "0 = greedy")
      ->check(in_range(0.0f))
      ->capture_default_str();
  cmd.add_option("--top-k", opt.sampling.top_k, "sample among the k most likely (0 = off)")
      ->check(in_range(0));
  cmd.add_option("--top-p", opt.sampling.top_p, "nucleus sampling mass (1 = off)")
      ->check(in_range(0.0f, std::optional(1.0f)));
  cmd.add_option("--min-p", opt.sampling.min_p,
                 "keep tokens at least this fraction as likely as the top one (0 = off)")
      ->check(in_range(0.0f, std::optional(1.0f)));
  cmd.add_option("-s,--seed", opt.seed, "sampling seed (default: a random one, printed)")
      ->check(in_range<uint64_t>(0));
  cmd.add_option("--stop", opt.stop,
                 "end the answer before this text (repeatable; also each chat reply)")
      ->take_all()
      ->allow_extra_args(false);
  if (mode != InferenceMode::bench) {
    // llama.cpp's -j / --json-schema; --json is taken (the figures as JSON).
    CLI::Option* schema = cmd.add_option(
        "-j,--json-schema", opt.json_schema,
        "structured output: the answer is a document of this JSON schema (JSON text, or a file "
        "holding it); what cannot be enforced is refused");
    cmd.add_flag("--json-object", opt.json_object,
                 "structured output: the answer is a JSON object (OpenAI's json_object)")
        ->excludes(schema);
  }
  if (mode == InferenceMode::chat) return;
  cmd.add_flag("--json", opt.json, "print the answer and the figures as one JSON object");
  cmd.add_flag("--profile", opt.profile, "print the per-phase and per-kernel time breakdown");
  cmd.add_flag("--no-lookup", opt.no_lookup,
               "greedy decoding without prompt-lookup drafts (same output, for timing)");
  if (mode == InferenceMode::bench) return;
  cmd.add_flag("--ignore-eos", opt.ignore_eos,
               "keep decoding past EOS (unprinted) so TPS is timed over all --n-tokens");
  cmd.add_flag("--chat", opt.chat, "interactive chat, as `edgellm chat`");
}

}  // namespace edgellm
