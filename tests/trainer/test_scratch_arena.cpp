// The layers' shared scratch (trainer/memory/scratch.h) and the recompute flags (trainer/model/recompute.h), without a
// device: a measuring arena, and an arena over host memory (its pointers are only compared, never dereferenced by a
// kernel). Run: fp4moe_tests_cpu --gtest_filter='ScratchArena*:LayerRecompute*'
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/recompute.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

// 256-byte aligned host memory for an arena of `bytes`.
struct HostBlock {
  explicit HostBlock(size_t bytes) : raw(bytes + ScratchArena::kAlign) {
    const auto addr = reinterpret_cast<uintptr_t>(raw.data());
    base = raw.data() + (ScratchArena::kAlign - addr % ScratchArena::kAlign) % ScratchArena::kAlign;
  }
  std::vector<unsigned char> raw;
  unsigned char* base;
};

TEST(ScratchArena, TakesAreAlignedRoundedAndStackedInOrder) {
  HostBlock block(4096);
  ScratchArena a(block.base, 4096);
  EXPECT_FALSE(a.measuring());
  EXPECT_EQ(a.capacity(), 4096u);
  auto* x = a.take<float>(3, "x");          // 12 bytes -> 256
  auto* y = a.take<uint16_t>(200, "y");     // 400 bytes -> 512
  auto* z = a.take<unsigned char>(256, "z");  // exactly 256
  EXPECT_EQ(reinterpret_cast<unsigned char*>(x), block.base);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(y), block.base + 256);
  EXPECT_EQ(z, block.base + 768);
  EXPECT_EQ(a.used(), 1024u);
  EXPECT_EQ(a.high_water(), 1024u);
  EXPECT_EQ(a.take<float>(0, "nothing"), nullptr);  // n = 0 takes nothing
  EXPECT_EQ(a.used(), 1024u);
  EXPECT_EQ(ScratchArena::rounded(0), 0u);
  EXPECT_EQ(ScratchArena::rounded(1), 256u);
  EXPECT_EQ(ScratchArena::rounded(257), 512u);
}

TEST(ScratchArena, ScopesGiveBackWhatTheyTookInnermostFirst) {
  HostBlock block(4096);
  ScratchArena a(block.base, 4096);
  a.take<float>(64, "outer");  // 256
  {
    ScratchScope layer(a);
    unsigned char* p = a.take<unsigned char>(512, "layer");
    {
      ScratchScope inner(a);
      a.take<unsigned char>(1024, "inner");
      EXPECT_EQ(a.used(), 256u + 512u + 1024u);
    }
    EXPECT_EQ(a.used(), 256u + 512u);
    // What an inner scope gave back is handed out again at the same place.
    ScratchScope again(a);
    EXPECT_EQ(a.take<unsigned char>(1, "again"), p + 512);
  }
  EXPECT_EQ(a.used(), 256u);
  EXPECT_EQ(a.high_water(), 256u + 512u + 1024u);
  a.reset_high_water();
  EXPECT_EQ(a.high_water(), 256u);
  // A mark that is no longer on the stack is rejected.
  ScratchArena::Mark stale;
  {
    ScratchScope s(a);
    a.take<float>(1, "gone");
    stale = a.mark();
  }
  expect_error_with([&] { a.release(stale); }, {"not on the stack"});
}

TEST(ScratchArena, StampsLiveUntilTheirScopeEnds) {
  HostBlock block(2048);
  ScratchArena a(block.base, 2048);
  EXPECT_FALSE(a.alive(0));
  uint64_t left = 0, inner = 0;
  {
    ScratchScope caller(a);
    a.take<float>(10, "left in the caller's scope");
    left = a.stamp();
    EXPECT_TRUE(a.alive(left));
    {
      ScratchScope callee(a);
      a.take<float>(10, "callee");
      inner = a.stamp();
      EXPECT_TRUE(a.alive(left) && a.alive(inner));
    }
    EXPECT_TRUE(a.alive(left));
    EXPECT_FALSE(a.alive(inner));
    // A new take at the released place does not revive the old stamp.
    a.take<float>(10, "reused");
    EXPECT_FALSE(a.alive(inner));
  }
  EXPECT_FALSE(a.alive(left));
  EXPECT_EQ(a.used(), 0u);
}

