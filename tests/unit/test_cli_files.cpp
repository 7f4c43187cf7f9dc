// pooch-run on files only a program can write: a model whose stored spec is
// not JSON (info must not pass it) and a checkpoint that lacks its trainer
// state (the resume error must name the file). POOCH_RUN is the built tool.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/pooch_file.h"

namespace pooch {
namespace {

namespace fs = std::filesystem;

class CliFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pooch-cli-files-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // pooch-run with `args`; its exit code, stderr in *err.
  int run(const std::string& args, std::string* err) {
    const std::string e = dir_ + "/err.txt";
    const std::string cmd = std::string("cd '") + dir_ + "' && '" + POOCH_RUN + "' " + args +
                            " > out.txt 2> '" + e + "'";
    const int st = std::system(cmd.c_str());
    std::ifstream in(e);
    std::stringstream ss;
    ss << in.rdbuf();
    *err = ss.str();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  std::string dir_;
};

TEST_F(CliFiles, InfoRefusesAStoredSpecThatIsNotJson) {
  Metadata md;
  md.set_string("pooch.kind", "model");
  md.set_string("model.spec", "{\"input\": {\"width\": 5");  // cut short
  write_pooch_file(dir_ + "/bad-spec.pooch", md, Graph{}, {});
  std::string err;
  EXPECT_EQ(run("info bad-spec.pooch", &err), 2) << err;
  EXPECT_NE(err.find("bad-spec.pooch"), std::string::npos) << err;
  EXPECT_NE(err.find("model.spec"), std::string::npos) << err;
}

TEST_F(CliFiles, ResumeErrorsNameTheCheckpoint) {
  std::string err;
  ASSERT_EQ(run("synth --scale 0.01 --seed 2 --out data", &err), 0) << err;
  ASSERT_EQ(run("train --data data --epochs 1 --threads 1 --device cpu --hidden 16 --fan-in 4 "
                "--out m.pooch",
                &err),
            0)
      << err;
  // The same checkpoint without its data position.
  const PoochFile f = read_pooch_file(dir_ + "/m.pooch.ckpt");
  Metadata md = f.metadata();
  ASSERT_TRUE(md.erase(meta_keys::kDataPosition));
  std::vector<TensorData> td;
  for (const TensorEntry& e : f.tensors()) td.push_back({e.id, f.data(e).data(), e.bytes, {}});
  write_pooch_file(dir_ + "/cut.ckpt", md, f.graph(), td);
  EXPECT_EQ(run("train --data data --epochs 2 --threads 1 --device cpu --out r.pooch --resume "
                "cut.ckpt",
                &err),
            2)
      << err;
  EXPECT_NE(err.find("cut.ckpt"), std::string::npos) << err;
  EXPECT_NE(err.find(meta_keys::kDataPosition), std::string::npos) << err;
}

}  // namespace
}  // namespace pooch
