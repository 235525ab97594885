// Measured stage compute times: keys, the cache table, composition and their use in the plan
// (trainer/memory/stage_times.h).
#include "trainer/memory/stage_times.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "kernels/common/check.h"
#include "results/output_path.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"

namespace fp4moe {

namespace {

constexpr const char* kMagic = "# fp4moe plan stage times v1";
constexpr const char* kColumns = "gpu\tmodel\trecipe\tpolicy\tkind\tep\tmicro_batch\tseq_len\tseconds\tfailure";

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

bool parse_i64(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  v = x;
  return true;
}

bool parse_f64(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtod(s.c_str(), &end);
  return errno == 0 && *end == '\0';
}

// Throws unless the entry is one the table can hold (StageTimeCache::put's rules); `where` prefixes the message.
void check_entry(const StageTimeEntry& e, const std::string& where) {
  const StageTimeKey& k = e.key;
  for (const std::string* s : {&k.gpu, &k.model, &k.recipe, &k.policy, &e.failure})
    FP4MOE_CHECK(s->find_first_of("\t\n\r") == std::string::npos, "{}a field holds a tab or a line break: '{}'",
                 where, *s);
  for (const std::string* s : {&k.gpu, &k.model, &k.recipe, &k.policy})
    FP4MOE_CHECK(!s->empty(), "{}an empty gpu, model, recipe or policy", where);
  FP4MOE_CHECK(k.ep >= 1 && k.micro_batch >= 1 && k.seq_len >= 1,
               "{}ep, micro_batch and seq_len must be >= 1, got {}, {}, {}", where, k.ep, k.micro_batch, k.seq_len);
  FP4MOE_CHECK(std::isfinite(e.seconds) && e.seconds >= 0, "{}seconds must be a finite number >= 0, got {}", where,
               e.seconds);
  FP4MOE_CHECK(e.failure.empty() == (e.seconds > 0),
               "{}seconds {} with failure '{}': expected a time > 0 and no failure, or 0 and why it failed", where,
               e.seconds, e.failure);
}

const std::vector<std::string>& policy_modules(const std::string& label) {
  for (const PaperPolicy& p : paper_recompute_policies())
    if (p.label == label) return p.modules;
  FP4MOE_CHECK(false, "'{}' is not a paper recompute policy", label);
  static const std::vector<std::string> none;
  return none;
}

bool has_dense_layers(const TrainerConfig& cfg) { return cfg.model.n_dense_layers > 0; }
bool has_moe_layers(const TrainerConfig& cfg) { return cfg.model.n_dense_layers < cfg.model.layers; }

StageTimeKey key_of(const PlanRequest& r, const std::string& gpu, const PlanCandidate& c, LayerKind kind) {
  StageTimeKey k;
  k.gpu = gpu;
  k.model = model_shape_hash(r.model);
  k.recipe = kind == LayerKind::head ? "-" : recipe_name(c.recipe);
  k.policy = kind == LayerKind::head ? "-" : policy_key(policy_modules(c.policy));
  k.kind = kind;
  k.ep = kind == LayerKind::moe ? c.layout.ep : 1;
  k.micro_batch = r.micro_batch;
  k.seq_len = r.seq_len;
  return k;
}

// The keys one candidate needs: dense, moe, head (those its model has).
std::vector<StageTimeKey> candidate_keys(const PlanRequest& r, const std::string& gpu, const PlanCandidate& c) {
  std::vector<StageTimeKey> keys;
  if (has_dense_layers(r.model)) keys.push_back(key_of(r, gpu, c, LayerKind::dense));
  if (has_moe_layers(r.model)) keys.push_back(key_of(r, gpu, c, LayerKind::moe));
  keys.push_back(key_of(r, gpu, c, LayerKind::head));
  return keys;
}

bool same_cell(const PlanCandidate& a, const PlanCandidate& b) {
  return a.recipe == b.recipe && a.policy == b.policy && a.layout.name == b.layout.name;
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::dense: return "dense";
    case LayerKind::moe: return "moe";
    case LayerKind::head: return "head";
  }
  return "?";
}

std::string StageTimeKey::text() const {
  if (kind == LayerKind::head) return "LM head + final norm + loss";
  if (kind == LayerKind::moe) return fmt::format("{}, {}, moe layer ep {}", recipe, policy, ep);
  return fmt::format("{}, {}, dense layer", recipe, policy);
}

std::string model_shape_hash(const TrainerConfig& cfg) {
  TrainerConfig shape;
  shape.model = cfg.model;
  shape.model.name.clear();
  shape.moe = cfg.moe;
  std::string text = model_config_text(shape);  // the recipe lines then read bf16 whatever cfg's recipe
  text += fmt::format("moe.aux_alpha = {}\nmoe.bias_update_rate = {}\n", cfg.moe.aux_alpha, cfg.moe.bias_update_rate);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64, as model_config_hash
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

std::string policy_key(const std::vector<std::string>& modules) {
  return modules.empty() ? std::string("none") : fmt::format("{}", fmt::join(modules, " "));
}

StageTimeCache StageTimeCache::load(const std::string& path) {
  StageTimeCache cache(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    FP4MOE_CHECK(!std::filesystem::exists(path), "--cache '{}' cannot be read: {}", path, std::strerror(errno));
    return cache;
  }
  const std::string refuse = fmt::format("--cache '{}' is not a stage-time table of fp4moe plan", path);
  std::string line;
  FP4MOE_CHECK(std::getline(in, line) && line == kMagic, "{} (line 1 is not '{}'); name another file or remove it",
               refuse, kMagic);
  FP4MOE_CHECK(std::getline(in, line) && line == kColumns, "{} (line 2 is not the column names)", refuse);
  for (int64_t n = 3; std::getline(in, line); ++n) {
    if (line.empty()) continue;  // a blank line (an entry deleted by hand) holds nothing
    const std::string where = fmt::format("{} (line {}: ", refuse, n);
    const std::vector<std::string> f = split_tabs(line);
    FP4MOE_CHECK(f.size() == 10, "{}{} tab-separated fields, expected 10)", where, f.size());
    StageTimeEntry e;
    e.key.gpu = f[0];
    e.key.model = f[1];
    e.key.recipe = f[2];
    e.key.policy = f[3];
    if (f[4] == "dense") e.key.kind = LayerKind::dense;
    else if (f[4] == "moe") e.key.kind = LayerKind::moe;
    else if (f[4] == "head") e.key.kind = LayerKind::head;
    else FP4MOE_CHECK(false, "{}kind '{}', expected dense, moe or head)", where, f[4]);
    FP4MOE_CHECK(parse_i64(f[5], e.key.ep) && parse_i64(f[6], e.key.micro_batch) && parse_i64(f[7], e.key.seq_len) &&
                     parse_f64(f[8], e.seconds),
                 "{}ep, micro_batch, seq_len or seconds is not a number)", where);
    e.failure = f[9];
    try {
      check_entry(e, where);
    } catch (const Error&) {
      FP4MOE_CHECK(false, "{}a value out of range or seconds and failure that disagree)", where);
    }
    FP4MOE_CHECK(cache.find(e.key) == nullptr, "{}the key of an earlier line again)", where);
    cache.entries_.push_back(std::move(e));
  }
  return cache;
}

const StageTimeEntry* StageTimeCache::find(const StageTimeKey& key) const {
  for (const StageTimeEntry& e : entries_)
    if (e.key == key) return &e;
  return nullptr;
}

void StageTimeCache::put(StageTimeEntry entry) {
  check_entry(entry, "stage time: ");
  for (StageTimeEntry& e : entries_)
    if (e.key == entry.key) {
      e = std::move(entry);
      return;
    }
  entries_.push_back(std::move(entry));
}

std::string StageTimeCache::text() const {
  std::string s = fmt::format("{}\n{}\n", kMagic, kColumns);
  for (const StageTimeEntry& e : entries_) {
    const StageTimeKey& k = e.key;
    s += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.9g}\t{}\n", k.gpu, k.model, k.recipe, k.policy,
                     layer_kind_name(k.kind), k.ep, k.micro_batch, k.seq_len, e.seconds, e.failure);
  }
  return s;
}

