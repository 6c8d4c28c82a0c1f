// Embedding edgellm from C++: load a model once, open a context, stream a reply.
// Build against the installed package: see CMakeLists.txt beside this file.
#include <cstdio>
#include <iostream>

#include <edgellm/error.h>
#include <edgellm/generate.h>

int main(int argc, char** argv) try {
  if (argc < 2) return std::fprintf(stderr, "usage: %s <checkpoint dir> [prompt]\n", argv[0]), 2;
  edgellm::Model model;
  model.setup(argv[1]);             // once: map, validate, pack the weights, start the threads
  edgellm::Context context(model);  // one sequence: its KV cache
  const edgellm::ChatMessage user{"user", argc > 2 ? argv[2] : "What is the capital of France?"};
  const auto prompt = model.tokenizer().encode(model.chat_template().render({&user, 1}, true));
  edgellm::GenerateOptions options;
  options.max_tokens = 32;
  edgellm::generate(context, prompt, options, [](int32_t, std::string_view text) {
    std::cout << text << std::flush;
    return true;  // false stops the generation
  });
  std::cout << "\n";
} catch (const edgellm::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
