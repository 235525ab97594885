// HDF5 result files (results/): tables and arrays round-trip through the HDF5 C API with their types and
// attributes, writes are atomic (no final and no temporary file after a failure), errors name what failed.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "results/h5_file.h"
#include "results/h5_read.h"
#include "results/run_info.h"
#include "results/table.h"
#include "tests/common/temp_dir.h"

namespace fs = std::filesystem;
using namespace fp4moe;

namespace {

class ResultsH5 : public ::testing::Test {
 protected:
  test::TempDir tmp_;  // before dir_: members are made in this order
  fs::path dir_ = tmp_.path();
  // Every entry of the test directory (to catch leftover temporary files).
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
};

std::string read_string_attr(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  EXPECT_GE(a, 0) << "attribute " << name;
  hid_t t = H5Aget_type(a);
  EXPECT_EQ(H5Tget_class(t), H5T_STRING) << name;
  EXPECT_GT(H5Tis_variable_str(t), 0) << name << " must be a variable-length string";
  EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8) << name;
  hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_size(mt, H5T_VARIABLE);
  H5Tset_cset(mt, H5T_CSET_UTF8);
  char* p = nullptr;
  EXPECT_GE(H5Aread(a, mt, &p), 0);
  std::string s = p ? p : "";
  H5free_memory(p);
  H5Tclose(mt);
  H5Tclose(t);
  H5Aclose(a);
  return s;
}

template <typename T>
T read_scalar_attr(hid_t obj, const char* name, hid_t mem_type, H5T_class_t expect_class) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  EXPECT_GE(a, 0) << "attribute " << name;
  hid_t t = H5Aget_type(a);
  EXPECT_EQ(H5Tget_class(t), expect_class) << name;
  EXPECT_EQ(H5Tget_size(t), sizeof(T)) << name;
  T v{};
  EXPECT_GE(H5Aread(a, mem_type, &v), 0);
  H5Tclose(t);
  H5Aclose(a);
  return v;
}

std::vector<std::string> read_string_list_attr(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  EXPECT_GE(a, 0);
  hid_t s = H5Aget_space(a);
  std::vector<char*> ptrs(static_cast<size_t>(H5Sget_simple_extent_npoints(s)));
  EXPECT_EQ(H5Sget_simple_extent_ndims(s), 1);
  hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_size(mt, H5T_VARIABLE);
  H5Tset_cset(mt, H5T_CSET_UTF8);
  if (!ptrs.empty()) {
    EXPECT_GE(H5Aread(a, mt, ptrs.data()), 0);
  }
  std::vector<std::string> out;
  for (char* p : ptrs) {
    out.emplace_back(p ? p : "");
    H5free_memory(p);
  }
  H5Tclose(mt);
  H5Sclose(s);
  H5Aclose(a);
  return out;
}

// Reads a 1-D or N-D numeric dataset, checking its HDF5 class and element size; returns the shape in `dims`.
template <typename T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, hid_t mem_type, H5T_class_t cls,
                            std::vector<hsize_t>* dims) {
  hid_t ds = H5Dopen2(loc, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(ds, 0) << name;
  hid_t t = H5Dget_type(ds);
  EXPECT_EQ(H5Tget_class(t), cls) << name;
  EXPECT_EQ(H5Tget_size(t), sizeof(T)) << name;
  hid_t s = H5Dget_space(ds);
  dims->assign(static_cast<size_t>(H5Sget_simple_extent_ndims(s)), 0);
  H5Sget_simple_extent_dims(s, dims->data(), nullptr);
  std::vector<T> v(static_cast<size_t>(H5Sget_simple_extent_npoints(s)));
  if (!v.empty()) {
    EXPECT_GE(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  }
  H5Sclose(s);
  H5Tclose(t);
  H5Dclose(ds);
  return v;
}

std::vector<std::string> read_string_dataset(hid_t loc, const std::string& name) {
  hid_t ds = H5Dopen2(loc, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(ds, 0) << name;
  hid_t t = H5Dget_type(ds);
  EXPECT_EQ(H5Tget_class(t), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(t), 0);
  EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8);
  hid_t s = H5Dget_space(ds);
  EXPECT_EQ(H5Sget_simple_extent_ndims(s), 1);
  std::vector<char*> ptrs(static_cast<size_t>(H5Sget_simple_extent_npoints(s)));
  hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_size(mt, H5T_VARIABLE);
  H5Tset_cset(mt, H5T_CSET_UTF8);
  if (!ptrs.empty()) {
    EXPECT_GE(H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), 0);
  }
  std::vector<std::string> out;
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  if (!ptrs.empty()) {
    hid_t space = H5Dget_space(ds);
    H5Dvlen_reclaim(mt, space, H5P_DEFAULT, ptrs.data());
    H5Sclose(space);
  }
  H5Tclose(mt);
  H5Sclose(s);
  H5Tclose(t);
  H5Dclose(ds);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected fp4moe::Error";
  return {};
}

}  // namespace