void StageTimeCache::save() const {
  const std::string target = output_file_target(path_);
  const std::filesystem::path folder = std::filesystem::path(target).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  FP4MOE_CHECK(!ec, "--cache '{}': cannot create its folder: {}", path_, ec.message());
  const std::string tmp = fmt::format("{}.tmp-{}", target, static_cast<long>(::getpid()));
  const std::string body = text();
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  FP4MOE_CHECK(f != nullptr, "--cache '{}': cannot create '{}': {}", path_, tmp, std::strerror(errno));
  const bool written = std::fwrite(body.data(), 1, body.size(), f) == body.size() && std::fflush(f) == 0 &&
                       ::fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    FP4MOE_CHECK(false, "--cache '{}': cannot write it: {}", path_, why);
  }
}

std::vector<double> stage_compute_seconds(const TrainerConfig& cfg, const ParallelLayout& lay, double dense_s,
                                          double moe_s, double head_s) {
  for (double t : {dense_s, moe_s, head_s})
    FP4MOE_CHECK(std::isfinite(t) && t >= 0, "stage_compute_seconds: a layer time of {} s, expected >= 0", t);
  const std::vector<int64_t> counts = stage_layer_counts(cfg, lay);
  std::vector<double> out;
  int64_t first = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    double t = 0;
    for (int64_t l = first; l < first + counts[s]; ++l) t += cfg.is_moe_layer(l) ? moe_s : dense_s;
    if (s + 1 == counts.size()) t += head_s;
    out.push_back(t / static_cast<double>(lay.tp));
    first += counts[s];
  }
  return out;
}