TEST(ScratchArena, OverflowNamesTheTakeAndTheLiveOnes) {
  HostBlock block(1024);
  ScratchArena a(block.base, 1024);
  a.take<float>(100, "MLA d q");  // 512
  const std::string msg = test::error_message([&] { a.take<float>(200, "MLA d k"); });
  EXPECT_NE(msg.find("MLA d k"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MLA d q: 512 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds 1024 bytes"), std::string::npos) << msg;
  EXPECT_EQ(a.used(), 512u) << "a rejected take changes nothing";
  expect_error_with([&] { a.take<float>(-1, "negative"); }, {"negative", "-1"});
}

TEST(ScratchArena, MeasuringCountsWithoutMemoryOrLimit) {
  ScratchArena m;
  EXPECT_TRUE(m.measuring());
  EXPECT_EQ(m.take<float>(1 << 20, "big"), nullptr);
  {
    ScratchScope s(m);
    m.take<unsigned char>(1, "small");
    EXPECT_EQ(m.used(), (size_t{4} << 20) + 256);
  }
  EXPECT_EQ(m.used(), size_t{4} << 20);
  EXPECT_EQ(m.high_water(), (size_t{4} << 20) + 256);
  EXPECT_EQ(m.capacity(), 0u);
}

TEST(ScratchArena, RejectsANullOrMisalignedBase) {
  HostBlock block(1024);
  expect_error_with([&] { ScratchArena a(nullptr, 256); }, {"non-null base"});
  expect_error_with([&] { ScratchArena a(block.base + 16, 256); }, {"aligned to 256"});
  ScratchArena empty(nullptr, 0);  // nothing to hand out: allowed
  EXPECT_EQ(empty.take<float>(0, "nothing"), nullptr);
  expect_error_with([&] { empty.take<float>(1, "one"); }, {"one", "holds 0 bytes"});
}

TEST(LayerRecompute, FlagsOfEachModule) {
  auto flags = [](std::vector<std::string> modules) {
    RecomputeConfig rc;
    rc.modules = std::move(modules);
    return layer_recompute(rc);
  };
  const LayerRecompute none = flags({});
  EXPECT_FALSE(none.full || none.norms || none.mla.any() || none.dense_mlp || none.moe.whole || none.moe.act ||
               none.moe.shared_experts);

  const LayerRecompute up = flags({"mla_up_proj"});
  EXPECT_TRUE(up.mla.up_proj);
  EXPECT_FALSE(up.mla.core_attn || up.mla.norms || up.mla.whole || up.norms);

  const LayerRecompute core = flags({"core_attn"});
  EXPECT_TRUE(core.mla.core_attn);
  EXPECT_FALSE(core.mla.up_proj || core.mla.norms);

  const LayerRecompute ln = flags({"layernorm"});
  EXPECT_TRUE(ln.norms && ln.mla.norms);
  EXPECT_FALSE(ln.mla.up_proj || ln.mla.core_attn || ln.mla.whole || ln.full);

  const LayerRecompute act = flags({"moe_act"});
  EXPECT_TRUE(act.moe.act);
  EXPECT_FALSE(act.moe.whole || act.moe.shared_experts);

  const LayerRecompute moe = flags({"moe"});
  EXPECT_TRUE(moe.moe.whole && moe.moe.shared_experts);
  EXPECT_FALSE(moe.dense_mlp || moe.mla.any() || moe.norms);

  const LayerRecompute mlp = flags({"mlp"});
  EXPECT_TRUE(mlp.dense_mlp);
  EXPECT_FALSE(mlp.moe.whole || mlp.moe.shared_experts);

  const LayerRecompute shared = flags({"shared_experts"});
  EXPECT_TRUE(shared.moe.shared_experts);
  EXPECT_FALSE(shared.moe.whole || shared.moe.act || shared.dense_mlp);

  const LayerRecompute full = flags({"full"});
  EXPECT_TRUE(full.full && full.norms && full.mla.whole && full.mla.norms && full.mla.up_proj &&
              full.mla.core_attn && full.dense_mlp && full.moe.whole && full.moe.shared_experts);

  const LayerRecompute combo = flags({"core_attn", "layernorm", "moe"});
  EXPECT_TRUE(combo.mla.core_attn && combo.norms && combo.mla.norms && combo.moe.whole);
  EXPECT_FALSE(combo.mla.up_proj || combo.full || combo.mla.whole || combo.dense_mlp);
}

}  // namespace
}  // namespace fp4moe
