// Liveness on the Checkmate training graphs (../shared/data, imported by
// models/node_link.h), whose no-rematerialization peak the data README
// defines: each node's output freed right after its last consumer.
#include <fstream>
#include <sstream>
#include <string>

#include "graph/liveness.h"
#include "models/node_link.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

std::string ReadShared(const std::string& name) {
  std::ifstream in(std::string(HEADROOM_SHARED_DATA_DIR) + "/" + name);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Expected peaks: a direct scan of each file in node order (ids ascending are
// a topological order in both), adding a node's cost_ram when it runs and
// dropping every output whose last consumer has run (and a consumer-less
// output right after its node), as the data README defines the
// no-rematerialization peak.
TEST(Liveness, CheckmateNoRematerializationPeaks) {
  struct Case {
    const char* file;
    uint64_t peak;
    const char* peak_node;
  };
  for (const Case& c : {Case{"checkmate_vgg16_b256_train.nx.json", 15825108992u, "block4_conv2_backward"},
                        Case{"checkmate_mobilenet_b512_train.nx.json", 34701056000u,
                             "conv_pw_13_bn_backward"}}) {
    const std::string text = ReadShared(c.file);
    if (text.empty()) GTEST_SKIP() << "shared data not present: " << c.file;
    absl::StatusOr<Graph> g = ImportNodeLink(text, c.file);
    ASSERT_TRUE(g.ok()) << g.status();
    const MemoryProfile p = ProfileMemory(*g);
    EXPECT_EQ(p.peak_bytes, c.peak) << c.file;
    EXPECT_EQ(g->op(p.peak_op).name, c.peak_node) << c.file;
  }
}

}  // namespace
}  // namespace headroom