std::vector<size_t> candidates_to_measure(const PlanResult& result, int64_t top) {
  FP4MOE_CHECK(top >= 1, "--measure-top must be >= 1, got {}", top);
  std::vector<size_t> out;
  std::vector<std::pair<Recipe, std::string>> policy_seen;
  std::vector<std::pair<Recipe, int64_t>> rank;
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const PlanCandidate& c = result.fitting[i];
    auto r = std::find_if(rank.begin(), rank.end(), [&](const auto& p) { return p.first == c.recipe; });
    if (r == rank.end()) r = rank.insert(rank.end(), {c.recipe, 0});
    const bool in_top = ++r->second <= top;
    const bool best_of_policy =
        std::find(policy_seen.begin(), policy_seen.end(), std::make_pair(c.recipe, c.policy)) == policy_seen.end();
    if (best_of_policy) policy_seen.emplace_back(c.recipe, c.policy);
    if (in_top || best_of_policy) out.push_back(i);
  }
  return out;
}

std::vector<StageTimeKey> keys_to_measure(const PlanResult& result, const std::vector<size_t>& selected,
                                          const PlanRequest& r, const std::string& gpu) {
  std::vector<StageTimeKey> layers, heads;
  for (size_t i : selected) {
    FP4MOE_CHECK(i < result.fitting.size(), "keys_to_measure: candidate {} of {}", i, result.fitting.size());
    for (const StageTimeKey& k : candidate_keys(r, gpu, result.fitting[i])) {
      std::vector<StageTimeKey>& to = k.kind == LayerKind::head ? heads : layers;
      if (std::find(to.begin(), to.end(), k) == to.end()) to.push_back(k);
    }
  }
  // Per (recipe, policy): dense before moe, eps ascending; the pairs in the order first met.
  std::vector<StageTimeKey> out;
  for (const StageTimeKey& k : layers) {
    const bool pair_done = std::any_of(out.begin(), out.end(), [&](const StageTimeKey& o) {
      return o.recipe == k.recipe && o.policy == k.policy;
    });
    if (pair_done) continue;
    std::vector<StageTimeKey> pair;
    for (const StageTimeKey& o : layers)
      if (o.recipe == k.recipe && o.policy == k.policy) pair.push_back(o);
    std::stable_sort(pair.begin(), pair.end(), [](const StageTimeKey& a, const StageTimeKey& b) {
      return std::make_pair(a.kind != LayerKind::dense, a.ep) < std::make_pair(b.kind != LayerKind::dense, b.ep);
    });
    out.insert(out.end(), pair.begin(), pair.end());
    if (!heads.empty() && out.size() == pair.size()) out.insert(out.begin() + 1, heads.front());
  }
  return out;
}

const StageTimeKey& head_base_key(const std::vector<StageTimeKey>& keys) {
  for (const StageTimeKey& k : keys)
    if (k.kind != LayerKind::head) return k;
  FP4MOE_CHECK(false, "head_base_key: no dense or moe key to measure the LM head against");
  return keys.front();
}

void apply_measured_times(PlanResult& result, const std::vector<size_t>& selected, const PlanRequest& r,
                          const StageTimeCache& cache, const std::string& gpu) {
  std::vector<PlanCandidate> updated;
  for (size_t i : selected) {
    FP4MOE_CHECK(i < result.fitting.size(), "apply_measured_times: candidate {} of {}", i, result.fitting.size());
    PlanCandidate c = result.fitting[i];
    double seconds[3] = {0, 0, 0};  // by LayerKind
    std::string missing;
    for (const StageTimeKey& k : candidate_keys(r, gpu, c)) {
      const StageTimeEntry* e = cache.find(k);
      if (e == nullptr) missing = fmt::format("{}: not measured", k.text());
      else if (!e->measured()) missing = fmt::format("{}: {}", k.text(), e->failure);
      else seconds[static_cast<int>(k.kind)] = e->seconds;
      if (!missing.empty()) break;
    }
    if (!missing.empty()) {
      c.compute_note = missing;
    } else {
      const TrainerConfig cfg = candidate_config(r, c.recipe, policy_modules(c.policy));
      const std::vector<double> compute = stage_compute_seconds(cfg, c.layout, seconds[0], seconds[1], seconds[2]);
      const std::vector<StageCost> costs = stage_costs(cfg, c.layout, r.hw);
      std::vector<StageTime> times;
      for (size_t s = 0; s < costs.size(); ++s) {
        StageTime t = stage_time(costs[s], r.hw);
        t.compute_s = compute[s];
        times.push_back(t);
      }
      c.step = predict_step(times, c.layout.micro_batches, c.layout.micro_batch * c.layout.seq_len, c.layout.tp);
      c.compute_source = c.layout.tp > 1 ? "measured/tp" : "measured";
      c.compute_note.clear();
    }
    updated.push_back(std::move(c));
  }
  for (const PlanCandidate& u : updated) {
    for (std::vector<PlanCandidate>* list : {&result.fitting, &result.all})
      for (PlanCandidate& c : *list)
        if (same_cell(c, u)) c = u;
  }
  rank_candidates(result.fitting);
}

}  // namespace fp4moe
