// Llama-3.2-1B on the CPU: the deployment descriptor. `fixture` is a seeded
// random-initialised checkpoint of the real config (make fixture); pass
// --model /path/to/Llama-3.2-1B(-Instruct) for the real weights.
#include "inference_driver.h"

int main(int argc, char** argv) {
  const edgellm::Deployment deployment{
      .name = "llama32_1b",
      .models = {{"fixture", "llama32-1b-fixture"}},
      .default_model = "fixture",
      .default_prompt = "What is the capital of France? Answer in one sentence.",
  };
  return edgellm::run_inference_main(deployment, argc, argv);
}
