// The model store's rule (edgellm/model_store.h): $EDGELLM_MODELS, else the
// front end's default, else the per-user cache; the library bakes in no path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "edgellm/error.h"
#include "edgellm/model_store.h"

namespace edgellm {
namespace {

// Sets (or unsets, for nullopt) one environment variable for a test's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class ModelStoreTest : public ::testing::Test {
 protected:
  void TearDown() override { set_default_model_store({}); }
};

TEST_F(ModelStoreTest, UserCacheWhenNothingIsSet) {
  ScopedEnv models("EDGELLM_MODELS", std::nullopt), xdg("XDG_CACHE_HOME", std::nullopt),
      home("HOME", "/home/u");
  EXPECT_EQ(model_store(), "/home/u/.cache/edgellm/models");
  ScopedEnv xdg_set("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(model_store(), "/xdg/edgellm/models");
}

TEST_F(ModelStoreTest, FrontEndDefaultThenEnvironment) {
  ScopedEnv models("EDGELLM_MODELS", std::nullopt), xdg("XDG_CACHE_HOME", "/xdg");
  set_default_model_store("/repo/models");
  EXPECT_EQ(model_store(), "/repo/models");
  {
    ScopedEnv set("EDGELLM_MODELS", "/mine");
    EXPECT_EQ(model_store(), "/mine");
  }
  {
    ScopedEnv empty("EDGELLM_MODELS", "");  // set but empty: as if unset
    EXPECT_EQ(model_store(), "/repo/models");
  }
  set_default_model_store({});
  EXPECT_EQ(model_store(), "/xdg/edgellm/models");
}

TEST_F(ModelStoreTest, NoStoreAtAllIsOneError) {
  ScopedEnv models("EDGELLM_MODELS", std::nullopt), xdg("XDG_CACHE_HOME", std::nullopt),
      home("HOME", std::nullopt);
  EXPECT_THROW(model_store(), Error);
}

TEST(ModelPathTest, CheckpointDirAndId) {
  EXPECT_EQ(checkpoint_dir("/s/m/gguf/model.gguf"), "/s/m/gguf");
  EXPECT_EQ(checkpoint_dir("/s/m"), "/s/m");
  EXPECT_EQ(model_id("/s/smollm2-135m-instruct/gguf/model.gguf"), "smollm2-135m-instruct-gguf");
  EXPECT_EQ(model_id("/s/q4.gguf"), "q4");
  EXPECT_EQ(model_id("/s/m/"), "m");
}

}  // namespace
}  // namespace edgellm
