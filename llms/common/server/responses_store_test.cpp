// The Responses store's bounds (responses_store.h): a count and a byte budget,
// the least recently used (put or read) evicted first.
#include "responses_store.h"

#include <gtest/gtest.h>

#include <string>

namespace edgellm::responses {
namespace {

// Items whose JSON text is exactly `bytes` long: ["xxx..."].
nlohmann::ordered_json items_of(size_t bytes) {
  return nlohmann::ordered_json::array({std::string(bytes - 4, 'x')});
}

TEST(ResponsesStore, EvictsTheLeastRecentlyUsedPastTheCount) {
  Store store(3, 1 << 20);
  for (const char* id : {"a", "b", "c"}) store.put(id, items_of(10));
  ASSERT_TRUE(store.get("a"));  // read: now the most recent, "b" the least
  store.put("d", items_of(10));
  EXPECT_FALSE(store.get("b"));
  for (const char* id : {"a", "c", "d"}) EXPECT_TRUE(store.get(id)) << id;
}

TEST(ResponsesStore, EvictsPastTheByteBudget) {
  Store store(100, 100);
  store.put("a", items_of(40));
  store.put("b", items_of(40));
  ASSERT_TRUE(store.get("a"));
  store.put("c", items_of(40));  // 120 bytes: the least recent ("b") goes
  EXPECT_FALSE(store.get("b"));
  EXPECT_TRUE(store.get("a"));
  EXPECT_TRUE(store.get("c"));
  store.put("d", items_of(100));  // exactly the budget: everything else goes
  EXPECT_FALSE(store.get("a"));
  EXPECT_FALSE(store.get("c"));
  EXPECT_TRUE(store.get("d"));
}

TEST(ResponsesStore, KeepsOneEntryLargerThanTheBudgetAlone) {
  Store store(100, 100);
  store.put("a", items_of(40));
  store.put("big", items_of(500));
  EXPECT_FALSE(store.get("a"));
  ASSERT_TRUE(store.get("big"));
  EXPECT_EQ(store.get("big")->at(0).get<std::string>().size(), 496u);
  store.put("b", items_of(40));  // the next put evicts it
  EXPECT_FALSE(store.get("big"));
  EXPECT_TRUE(store.get("b"));
}

}  // namespace
}  // namespace edgellm::responses
