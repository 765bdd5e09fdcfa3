#include <filesystem>
#include <fstream>

#include "common/json_fields.h"
#include "gmock/gmock.h"
#include "models/builders.h"
#include "models/graph_json.h"
#include "models/model_source.h"
#include "models/node_link.h"
#include "graph/training_step.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

using ::testing::HasSubstr;

void ExpectSameGraph(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.name(), b.name());
  ASSERT_EQ(a.num_tensors(), b.num_tensors());
  ASSERT_EQ(a.num_ops(), b.num_ops());
  for (size_t i = 0; i < a.num_tensors(); ++i) {
    const Tensor& x = a.tensors()[i];
    const Tensor& y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.role, y.role);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.trainable, y.trainable);
    EXPECT_EQ(x.view_of, y.view_of);
    EXPECT_EQ(x.grad_of, y.grad_of);
  }
  for (size_t i = 0; i < a.num_ops(); ++i) {
    const Op& x = a.ops()[i];
    const Op& y = b.ops()[i];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.outputs, y.outputs);
    EXPECT_EQ(x.saved, y.saved);
    EXPECT_DOUBLE_EQ(x.flops, y.flops);
    EXPECT_EQ(x.bytes_read, y.bytes_read);
    EXPECT_EQ(x.bytes_written, y.bytes_written);
    EXPECT_EQ(x.compute_dtype, y.compute_dtype);
    EXPECT_EQ(x.phase, y.phase);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.inplace, y.inplace);
    EXPECT_EQ(x.forward_of, y.forward_of);
    EXPECT_EQ(x.recompute, y.recompute);
    EXPECT_DOUBLE_EQ(x.measured_cost, y.measured_cost);
    EXPECT_EQ(x.attention_core, y.attention_core);
  }
}

TEST(GraphJson, RoundTripsBuiltGraphs) {
  for (const char* preset : {"gpt2", "resnet50", "mixtral-8x7b"}) {
    absl::StatusOr<ModelConfig> c = LoadPresetConfig(preset);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<Graph> g = BuildModelGraph(
        *c, {.batch = 2, .seq_len = 16, .param_dtype = DType::kF32,
             .compute_dtype = DType::kBF16, .lora = {}});
    ASSERT_TRUE(g.ok()) << g.status();
    const std::string text = SaveGraphJson(*g);
    absl::StatusOr<Graph> back = LoadGraphJson(text, "g.json");
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameGraph(*g, *back);
    EXPECT_EQ(SaveGraphJson(*back), text);
  }
}