TEST(ResultsTable, RejectsWrongShapesAndTypes) {
  Table t;
  t.add_column("case", ColumnType::str).add_column("time_us", ColumnType::f64).add_column("n", ColumnType::i64);
  t.add_row({"copy", 1.5, 3});
  t.add_row({"x", int64_t{7}, int64_t{-2}});  // an int64 in a float64 column converts exactly
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.column("time_us").f64[1], 7.0);

  EXPECT_NE(error_of([&] { t.add_row({"copy", 1.5}); }).find("has 2 values, expected one per column (3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.add_row({"copy", 1.5, 2.5}); }).find("column 'n': got a float64 value, expected int64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.add_row({1.0, 1.5, 2}); }).find("column 'case': got a float64 value, expected string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.add_row({"a", int64_t{1} << 54, 2}); }).find("not exact in float64"), std::string::npos);
  EXPECT_EQ(t.rows(), 2) << "a rejected row must leave the table unchanged";
  EXPECT_EQ(t.column("case").str.size(), 2u);
  EXPECT_NE(error_of([&] { t.add_column("late", ColumnType::f64); }).find("after 2 rows"), std::string::npos);
  Table u;
  u.add_column("a", ColumnType::f64);
  EXPECT_NE(error_of([&] { u.add_column("a", ColumnType::i64); }).find("duplicate table column 'a'"), std::string::npos);
  EXPECT_NE(error_of([&] { u.add_column("a/b", ColumnType::i64); }).find("must not hold '/'"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)u.column("zz"); }).find("no table column 'zz' (columns: a)"), std::string::npos);
}

