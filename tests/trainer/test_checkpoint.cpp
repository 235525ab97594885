// Checkpoints (trainer/checkpoint.h): round trip of tensors and state, the documented byte layout, atomic
// replacement (an I/O error in the middle of a write, provoked with a file-size limit in a child process, leaves
// the previous checkpoint intact and no temporary file), and each rejection on reading, naming the file; the parts
// of a checkpoint over ranks (format version 2: part, rank, world size; the ranks section), their invalid parts,
// the shards' paths, which latest_checkpoint never takes for a checkpoint.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/data/token_shard.h"
#include "trainer/train/resume.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_file(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
uint64_t u64_at(const std::vector<uint8_t>& b, size_t off) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[off + i]) << (8 * i);
  return v;
}
void put_u32(std::vector<uint8_t>& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
void reseal_header(std::vector<uint8_t>& b) { put_u32(b, 252, crc32(b.data(), 252)); }

// Seeded tensors of several dtypes and shapes, in both sections; the same name in both sections is allowed.
struct Fixture {
  std::vector<uint16_t> w_bf16;  // [3, 5]
  std::vector<float> w_f32;      // [7]
  std::vector<float> m_f32;      // optimizer [3, 5]
  std::vector<int64_t> scalar;   // []
  std::vector<uint8_t> empty;    // [0, 4]
  CheckpointState state;

  explicit Fixture(uint32_t seed, size_t f32_count = 7) : w_bf16(15), w_f32(f32_count), m_f32(15), scalar(1) {
    std::mt19937 rng(seed);
    for (auto& v : w_bf16) v = static_cast<uint16_t>(rng());
    for (auto& v : w_f32) v = std::uniform_real_distribution<float>(-3, 3)(rng);
    for (auto& v : m_f32) v = std::uniform_real_distribution<float>(0, 1)(rng);
    scalar[0] = static_cast<int64_t>(rng());
    state.config_hash = 0x1234567890ABCDEFull ^ rng();
    state.step = 1000 + rng() % 1000;
    state.optimizer_steps = state.step - 3;
    state.tokens_seen = state.step * 8192;
    state.rng = {rng(), rng()};
    state.data_loader = {rng(), 2, 77, 4096, 0xDEADBEEF};
    state.config_text = "model.hidden = 64\nrecipe.routed_experts = mxfp4\n";
  }
  std::vector<CheckpointTensorView> views() const {
    return {{CheckpointSection::model, "layers.0.attn.q_a", CheckpointDtype::bf16, {3, 5}, w_bf16.data()},
            {CheckpointSection::model, "final_norm", CheckpointDtype::f32, {static_cast<int64_t>(w_f32.size())},
             w_f32.data()},
            {CheckpointSection::optimizer, "layers.0.attn.q_a", CheckpointDtype::f32, {3, 5}, m_f32.data()},
            {CheckpointSection::optimizer, "adam_step", CheckpointDtype::i64, {}, scalar.data()},
            {CheckpointSection::model, "empty", CheckpointDtype::u8, {0, 4}, nullptr}};
  }
  uint32_t write(const std::string& path) const {
    const auto v = views();
    return write_checkpoint(path, state, v);
  }
};

TEST(Checkpoint, RoundTripsTensorsAndState) {
  test::TempDir dir;
  const Fixture fx(11);
  const std::string path = dir.file(checkpoint_file_name(fx.state.step));
  fx.write(path);

  const CheckpointReader r(path, fx.state.config_hash);
  const CheckpointState& s = r.state();
  EXPECT_EQ(s.config_hash, fx.state.config_hash);
  EXPECT_EQ(s.step, fx.state.step);
  EXPECT_EQ(s.optimizer_steps, fx.state.optimizer_steps);
  EXPECT_EQ(s.tokens_seen, fx.state.tokens_seen);
  EXPECT_EQ(s.rng, fx.state.rng);
  EXPECT_EQ(s.data_loader, fx.state.data_loader);
  EXPECT_EQ(s.config_text, fx.state.config_text);
  ASSERT_EQ(r.entries().size(), 5u);

  std::vector<uint16_t> bf16(15, 0xFFFF);
  r.read(CheckpointSection::model, "layers.0.attn.q_a", CheckpointDtype::bf16, {3, 5}, bf16.data(), 30);
  EXPECT_EQ(bf16, fx.w_bf16);
  std::vector<float> f32(7, NAN);
  r.read(CheckpointSection::model, "final_norm", CheckpointDtype::f32, {7}, f32.data(), 28);
  EXPECT_EQ(f32, fx.w_f32);
  std::vector<float> m(15, NAN);
  r.read(CheckpointSection::optimizer, "layers.0.attn.q_a", CheckpointDtype::f32, {3, 5}, m.data(), 60);
  EXPECT_EQ(m, fx.m_f32);
  int64_t step = -1;
  r.read(CheckpointSection::optimizer, "adam_step", CheckpointDtype::i64, {}, &step, 8);
  EXPECT_EQ(step, fx.scalar[0]);
  r.read(CheckpointSection::model, "empty", CheckpointDtype::u8, {0, 4}, nullptr, 0);
  EXPECT_EQ(r.find(CheckpointSection::model, "adam_step"), nullptr);

  // Expected hash 0 accepts any configuration.
  EXPECT_NO_THROW(CheckpointReader(path, 0));
}

TEST(Checkpoint, FileFollowsTheDocumentedLayout) {
  test::TempDir dir;
  const Fixture fx(12);
  const std::string path = dir.file("a.ckpt");
  fx.write(path);
  const std::vector<uint8_t> b = read_file(path);
  ASSERT_GE(b.size(), 256u);
  EXPECT_EQ(std::memcmp(b.data(), "FP4MCKPT", 8), 0);
  EXPECT_EQ(u64_at(b, 8) & 0xFFFFFFFFu, 1u);    // format_version
  EXPECT_EQ(u64_at(b, 8) >> 32, 256u);          // header_bytes
  EXPECT_EQ(u64_at(b, 16), fx.state.config_hash);
  EXPECT_EQ(u64_at(b, 24), fx.state.step);
  EXPECT_EQ(u64_at(b, 48), fx.state.rng.seed);
  const auto loader = fx.state.data_loader.to_bytes();
  EXPECT_EQ(std::memcmp(b.data() + 64, loader.data(), 48), 0);
  EXPECT_EQ(u64_at(b, 112) & 0xFFFFFFFFu, 5u);  // entry_count
  EXPECT_EQ(u64_at(b, 136), b.size());          // file_bytes
  EXPECT_EQ(u64_at(b, 128) % 64, 0u);           // data_offset aligned
  EXPECT_EQ(b.size() % 64, 0u);
  EXPECT_EQ(crc32(b.data(), 252), static_cast<uint32_t>(u64_at(b, 248) >> 32));
  // The configuration text follows the header.
  EXPECT_EQ(std::string(b.begin() + 256, b.begin() + 256 + fx.state.config_text.size()), fx.state.config_text);
  // The first tensor's bytes sit at data_offset.
  EXPECT_EQ(std::memcmp(b.data() + u64_at(b, 128), fx.w_bf16.data(), 30), 0);
}

TEST(Checkpoint, ReplacesAtomicallyAndLeavesThePreviousFileOnError) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt");
  const Fixture old_fx(21);
  old_fx.write(path);
  const std::vector<uint8_t> old_bytes = read_file(path);

  // A rejected write (duplicate name) touches nothing.
  auto dup = old_fx.views();
  dup.push_back(dup.front());
  expect_error_with([&] { write_checkpoint(path, old_fx.state, dup); }, {path, "appears twice"});
  EXPECT_EQ(read_file(path), old_bytes);

  // An I/O error in the middle of the data: a child process writes a larger checkpoint under a file-size limit
  // smaller than it (write fails with EFBIG once the limit is reached).
  const Fixture big(22, 1 << 16);  // 256 KiB of f32
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 64 * 1024;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(4);
    int code = 3;
    try {
      big.write(path);
      code = 1;  // the write should not have succeeded
    } catch (const Error& e) {
      code = std::string(e.what()).find("failed") != std::string::npos ? 0 : 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 4) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE to 64 KiB here (hard limit below it)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the limited write succeeded; 2: unexpected message";
  EXPECT_EQ(read_file(path), old_bytes);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "ckpt") << "left behind: " << e.path();
  }
  EXPECT_EQ(files, 1u);

  // Without the limit, the new checkpoint replaces the old one.
  big.write(path);
  const CheckpointReader r(path, big.state.config_hash);
  EXPECT_EQ(r.state().step, big.state.step);
  std::vector<float> f(big.w_f32.size());
  r.read(CheckpointSection::model, "final_norm", CheckpointDtype::f32, {1 << 16}, f.data(), f.size() * 4);
  EXPECT_EQ(f, big.w_f32);
}

