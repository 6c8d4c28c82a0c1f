// Gemma 3 270M on the CPU: the deployment descriptor. The GGUF on PyPI is the
// base model (no chat template), so prompts are sentence starts fed as raw
// text. The program's flow is the shared one in llms/common/inference_driver.cpp.
#include "inference_driver.h"

int main(int argc, char** argv) {
  const edgellm::Deployment deployment{
      .name = "gemma3_270m",
      // gguf: the Q4_K_M file itself, run quantized (config and tokenizer from beside it).
      .models = {{"base", "gemma3-270m"}, {"gguf", "gemma3-270m/model.gguf"}},
      .default_model = "base",
      .default_prompt =
          "The capital of Germany is Berlin. The capital of Italy is Rome. The capital of France "
          "is",
  };
  return edgellm::run_inference_main(deployment, argc, argv);
}
