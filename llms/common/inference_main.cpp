// The inference program of one deployment: CMake builds one per
// llms/<name>/deployment.json, naming it in EDGELLM_DEPLOYMENT. Everything a
// deployment decides is in that descriptor; the flow is inference_driver.cpp.
#include "inference_driver.h"

int main(int argc, char** argv) {
  return edgellm::run_inference_main(EDGELLM_DEPLOYMENT, argc, argv);
}