TEST(Checkpoint, RejectsBadWrites) {
  test::TempDir dir;
  const Fixture fx(31);
  auto views = fx.views();
  const std::string path = dir.file("x.ckpt");
  auto with = [&](auto edit) {
    auto v = fx.views();
    edit(v);
    return [&, v] { write_checkpoint(path, fx.state, v); };
  };
  expect_error_with(with([](auto& v) { v[0].name = ""; }), {path, "1..4096 bytes"});
  expect_error_with(with([](auto& v) { v[0].shape = {-1, 5}; }), {path, "layers.0.attn.q_a", "dimensions must be >= 0"});
  expect_error_with(with([](auto& v) { v[1].data = nullptr; }), {path, "final_norm", "has no data"});
  expect_error_with(with([](auto& v) { v[1].dtype = static_cast<CheckpointDtype>(99); }), {path, "unknown dtype"});
  const std::string nowhere = dir.file("no/such/folder/x.ckpt");
  expect_error_with([&] { write_checkpoint(nowhere, fx.state, views); }, {nowhere, "does not exist"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Checkpoint, RejectsBadFilesNamingThem) {
  test::TempDir dir;
  const Fixture fx(41);
  const std::string good = dir.file("good.ckpt");
  fx.write(good);
  const std::vector<uint8_t> bytes = read_file(good);
  const uint64_t hash = fx.state.config_hash;
  auto variant = [&](const std::string& name, auto edit) {
    std::vector<uint8_t> b = bytes;
    edit(b);
    const std::string p = dir.file(name);
    write_file(p, b);
    return p;
  };

  const std::string missing = dir.file("missing.ckpt");
  expect_error_with([&] { CheckpointReader(missing, hash); }, {missing, "cannot open"});
  const std::string tiny = variant("tiny.ckpt", [](auto& b) { b.resize(100); });
  expect_error_with([&] { CheckpointReader(tiny, hash); }, {tiny, "shorter than the 256-byte header"});
  const std::string cut = variant("cut.ckpt", [](auto& b) { b.pop_back(); });
  expect_error_with([&] { CheckpointReader(cut, hash); }, {cut, "truncated"});
  const std::string extra = variant("extra.ckpt", [](auto& b) { b.push_back(0); });
  expect_error_with([&] { CheckpointReader(extra, hash); }, {extra, "trailing bytes"});
  const std::string magic = variant("magic.ckpt", [](auto& b) { b[0] = 'X'; });
  expect_error_with([&] { CheckpointReader(magic, hash); }, {magic, "wrong magic"});
  const std::string version = variant("version.ckpt", [](auto& b) {
    b[8] = 2;
    reseal_header(b);
  });
  expect_error_with([&] { CheckpointReader(version, hash); }, {version, "format version 2"});
  const std::string version3 = variant("version3.ckpt", [](auto& b) {
    b[8] = 3;
    reseal_header(b);
  });
  expect_error_with([&] { CheckpointReader(version3, hash); }, {version3, "format version 3", "versions 1 and 2"});
  const std::string header = variant("header.ckpt", [](auto& b) { b[24] ^= 1; });  // step, CRC not resealed
  expect_error_with([&] { CheckpointReader(header, hash); }, {header, "header CRC mismatch"});
  const std::string index = variant("index.ckpt", [](auto& b) { b[260] ^= 0x40; });  // in the config text
  expect_error_with([&] { CheckpointReader(index, hash); }, {index, "index CRC mismatch"});
  expect_error_with([&] { CheckpointReader(good, hash ^ 1); }, {good, "configuration hash", "differ"});

  // A flipped tensor byte is found when that tensor is read.
  const uint64_t data_offset = u64_at(bytes, 128);
  const std::string data = variant("data.ckpt", [&](auto& b) { b[data_offset + 3] ^= 0x10; });
  const CheckpointReader r(data, hash);
  std::vector<uint16_t> w(15);
  expect_error_with([&] { r.read(CheckpointSection::model, "layers.0.attn.q_a", CheckpointDtype::bf16, {3, 5}, w.data(), 30); },
                    {data, "layers.0.attn.q_a", "CRC mismatch"});

  // Reads that do not match the stored tensor.
  const CheckpointReader g(good, hash);
  std::vector<float> f(15);
  expect_error_with([&] { g.read(CheckpointSection::model, "nope", CheckpointDtype::f32, {1}, f.data(), 4); },
                    {good, "no tensor 'nope' in section model"});
  expect_error_with([&] { g.read(CheckpointSection::model, "final_norm", CheckpointDtype::bf16, {7}, f.data(), 14); },
                    {good, "final_norm", "is f32 [7], expected bf16 [7]"});
  expect_error_with([&] { g.read(CheckpointSection::model, "final_norm", CheckpointDtype::f32, {8}, f.data(), 32); },
                    {good, "is f32 [7], expected f32 [8]"});
  expect_error_with([&] { g.read(CheckpointSection::model, "final_norm", CheckpointDtype::f32, {7}, f.data(), 60); },
                    {good, "28 bytes, the buffer 60"});
}

TEST(Checkpoint, PartsOverRanksRecordPartRankAndWorldSize) {
  test::TempDir dir;
  Fixture fx(51);
  // One GPU's whole model: version 1, bytes 148..251 zero, the returned CRC the header's.
  const std::string whole = dir.file("whole.ckpt");
  const uint32_t whole_crc = fx.write(whole);
  const std::vector<uint8_t> w = read_file(whole);
  EXPECT_EQ(u64_at(w, 8) & 0xFFFFFFFFu, 1u);
  for (size_t i = 148; i < 252; ++i) EXPECT_EQ(w[i], 0) << "byte " << i;
  EXPECT_EQ(whole_crc, static_cast<uint32_t>(u64_at(w, 248) >> 32));
  const CheckpointReader rw(whole, 0);
  EXPECT_EQ(rw.header_crc32(), whole_crc);
  EXPECT_EQ(rw.state().part, CheckpointPart::whole);
  EXPECT_EQ(rw.state().rank, 0u);
  EXPECT_EQ(rw.state().world_size, 1u);

  // Rank 0's replicated file of 4 ranks with a ranks-section tensor: version 2, part 1, rank 0, world size 4.
  fx.state.part = CheckpointPart::replicated;
  fx.state.world_size = 4;
  const std::vector<uint64_t> crcs = {0x11111111, 0x22222222, 0xFFFFFFFF, 0};
  auto v = fx.views();
  v.push_back({CheckpointSection::ranks, "shard_header_crc32", CheckpointDtype::u64, {4}, crcs.data()});
  const std::string rep = dir.file("rep.ckpt");
  const uint32_t rep_crc = write_checkpoint(rep, fx.state, v);
  const std::vector<uint8_t> b = read_file(rep);
  EXPECT_EQ(u64_at(b, 8) & 0xFFFFFFFFu, 2u);
  EXPECT_EQ(u64_at(b, 144) >> 32, 1u);                // part
  EXPECT_EQ(u64_at(b, 152), uint64_t{4} << 32);       // rank 0, world_size 4
  EXPECT_EQ(rep_crc, static_cast<uint32_t>(u64_at(b, 248) >> 32));
  const CheckpointReader r(rep, fx.state.config_hash);
  EXPECT_EQ(r.state().part, CheckpointPart::replicated);
  EXPECT_EQ(r.state().rank, 0u);
  EXPECT_EQ(r.state().world_size, 4u);
  EXPECT_EQ(r.header_crc32(), rep_crc);
  std::vector<uint64_t> back(4);
  r.read(CheckpointSection::ranks, "shard_header_crc32", CheckpointDtype::u64, {4}, back.data(), 32);
  EXPECT_EQ(back, crcs);

  // Rank 3's shard.
  fx.state.part = CheckpointPart::expert_shard;
  fx.state.rank = 3;
  const std::string shard = dir.file("shard.ckpt");
  fx.write(shard);
  const CheckpointReader s(shard, 0);
  EXPECT_EQ(s.state().part, CheckpointPart::expert_shard);
  EXPECT_EQ(s.state().rank, 3u);
  EXPECT_EQ(s.state().world_size, 4u);
  EXPECT_NE(s.header_crc32(), rep_crc);
}

TEST(Checkpoint, RejectsInvalidParts) {
  test::TempDir dir;
  const std::string path = dir.file("p.ckpt");
  auto write_as = [&](CheckpointPart part, uint32_t rank, uint32_t world_size) {
    Fixture fx(61);
    fx.state.part = part;
    fx.state.rank = rank;
    fx.state.world_size = world_size;
    return [fx, &path] { fx.write(path); };
  };
  expect_error_with(write_as(CheckpointPart::whole, 0, 2), {path, "rank 0 of 2", "expected the whole model"});
  expect_error_with(write_as(CheckpointPart::whole, 1, 1), {path, "rank 1 of 1"});
  expect_error_with(write_as(CheckpointPart::replicated, 0, 1), {path, "part 1, rank 0 of 1"});
  expect_error_with(write_as(CheckpointPart::expert_shard, 2, 2), {path, "part 2, rank 2 of 2"});
  expect_error_with(write_as(static_cast<CheckpointPart>(9), 0, 2), {path, "part 9"});
  // The ranks section belongs to parts over ranks only.
  const Fixture fx(62);
  auto v = fx.views();
  const uint64_t one = 1;
  v.push_back({CheckpointSection::ranks, "shard_header_crc32", CheckpointDtype::u64, {1}, &one});
  expect_error_with([&] { write_checkpoint(path, fx.state, v); }, {path, "shard_header_crc32", "has section 2"});
  EXPECT_FALSE(std::filesystem::exists(path));

  // A version 2 header whose part, rank or world size is not a part over ranks, CRC resealed.
  Fixture shard_fx(63);
  shard_fx.state.part = CheckpointPart::expert_shard;
  shard_fx.state.rank = 1;
  shard_fx.state.world_size = 2;
  shard_fx.write(path);
  std::vector<uint8_t> b = read_file(path);
  put_u32(b, 152, 2);  // rank 2 of 2
  reseal_header(b);
  write_file(path, b);
  expect_error_with([&] { CheckpointReader(path, 0); }, {path, "format version 2", "rank 2 of 2", "not a valid part"});
}

TEST(Checkpoint, ShardPathsBesideTheReplicatedFileAreNeverTakenForCheckpoints) {
  EXPECT_EQ(checkpoint_shard_path("ckpt/step_00000012.ckpt", 3, 8), "ckpt/step_00000012.rank_3_of_8.ckpt");
  EXPECT_EQ(checkpoint_shard_path(checkpoint_file_name(7), 0, 2), "step_00000007.rank_0_of_2.ckpt");
  expect_error_with([] { checkpoint_shard_path("ckpt/step_00000012", 0, 2); }, {"ckpt/step_00000012", "<name>.ckpt"});
  expect_error_with([] { checkpoint_shard_path(".ckpt", 0, 2); }, {"<name>.ckpt"});
  // Shards of a later step whose replicated file was never written: latest_checkpoint keeps the complete one.
  test::TempDir dir;
  const Fixture fx(71);
  const std::string complete = dir.file(checkpoint_file_name(12));
  fx.write(complete);
  fx.write(checkpoint_shard_path(dir.file(checkpoint_file_name(13)), 0, 2));
  fx.write(checkpoint_shard_path(dir.file(checkpoint_file_name(13)), 1, 2));
  EXPECT_EQ(latest_checkpoint(dir.path().string()), complete);
}

}  // namespace
}  // namespace fp4moe
