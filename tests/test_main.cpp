// The main of every test binary: gtest's, plus the listener that gives each test its base seed
// (AB_TEST_SEED or a fresh one, see test_support.h) and prints it when the test fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>

#include "core/rng.h"
#include "test_support.h"

namespace {

class SeedListener final : public ::testing::EmptyTestEventListener {
 public:
  explicit SeedListener(std::optional<std::uint64_t> fixed) : fixed_(fixed) {}

  void OnTestStart(const ::testing::TestInfo&) override {
    ab::test::test_seeds() = {fixed_.value_or(ab::fresh_seed()), 0};
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ab::test::TestSeeds& s = ab::test::test_seeds();
    if (info.result()->Failed() && s.drawn > 0)
      std::printf("[   SEED   ] %s.%s: AB_TEST_SEED=%llu replays its random inputs (%llu seed(s) drawn)\n",
                  info.test_suite_name(), info.name(), static_cast<unsigned long long>(s.base),
                  static_cast<unsigned long long>(s.drawn));
  }

 private:
  std::optional<std::uint64_t> fixed_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::optional<std::uint64_t> fixed;
  try {
    fixed = ab::test::seed_from_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedListener(fixed));
  return RUN_ALL_TESTS();
}