TEST(GraphJson, RoundTripsEveryField) {
  Graph g("fields");
  TensorId x = g.AddTensor({.name = "x", .shape = {4, 8}, .dtype = DType::kBF16,
                            .role = TensorRole::kInput});
  TensorId w = g.AddTensor({.name = "w", .shape = {8, 8}, .dtype = DType::kNF4,
                            .role = TensorRole::kParameter, .layer = 2, .trainable = false});
  TensorId y = g.AddTensor({.name = "y", .shape = {4, 8}, .dtype = DType::kBF16, .layer = 2});
  TensorId v = g.AddTensor({.name = "y.view", .shape = {32}, .dtype = DType::kBF16, .view_of = y});
  TensorId gy = g.AddTensor({.name = "y.grad", .shape = {4, 8}, .dtype = DType::kBF16,
                             .role = TensorRole::kGradient, .grad_of = y});
  g.AddOp({.kind = "linear", .name = "fc", .inputs = {x, w}, .outputs = {y}, .saved = {x},
           .flops = 512, .bytes_read = 96, .bytes_written = 64, .compute_dtype = DType::kBF16,
           .layer = 2, .attention_core = true});
  g.AddOp({.kind = "view", .name = "flat", .inputs = {y}, .outputs = {v}});
  g.AddOp({.kind = "linear", .name = "fc", .inputs = {x, w}, .outputs = {y},
           .phase = Phase::kBackward, .forward_of = 0, .recompute = true, .measured_cost = 2.5});
  g.AddOp({.kind = "fill", .name = "seed", .inputs = {y}, .outputs = {gy}, .phase = Phase::kLoss,
           .inplace = false});
  ASSERT_TRUE(g.Validate().ok()) << g.Validate();
  absl::StatusOr<Graph> back = LoadGraphJson(SaveGraphJson(g), "f.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameGraph(g, *back);
}

// A graph headroom-trace wrote (python/, from python/tests/sample_modules.py's TanhMlp of width 8, two blocks,
// over 4 rows, cross-entropy), kept in the graph JSON fuzz corpus: the tracer's output stays readable, and
// Headroom derives its backward from what autograd saved.
TEST(GraphJson, ReadsATracedGraph) {
  std::ifstream file(HEADROOM_TRACED_GRAPH);
  ASSERT_TRUE(file) << HEADROOM_TRACED_GRAPH;
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  absl::StatusOr<Graph> g = LoadGraphJson(text, "traced_tanh_mlp.json");
  ASSERT_TRUE(g.ok()) << g.status();
  // Per block: LayerNorm(8) 16, Linear(8, 32) 288, Linear(32, 8) 264; the head Linear(8, 10) 90.
  EXPECT_EQ(g->ParameterCount(), 2u * (16 + 288 + 264) + 90);
  absl::StatusOr<Graph> step = BuildTrainingStep(*g, {});
  ASSERT_TRUE(step.ok()) << step.status();
  int saving = 0, differentiated = 0;
  for (const Op& op : g->ops()) saving += op.saved.empty() ? 0 : 1;
  for (const Op& op : step->ops()) {
    if (op.phase == Phase::kBackward && op.forward_of != kNone && !g->op(op.forward_of).saved.empty()) {
      ++differentiated;
    }
  }
  EXPECT_GT(saving, 10);
  EXPECT_EQ(differentiated, saving);  // every op that saved something has its backward
}

TEST(GraphJson, ErrorsNameThePath) {
  EXPECT_THAT(LoadGraphJson(R"({"tensors": [], "ops": []})", "g.json").status().message(),
              HasSubstr("g.json: headroom_graph_version"));
  EXPECT_THAT(LoadGraphJson(R"({"headroom_graph_version": 9, "tensors": [], "ops": []})", "g.json")
                  .status()
                  .message(),
              HasSubstr("unsupported version 9"));
  EXPECT_THAT(LoadGraphJson(R"({"headroom_graph_version": 1, "ops": [],
                                "tensors": [{"name": "a", "shape": [2], "dtype": "f12",
                                             "role": "input"}]})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("g.json: tensors[0].dtype: unknown dtype 'f12'"));
  EXPECT_THAT(LoadGraphJson(R"({"headroom_graph_version": 1,
                                "tensors": [{"name": "a", "shape": [2], "dtype": "f32",
                                             "role": "input"}],
                                "ops": [{"kind": "relu", "name": "r", "inputs": [0],
                                         "outputs": [3]}]})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("g.json: ops[0].outputs[0]: tensor id 3 out of range"));
  EXPECT_THAT(LoadGraphJson(R"({"headroom_graph_version": 1,
                                "tensors": [{"name": "a", "shape": [2], "dtype": "f32",
                                             "role": "activation"},
                                            {"name": "b", "shape": [2], "dtype": "f32",
                                             "role": "activation"}],
                                "ops": [{"kind": "relu", "name": "r", "inputs": [0],
                                         "outputs": [1]}]})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("op 'r' reads 'a' before any op produces it"));
}

