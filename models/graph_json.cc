#include "models/graph_json.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/json_fields.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace headroom {
namespace {

using nlohmann::json;

// A vocabulary parser's error, placed at `path` in the document.
template <typename T>
absl::StatusOr<T> At(const JsonPath& path, absl::StatusOr<T> parsed) {
  if (!parsed.ok()) return path.Error(std::string(parsed.status().message()));
  return parsed;
}

// Optional members default to the struct's defaults when absent.
template <typename T, typename Reader>
absl::Status ReadOptional(const json& object, std::string_view key, const JsonPath& path,
                          Reader reader, T& out) {
  auto it = object.find(std::string(key));
  if (it == object.end()) return absl::OkStatus();
  HEADROOM_ASSIGN_OR_RETURN(out, reader(*it, path / key));
  return absl::OkStatus();
}

absl::StatusOr<int> AsIndex(const json& value, const JsonPath& path) {
  HEADROOM_ASSIGN_OR_RETURN(int64_t v, AsInt(value, path));
  if (v < -1 || v > INT32_MAX) {
    return path.Error(absl::StrFormat("expected -1 or a valid index, got %d", v));
  }
  return static_cast<int>(v);
}

absl::StatusOr<std::vector<TensorId>> ReadIds(const json& object, std::string_view key,
                                              const JsonPath& path, size_t num_tensors) {
  std::vector<TensorId> ids;
  auto it = object.find(std::string(key));
  if (it == object.end()) return ids;
  const JsonPath list_path = path / key;
  if (!it->is_array()) return list_path.Error("expected an array of tensor ids");
  for (size_t i = 0; i < it->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(int64_t id, AsInt((*it)[i], list_path / i));
    if (id < 0 || static_cast<uint64_t>(id) >= num_tensors) {
      return (list_path / i)
          .Error(absl::StrFormat("tensor id %d out of range (the graph has %d tensors)", id,
                                 num_tensors));
    }
    ids.push_back(static_cast<TensorId>(id));
  }
  return ids;
}

json IdsToJson(const std::vector<TensorId>& ids) {
  json out = json::array();
  for (TensorId id : ids) out.push_back(id);
  return out;
}

absl::StatusOr<Tensor> ReadTensor(const json& t, const JsonPath& path, size_t index,
                                  size_t count) {
  if (!t.is_object()) return path.Error("expected an object");
  Tensor tensor;
  if (t.contains("id")) {
    HEADROOM_ASSIGN_OR_RETURN(int64_t id, RequireInt(t, "id", path));
    if (id != static_cast<int64_t>(index)) {
      return (path / "id").Error(absl::StrFormat("expected %d (ids are positions)", index));
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(tensor.name, RequireString(t, "name", path));
  HEADROOM_ASSIGN_OR_RETURN(const json* shape, RequireField(t, "shape", path));
  if (!shape->is_array()) return (path / "shape").Error("expected an array of dimensions");
  for (size_t d = 0; d < shape->size(); ++d) {
    HEADROOM_ASSIGN_OR_RETURN(int64_t dim, AsInt((*shape)[d], path / "shape" / d));
    if (dim < 0) return (path / "shape" / d).Error("dimension must not be negative");
    tensor.shape.push_back(dim);
  }
  HEADROOM_ASSIGN_OR_RETURN(std::string dtype, RequireString(t, "dtype", path));
  HEADROOM_ASSIGN_OR_RETURN(tensor.dtype, At(path / "dtype", ParseDType(dtype)));
  HEADROOM_ASSIGN_OR_RETURN(std::string role, RequireString(t, "role", path));
  HEADROOM_ASSIGN_OR_RETURN(tensor.role, At(path / "role", ParseTensorRole(role)));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(t, "layer", path, AsIndex, tensor.layer));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(t, "trainable", path, AsBool, tensor.trainable));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(t, "view_of", path, AsIndex, tensor.view_of));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(t, "grad_of", path, AsIndex, tensor.grad_of));
  for (auto [key, value] : {std::pair{"view_of", tensor.view_of}, {"grad_of", tensor.grad_of}}) {
    if (value != kNone && static_cast<size_t>(value) >= count) {
      return (path / key).Error(absl::StrFormat("tensor id %d out of range", value));
    }
  }
  return tensor;
}

