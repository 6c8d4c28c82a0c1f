// SmolLM2-135M-Instruct on the CPU: the deployment descriptor. The program's
// flow (setup once, then the timed prefill + decode loop) is the shared one in
// llms/common/inference_driver.cpp; this file holds only what differs.
#include "inference_driver.h"

int main(int argc, char** argv) {
  const edgellm::Deployment deployment{
      .name = "smollm2_135m",
      // gguf: the Q4_1 file itself, run quantized (config and tokenizer from beside it).
      .models = {{"instruct", "smollm2-135m-instruct"},
                 {"gguf", "smollm2-135m-instruct/model.gguf"}},
      .default_model = "instruct",
      .default_prompt = "What is the capital of France? Answer in one sentence.",
  };
  return edgellm::run_inference_main(deployment, argc, argv);
}