TEST(NodeLink, ImportsAndRejectsBadGraphs) {
  absl::StatusOr<Graph> g = ImportNodeLink(
      R"({"directed": true, "graph": {"name": "tiny"},
          "nodes": [{"id": 0, "name": "a", "backward": false, "cost_cpu": 3, "cost_ram": 100},
                    {"id": 2, "name": "b_grad", "backward": true, "cost_cpu": 5, "cost_ram": 40},
                    {"id": 1, "name": "b", "backward": false, "cost_cpu": 2, "cost_ram": 60}],
          "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2},
                    {"source": 0, "target": 2}]})",
      "tiny.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "tiny");
  ASSERT_EQ(g->num_ops(), 3u);
  EXPECT_EQ(g->op(1).name, "b");  // topological, ids ascending
  EXPECT_EQ(g->op(2).phase, Phase::kBackward);
  EXPECT_EQ(g->op(2).inputs.size(), 2u);
  EXPECT_DOUBLE_EQ(g->op(2).measured_cost, 5);
  EXPECT_EQ(g->tensor(g->op(0).outputs[0]).bytes(), 100u);
  EXPECT_EQ(g->tensor(g->op(2).outputs[0]).role, TensorRole::kGradient);

  EXPECT_THAT(ImportNodeLink(R"({"nodes": [{"id": 0, "backward": false, "cost_cpu": 1}],
                                 "links": []})",
                             "n.json")
                  .status()
                  .message(),
              HasSubstr("n.json: nodes[0].cost_ram"));
  EXPECT_THAT(ImportNodeLink(R"({"nodes": [{"id": 0, "backward": false, "cost_cpu": 1,
                                            "cost_ram": 1}],
                                 "links": [{"source": 0, "target": 7}]})",
                             "n.json")
                  .status()
                  .message(),
              HasSubstr("n.json: links[0].target: unknown node id 7"));
  EXPECT_THAT(ImportNodeLink(R"({"nodes": [{"id": 0, "backward": false, "cost_cpu": 1, "cost_ram": 1},
                                           {"id": 1, "backward": false, "cost_cpu": 1, "cost_ram": 1}],
                                 "links": [{"source": 0, "target": 1}, {"source": 1, "target": 0}]})",
                             "n.json")
                  .status()
                  .message(),
              HasSubstr("cycle"));
}

// MOCCASIN's random DAGs (networkx node_link_data of integer nodes): numbers
// as names, no `backward` or a null one, no loss. Every node is a forward op
// that may be replayed (Note [Node-link graphs without backward]).
TEST(NodeLink, ImportsADagWithNumbersForNamesAndNoBackward) {
  absl::StatusOr<Graph> g = ImportNodeLink(
      R"({"directed": true, "multigraph": false, "graph": {},
          "nodes": [{"cost_cpu": 4, "cost_ram": 64, "name": 0, "id": 0},
                    {"cost_cpu": 2, "cost_ram": 32, "name": 1.5, "id": 1, "backward": null},
                    {"cost_cpu": 1, "cost_ram": 16, "name": null, "id": 2}],
          "links": [{"source": 0, "target": 1}, {"source": 0, "target": 2}, {"source": 1, "target": 2}]})",
      "dag.json");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->num_ops(), 3u);
  EXPECT_EQ(g->op(0).name, "0");
  EXPECT_EQ(g->op(1).name, "1.5");
  EXPECT_EQ(g->op(2).name, "node2");
  for (const Op& op : g->ops()) EXPECT_EQ(op.phase, Phase::kForward) << op.name;

  EXPECT_THAT(ImportNodeLink(R"({"nodes": [{"id": 0, "name": [1], "cost_cpu": 1, "cost_ram": 1}], "links": []})",
                             "n.json")
                  .status()
                  .message(),
              HasSubstr("n.json: nodes[0].name: expected a string or a number, got array"));
  EXPECT_THAT(ImportNodeLink(R"({"nodes": [{"id": 0, "backward": 1, "cost_cpu": 1, "cost_ram": 1}], "links": []})",
                             "n.json")
                  .status()
                  .message(),
              HasSubstr("n.json: nodes[0].backward"));

  // MOCCASIN's random_layered shape, as LoadModel sees it.
  absl::StatusOr<LoadedModel> m = LoadModel(HEADROOM_RANDOM_LAYERED_GRAPH);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, ModelSourceKind::kNodeLinkFile);
  EXPECT_EQ(m->graph->num_ops(), 19u);
}