absl::StatusOr<Op> ReadOp(const json& o, const JsonPath& path, size_t index, size_t num_tensors,
                          size_t num_ops) {
  if (!o.is_object()) return path.Error("expected an object");
  Op op;
  if (o.contains("id")) {
    HEADROOM_ASSIGN_OR_RETURN(int64_t id, RequireInt(o, "id", path));
    if (id != static_cast<int64_t>(index)) {
      return (path / "id").Error(absl::StrFormat("expected %d (ids are positions)", index));
    }
  }
  HEADROOM_ASSIGN_OR_RETURN(op.kind, RequireString(o, "kind", path));
  HEADROOM_ASSIGN_OR_RETURN(op.name, RequireString(o, "name", path));
  HEADROOM_ASSIGN_OR_RETURN(op.inputs, ReadIds(o, "inputs", path, num_tensors));
  HEADROOM_ASSIGN_OR_RETURN(op.outputs, ReadIds(o, "outputs", path, num_tensors));
  HEADROOM_ASSIGN_OR_RETURN(op.saved, ReadIds(o, "saved", path, num_tensors));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "flops", path, AsNumber, op.flops));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "bytes_read", path, AsUint, op.bytes_read));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "bytes_written", path, AsUint, op.bytes_written));
  if (!(op.flops >= 0)) return (path / "flops").Error("must not be negative");
  if (o.contains("compute_dtype")) {
    HEADROOM_ASSIGN_OR_RETURN(std::string dtype, RequireString(o, "compute_dtype", path));
    HEADROOM_ASSIGN_OR_RETURN(op.compute_dtype, At(path / "compute_dtype", ParseDType(dtype)));
  }
  if (o.contains("phase")) {
    HEADROOM_ASSIGN_OR_RETURN(std::string phase, RequireString(o, "phase", path));
    HEADROOM_ASSIGN_OR_RETURN(op.phase, At(path / "phase", ParsePhase(phase)));
  }
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "layer", path, AsIndex, op.layer));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "inplace", path, AsBool, op.inplace));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "forward_of", path, AsIndex, op.forward_of));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "recompute", path, AsBool, op.recompute));
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "measured_cost", path, AsNumber, op.measured_cost));
  if (!(op.measured_cost >= 0) || !(op.measured_cost <= kMaxMeasuredCost)) {
    return (path / "measured_cost")
        .Error(absl::StrFormat("%g (op %s) is not a cost: it must be between 0 and %g", op.measured_cost,
                               QuoteForError(op.name), kMaxMeasuredCost));
  }
  HEADROOM_RETURN_IF_ERROR(ReadOptional(o, "attention_core", path, AsBool, op.attention_core));
  if (op.forward_of != kNone && static_cast<size_t>(op.forward_of) >= num_ops) {
    return (path / "forward_of").Error(absl::StrFormat("op id %d out of range", op.forward_of));
  }
  return op;
}

}  // namespace

std::string SaveGraphJson(const Graph& graph) {
  json doc = {{"headroom_graph_version", kGraphJsonVersion}, {"name", graph.name()}};
  json tensors = json::array();
  for (const Tensor& t : graph.tensors()) {
    json j = {{"id", t.id},
              {"name", t.name},
              {"shape", t.shape},
              {"dtype", std::string(DTypeName(t.dtype))},
              {"role", std::string(TensorRoleName(t.role))}};
    if (t.layer != -1) j["layer"] = t.layer;
    if (!t.trainable) j["trainable"] = false;
    if (t.view_of != kNone) j["view_of"] = t.view_of;
    if (t.grad_of != kNone) j["grad_of"] = t.grad_of;
    tensors.push_back(std::move(j));
  }
  json ops = json::array();
  for (const Op& op : graph.ops()) {
    json j = {{"id", op.id},
              {"kind", op.kind},
              {"name", op.name},
              {"inputs", IdsToJson(op.inputs)},
              {"outputs", IdsToJson(op.outputs)},
              {"saved", IdsToJson(op.saved)},
              {"flops", op.flops},
              {"bytes_read", op.bytes_read},
              {"bytes_written", op.bytes_written},
              {"compute_dtype", std::string(DTypeName(op.compute_dtype))},
              {"phase", std::string(PhaseName(op.phase))}};
    if (op.layer != -1) j["layer"] = op.layer;
    if (op.inplace) j["inplace"] = true;
    if (op.forward_of != kNone) j["forward_of"] = op.forward_of;
    if (op.recompute) j["recompute"] = true;
    if (op.measured_cost != 0) j["measured_cost"] = op.measured_cost;
    if (op.attention_core) j["attention_core"] = true;
    ops.push_back(std::move(j));
  }
  doc["tensors"] = std::move(tensors);
  doc["ops"] = std::move(ops);
  return doc.dump(1) + "\n";
}

absl::StatusOr<Graph> LoadGraphJson(std::string_view json_text, std::string_view origin) {
  HEADROOM_ASSIGN_OR_RETURN(json doc, ParseJsonDocument(json_text, origin));
  const JsonPath path(origin);
  if (!doc.is_object()) {
    return path.Error(absl::StrFormat("expected a JSON object, got %s", JsonTypeName(doc)));
  }
  HEADROOM_ASSIGN_OR_RETURN(int64_t version, RequireInt(doc, "headroom_graph_version", path));
  if (version < 1 || version > kGraphJsonVersion) {
    return (path / "headroom_graph_version")
        .Error(absl::StrFormat("unsupported version %d (this build reads version %d)", version,
                               kGraphJsonVersion));
  }
  std::string name;
  if (doc.contains("name")) {
    HEADROOM_ASSIGN_OR_RETURN(name, RequireString(doc, "name", path));
  }
  HEADROOM_ASSIGN_OR_RETURN(const json* tensors, RequireField(doc, "tensors", path));
  HEADROOM_ASSIGN_OR_RETURN(const json* ops, RequireField(doc, "ops", path));
  if (!tensors->is_array()) return (path / "tensors").Error("expected an array");
  if (!ops->is_array()) return (path / "ops").Error("expected an array");
  Graph graph(name);
  for (size_t i = 0; i < tensors->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(Tensor t,
                              ReadTensor((*tensors)[i], path / "tensors" / i, i, tensors->size()));
    graph.AddTensor(std::move(t));
  }
  for (size_t i = 0; i < ops->size(); ++i) {
    HEADROOM_ASSIGN_OR_RETURN(
        Op op, ReadOp((*ops)[i], path / "ops" / i, i, tensors->size(), ops->size()));
    graph.AddOp(std::move(op));
  }
  absl::Status valid = graph.Validate();
  if (!valid.ok()) return path.Error(std::string(valid.message()));
  return graph;
}

}  // namespace headroom