TEST_F(ResultsH5, TableAndArrayRoundTripThroughTheCApi) {
  std::mt19937_64 rng(20260131);
  std::normal_distribution<double> normal(0.0, 100.0);
  std::uniform_int_distribution<int64_t> ints(-(int64_t{1} << 62), int64_t{1} << 62);
  const int rows = 37;
  std::vector<std::string> names;
  std::vector<double> times;
  std::vector<int64_t> counts;
  Table t;
  t.add_column("case", ColumnType::str).add_column("time_us", ColumnType::f64).add_column("bytes", ColumnType::i64);
  for (int i = 0; i < rows; ++i) {
    names.push_back(i == 0 ? "" : i == 1 ? "µs ≤ 2⁻⁶ — Grüße" : "case_" + std::to_string(rng() % 100000));
    times.push_back(i == 2 ? std::nan("") : i == 3 ? -INFINITY : normal(rng));
    counts.push_back(ints(rng));
    t.add_row({names.back(), times.back(), counts.back()});
  }
  t.set_attribute("recipe", "mxfp4").set_attribute("steps", int64_t{1000}).set_attribute("lr", 3e-4);

  std::vector<uint8_t> codes(3 * 10);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  std::vector<float> deq(2 * 5);
  for (auto& v : deq) v = static_cast<float>(normal(rng));

  ResultFile f;
  f.set_attribute("schema_version", int64_t{1});
  f.set_attribute("git_sha", "0123abcd");
  f.set_attribute("git_sha", "feedbeef");  // replaced, not duplicated
  f.set_attribute("ratio", 0.25);
  f.add_table("/bench/quant", t);
  f.add_array("/codes", {3, 10}, codes, {{"layout", "mxfp4 row"}});
  f.add_array("/deep/group/dequantized", {2, 5}, deq);
  const std::string path = (dir_ / "out.h5").string();
  f.write(path);
  EXPECT_EQ(entries(), std::vector<std::string>{"out.h5"}) << "the temporary file must be gone after the rename";

  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t root = H5Gopen2(file, "/", H5P_DEFAULT);
  EXPECT_EQ(H5Aget_num_attrs(root), 3);
  EXPECT_EQ((read_scalar_attr<int64_t>(root, "schema_version", H5T_NATIVE_INT64, H5T_INTEGER)), 1);
  EXPECT_EQ(read_string_attr(root, "git_sha"), "feedbeef");
  EXPECT_EQ((read_scalar_attr<double>(root, "ratio", H5T_NATIVE_DOUBLE, H5T_FLOAT)), 0.25);

  hid_t g = H5Gopen2(file, "/bench/quant", H5P_DEFAULT);
  ASSERT_GE(g, 0);
  EXPECT_EQ(read_string_list_attr(g, "columns"), (std::vector<std::string>{"case", "time_us", "bytes"}));
  EXPECT_EQ(read_string_attr(g, "recipe"), "mxfp4");
  EXPECT_EQ((read_scalar_attr<int64_t>(g, "steps", H5T_NATIVE_INT64, H5T_INTEGER)), 1000);
  EXPECT_EQ((read_scalar_attr<double>(g, "lr", H5T_NATIVE_DOUBLE, H5T_FLOAT)), 3e-4);
  EXPECT_EQ(read_string_dataset(g, "case"), names);
  std::vector<hsize_t> dims;
  auto t_back = read_dataset<double>(g, "time_us", H5T_NATIVE_DOUBLE, H5T_FLOAT, &dims);
  EXPECT_EQ(dims, std::vector<hsize_t>{rows});
  ASSERT_EQ(t_back.size(), times.size());
  for (int i = 0; i < rows; ++i) {
    if (std::isnan(times[i])) {
      EXPECT_TRUE(std::isnan(t_back[i]));
    } else {
      EXPECT_EQ(t_back[i], times[i]) << "row " << i;
    }
  }
  EXPECT_EQ((read_dataset<int64_t>(g, "bytes", H5T_NATIVE_INT64, H5T_INTEGER, &dims)), counts);
  H5Gclose(g);

  EXPECT_EQ((read_dataset<uint8_t>(file, "/codes", H5T_NATIVE_UINT8, H5T_INTEGER, &dims)), codes);
  EXPECT_EQ(dims, (std::vector<hsize_t>{3, 10}));
  hid_t cds = H5Dopen2(file, "/codes", H5P_DEFAULT);
  EXPECT_EQ(read_string_attr(cds, "layout"), "mxfp4 row");
  H5Dclose(cds);
  EXPECT_EQ((read_dataset<float>(file, "/deep/group/dequantized", H5T_NATIVE_FLOAT, H5T_FLOAT, &dims)), deq);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 5}));
  H5Gclose(root);
  H5Fclose(file);

  // The same file through the library's reader (used by `fp4moe quantize` for its input).
  H5Reader r(path);
  EXPECT_EQ(r.datasets(), (std::vector<std::string>{"bench/quant/bytes", "bench/quant/case",
                                                    "bench/quant/time_us", "codes", "deep/group/dequantized"}));
  EXPECT_TRUE(r.has_dataset("/codes"));
  EXPECT_FALSE(r.has_dataset("bench"));
  auto info = r.info("deep/group/dequantized");
  EXPECT_EQ(info.type, "float32");
  EXPECT_EQ(info.shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(r.info("codes").type, "uint8");
  EXPECT_EQ(r.info("bench/quant/case").type, "string");
  auto as_f64 = r.read_f64("deep/group/dequantized");
  for (size_t i = 0; i < deq.size(); ++i) EXPECT_EQ(as_f64[i], static_cast<double>(deq[i]));
  EXPECT_EQ(r.string_attribute("codes", "layout"), std::optional<std::string>("mxfp4 row"));
  EXPECT_EQ(r.string_attribute("/", "git_sha"), std::optional<std::string>("feedbeef"));
  EXPECT_EQ(r.string_attribute("codes", "absent"), std::nullopt);
  EXPECT_NE(error_of([&] { (void)r.read_f64("bench/quant/case"); }).find("holds string, expected numbers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)r.info("nope"); }).find("no dataset 'nope'"), std::string::npos);
}

TEST_F(ResultsH5, EmptyTableKeepsItsColumns) {
  Table t;
  t.add_column("step", ColumnType::i64).add_column("loss", ColumnType::f64).add_column("note", ColumnType::str);
  ResultFile f;
  f.add_table("/train/run0", t);
  const std::string path = (dir_ / "empty.h5").string();
  f.write(path);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t g = H5Gopen2(file, "/train/run0", H5P_DEFAULT);
  EXPECT_EQ(read_string_list_attr(g, "columns"), (std::vector<std::string>{"step", "loss", "note"}));
  std::vector<hsize_t> dims;
  EXPECT_TRUE((read_dataset<int64_t>(g, "step", H5T_NATIVE_INT64, H5T_INTEGER, &dims)).empty());
  EXPECT_EQ(dims, std::vector<hsize_t>{0});
  EXPECT_TRUE(read_string_dataset(g, "note").empty());
  H5Gclose(g);
  H5Fclose(file);
}

TEST_F(ResultsH5, FailedWriteLeavesNeitherFinalNorTemporaryFile) {
  // "/a" gets a column dataset "b"; the table "/a/b" then cannot become a group: HDF5 fails mid-write, after
  // the temporary file was created and partly filled.
  Table t1, t2;
  t1.add_column("b", ColumnType::f64).add_row({1.0});
  t2.add_column("c", ColumnType::f64).add_row({2.0});
  ResultFile f;
  f.set_attribute("git_sha", "x");
  f.add_table("/a", t1);
  f.add_table("/a/b", t2);
  const std::string path = (dir_ / "broken.h5").string();
  std::string msg = error_of([&] { f.write(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("creating table group '/a/b'"), std::string::npos) << msg;
  EXPECT_TRUE(entries().empty()) << "left behind: " << (entries().empty() ? "" : entries()[0]);

  // An existing file at the destination survives a failed write unchanged.
  { std::ofstream(path) << "previous contents"; }
  (void)error_of([&] { f.write(path); });
  EXPECT_EQ(entries(), std::vector<std::string>{"broken.h5"});
  std::ifstream in(path);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(back, "previous contents");
}

TEST_F(ResultsH5, FolderDestinationIsRefusedBeforeAnythingIsWritten) {
  ResultFile f;
  f.set_attribute("git_sha", "x");
  const fs::path target = dir_ / "is_a_directory";
  fs::create_directories(target);  // rename() would replace an empty directory (results/output_path.h refuses it)
  std::string msg = error_of([&] { f.write(target.string()); });
  EXPECT_NE(msg.find("'" + target.string() + "' is a folder"), std::string::npos) << msg;
  EXPECT_EQ(entries(), std::vector<std::string>{"is_a_directory"});
  EXPECT_TRUE(fs::is_directory(target));
}

TEST_F(ResultsH5, UnwritableDirectoryIsAClearError) {
  ResultFile f;
  f.set_attribute("git_sha", "x");
  const std::string missing = (dir_ / "no" / "such" / "dir" / "out.h5").string();
  std::string msg = error_of([&] { f.write(missing); });
  EXPECT_NE(msg.find("writing result file '" + missing + "' failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot create temporary file"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  EXPECT_TRUE(entries().empty());

  if (::geteuid() != 0) {
    const fs::path ro = dir_ / "read_only";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    msg = error_of([&] { f.write((ro / "out.h5").string()); });
    EXPECT_NE(msg.find((ro / "out.h5").string()), std::string::npos) << msg;
    fs::permissions(ro, fs::perms::owner_all);
    EXPECT_TRUE(fs::is_empty(ro));
  } else if (fs::exists("/proc/self")) {
    // Permissions do not stop root; procfs refuses new files to everyone.
    msg = error_of([&] { f.write("/proc/fp4moe_results_test.h5"); });
    EXPECT_NE(msg.find("/proc/fp4moe_results_test.h5"), std::string::npos) << msg;
  }
}

TEST(ResultsFile, RejectsBadPathsAndShapes) {
  ResultFile f;
  Table t;
  t.add_column("x", ColumnType::f64);
  EXPECT_NE(error_of([&] { f.add_table("bench/quant", t); }).find("must be absolute"), std::string::npos);
  EXPECT_NE(error_of([&] { f.add_table("/bench//quant", t); }).find("empty, '.' or '..' component"),
            std::string::npos);
  f.add_table("/bench/quant", t);
  EXPECT_NE(error_of([&] { f.add_table("/bench/quant", t); }).find("already added"), std::string::npos);
  EXPECT_NE(error_of([&] { f.add_array("/codes", {2, 3}, std::vector<uint8_t>(5)); })
                .find("shape [2, 3] holds 6 elements, got 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.write(""); }).find("empty output path"), std::string::npos);
}

TEST(ResultsRunInfo, RootAttributesAndCommandLine) {
  const char* argv[] = {"fp4moe", "quantize", "--input", "my file.h5", "it's", "--seed=3"};
  EXPECT_EQ(command_line(6, argv), "fp4moe quantize --input 'my file.h5' 'it'\\''s' --seed=3");
  EXPECT_TRUE(std::regex_match(utc_timestamp(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << utc_timestamp();
  std::string sha = source_git_sha();
  EXPECT_TRUE(sha == "unknown" || std::regex_match(sha, std::regex("[0-9a-f]{40}"))) << sha;

  EnvInfo env;
  env.driver = "570.86.15 (CUDA 12.8)";
  env.cuda_runtime = "13.0";
  env.cublaslt = "13.1.0";
  env.nccl = "2.28.9";
  env.host = "node7";
  ResultFile f;
  fill_root_attributes(f, "fp4moe bench quant", env);
  std::vector<std::string> names;
  for (const auto& [n, v] : f.attributes()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"schema_version", "git_sha", "date", "gpu", "driver", "cuda", "cublaslt",
                                             "nccl", "host", "command"}));
  EXPECT_EQ(std::get<int64_t>(f.attributes()[0].second), 1);
  EXPECT_EQ(std::get<std::string>(f.attributes()[3].second), "none");
  EXPECT_EQ(std::get<std::string>(f.attributes()[4].second), "570.86.15 (CUDA 12.8)");
  EXPECT_EQ(std::get<std::string>(f.attributes()[9].second), "fp4moe bench quant");

  env.gpus = {GpuInfo{0, "NVIDIA H200", 9, 0, 132, 0, 0}, GpuInfo{1, "NVIDIA H200", 9, 0, 132, 0, 0}};
  EXPECT_EQ(gpu_summary(env), "NVIDIA H200 x2");
}

TEST(ResultsEnvInfo, LibraryVersionsWithOrWithoutADevice) {
  EnvInfo env = query_env_info();
  EXPECT_TRUE(std::regex_match(env.cuda_runtime, std::regex(R"(\d+\.\d+)"))) << env.cuda_runtime;
  EXPECT_TRUE(std::regex_match(env.cublaslt, std::regex(R"(\d+\.\d+\.\d+)"))) << env.cublaslt;
  EXPECT_TRUE(std::regex_match(env.nccl, std::regex(R"(\d+\.\d+\.\d+)"))) << env.nccl;
  EXPECT_FALSE(env.host.empty());
  EXPECT_EQ(env.gpus.empty(), !env.no_gpu_reason.empty()) << env.no_gpu_reason;
  EXPECT_EQ(why_no_cuda_device().empty(), !env.gpus.empty());
}

TEST_F(ResultsH5, ReaderRejectsMissingAndForeignFiles) {
  const std::string missing = (dir_ / "missing.h5").string();
  EXPECT_NE(error_of([&] { H5Reader r(missing); }).find("cannot open '" + missing + "': No such file"),
            std::string::npos);
  const std::string text = (dir_ / "text.h5").string();
  { std::ofstream(text) << "not hdf5"; }
  EXPECT_NE(error_of([&] { H5Reader r(text); }).find("is not an HDF5 file"), std::string::npos);
}