// Costs the planner can price: finite, non-negative, at most kMaxMeasuredCost
// (graph/graph.h); the error names the node.
TEST(NodeLink, RefusesCostsThatAreNotCosts) {
  auto error_for = [](const std::string& cost) {
    return std::string(ImportNodeLink(R"({"nodes": [{"id": 0, "name": "a", "cost_cpu": 1, "cost_ram": 1},
                                                     {"id": 1, "name": "conv2", "cost_cpu": )" +
                                          cost + R"(, "cost_ram": 1}], "links": []})",
                                      "g.json")
                           .status()
                           .message());
  };
  EXPECT_THAT(error_for("-1"), HasSubstr("g.json: nodes[1].cost_cpu: -1 (node 'conv2') is not a cost"));
  EXPECT_THAT(error_for("1e308"), HasSubstr("g.json: nodes[1].cost_cpu: 1e+308 (node 'conv2') is not a cost: it "
                                            "must be between 0 and 1e+30"));
  EXPECT_THAT(error_for("1e400"), HasSubstr("g.json: not valid JSON: [json.exception.out_of_range.406] number "
                                            "overflow parsing '1e400'"));
  EXPECT_TRUE(ImportNodeLink(R"({"nodes": [{"id": 0, "cost_cpu": 1e25, "cost_ram": 1}], "links": []})", "g.json").ok());
  EXPECT_THAT(LoadGraphJson(R"({"headroom_graph_version": 1, "name": "g", "tensors": [],
                                "ops": [{"kind": "k", "name": "big", "inputs": [], "outputs": [],
                                         "measured_cost": 1e31}]})",
                            "g.json")
                  .status()
                  .message(),
              HasSubstr("g.json: ops[0].measured_cost: 1e+31 (op 'big') is not a cost"));
}

// The Checkmate/MOCCASIN benchmark graphs in ../shared/data (optional).
TEST(NodeLink, ImportsTheSharedCheckmateSamples) {
  const std::filesystem::path dir(HEADROOM_SHARED_DATA_DIR);
  struct Sample {
    const char* file;
    size_t nodes;
  };
  int found = 0;
  for (Sample sample : {Sample{"checkmate_vgg16_b256_train.nx.json", 45},
                        Sample{"checkmate_mobilenet_b512_train.nx.json", 185}}) {
    const std::filesystem::path path = dir / sample.file;
    if (!std::filesystem::exists(path)) continue;
    ++found;
    absl::StatusOr<std::string> text = ReadTextFile(path.string(), kModelFile);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<Graph> g = ImportNodeLink(*text, path.string());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->num_ops(), sample.nodes);
    size_t backward = 0;
    for (const Op& op : g->ops()) backward += op.phase == Phase::kBackward ? 1 : 0;
    EXPECT_GT(backward, 0u);
    EXPECT_LT(backward, sample.nodes);
    // LoadModel recognizes the format by its keys.
    absl::StatusOr<LoadedModel> m = LoadModel(path.string());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->kind, ModelSourceKind::kNodeLinkFile);
    EXPECT_EQ(m->graph->num_ops(), sample.nodes);
  }
  if (found == 0) GTEST_SKIP() << "no shared data in " << dir;
}

TEST(LoadModel, ReadsGraphJsonAndConfigFiles) {
  absl::StatusOr<ModelConfig> c = LoadPresetConfig("gpt2");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<Graph> g = BuildModelGraph(*c, {.batch = 1, .seq_len = 8});
  ASSERT_TRUE(g.ok());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "headroom_graph_formats_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "g.json") << SaveGraphJson(*g);
    std::ofstream(dir / "config.json") << R"({"architectures": ["GPT2LMHeadModel"],
        "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32})";
  }
  absl::StatusOr<LoadedModel> graph = LoadModel((dir / "g.json").string());
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->kind, ModelSourceKind::kGraphFile);
  EXPECT_EQ(graph->graph->num_ops(), g->num_ops());
  absl::StatusOr<LoadedModel> config = LoadModel(dir.string());  // an HF snapshot folder
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kind, ModelSourceKind::kConfigFile);
  EXPECT_EQ(config->config->num_layers, 2);
  std::filesystem::remove_all(dir);
}

// A model file beyond Note [Model file bound] is refused before it is read
// (the file is sparse: it takes no disk).
TEST(LoadModel, RefusesModelFilesBeyondTheBound) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / "huge_config.json";
  std::ofstream(path) << "{}";
  std::filesystem::resize_file(path, kMaxModelFileBytes + 1);
  absl::StatusOr<LoadedModel> model = LoadModel(path.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("huge_config.json: 268435457 bytes is more than the 256.00 MiB"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace headroom
