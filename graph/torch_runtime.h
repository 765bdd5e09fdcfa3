// Which PyTorch runs a step: its version and whether CUDA or CPU kernels run
// the ops, and the transformers release on top. A few ops keep different bytes
// for backward depending on these, so the op emitters (graph/ops.h), the
// model builders and the optimizer's transients follow them.
//
//   absl::StatusOr<TorchRuntime> r = ParseTorchVersion("1.13");   // r->major == 1, r->minor == 13
//   r->kernels = Kernels::kCpu;
//   r->DropoutMaskDType(DType::kF32)  -> kF32 (CPU); kBool on CUDA
//
// Note [Runtime differences]
// Found by the measurement harness (validation/) comparing PyTorch 1.13 on a
// CPU with the CUDA kernels of PyTorch 2.x, and by reading both versions'
// tools/autograd/derivatives.yaml and torch/optim:
//  - dropout: CUDA runs native_dropout, which keeps a bool mask (1 byte per
//    element); on a CPU, F.dropout multiplies by a noise tensor of the
//    input's dtype and the multiplication saves it (ATen Dropout.cpp,
//    _dropout_impl: the fused kernel is taken only for CUDA, XPU and lazy
//    tensors).
//  - mean over a dimension: before 2.0 MeanBackward1 saved its whole input
//    (`_saved_self`), so Hugging Face's eager RMSNorm kept x^2 alive as well;
//    2.x saves only the sizes.
//  - autocast: CUDA autocast runs softmax in f32; the CPU autocast of 1.13
//    leaves it in bf16 (its fp32 list has no softmax), and so do dropout's
//    noise and output after it.
//  - torch.optim's foreach AdamW before 2.0 built sqrt(v) and then sqrt(v) +
//    eps as two tensor lists (torch._foreach_add, not _foreach_add_), so two
//    parameter-group-sized temporaries coexisted; 2.x adds eps in place.
//  - softmax's backward on CUDA first writes grad * output into a temporary
//    of the gradient's size (aten/src/ATen/native/cuda/SoftMax.cu,
//    softmax_backward_cuda_out: `Tensor tmp = grad * output;`), so for a
//    moment it holds three score-sized tensors in eager attention, as every
//    recorded H100 trace shows in every layer (validation/fixtures/cuda);
//    the CPU kernel writes the gradient only.
#ifndef HEADROOM_GRAPH_TORCH_RUNTIME_H_
#define HEADROOM_GRAPH_TORCH_RUNTIME_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace headroom {

// The Hugging Face transformers release whose modeling code builds the model.
// Its modeling files change what a few families save (Note [transformers
// versions] in models/builders/attention.cc); the default is the release last checked
// against the tracer.
struct TransformersVersion {
  int major = 5;
  int minor = 24;

  bool operator==(const TransformersVersion&) const = default;
  bool AtLeast(int at_major, int at_minor) const {
    return major > at_major || (major == at_major && minor >= at_minor);
  }
};
// "MAJOR.MINOR" or "MAJOR", from 4.40 on; a suffix after the minor number is
// ignored ("4.46.3").
absl::StatusOr<TransformersVersion> ParseTransformersVersion(std::string_view version);
std::string TransformersVersionName(const TransformersVersion& version);  // "5.24"

enum class Kernels : uint8_t { kCuda, kCpu };
std::string_view KernelsName(Kernels kernels);  // "cuda", "cpu"
absl::StatusOr<Kernels> ParseKernels(std::string_view name);

struct TorchRuntime {
  // The PyTorch version; the default is the current 2.x line.
  int major = 2;
  int minor = 5;
  Kernels kernels = Kernels::kCuda;
  // With CPU kernels: offloaded tensors go to host memory kept apart from
  // the memory the ops use (headroom.plan(offload=True) on a CPU emulates a
  // GPU's host memory so), so plans may offload. CUDA's always is.
  bool emulated_host = false;
  // The transformers release running on it (Hugging Face models only).
  TransformersVersion transformers;

  bool operator==(const TorchRuntime&) const = default;
  // Note [Runtime differences].
  DType DropoutMaskDType(DType input) const { return kernels == Kernels::kCpu ? input : DType::kBool; }
  bool MeanSavesInput() const { return major < 2; }
  bool ForeachAdamKeepsTwoTemporaries() const { return major < 2; }
  bool SoftmaxBackwardHoldsProduct() const { return kernels == Kernels::kCuda; }
};

// "MAJOR.MINOR" or "MAJOR" (minor 0), a PyTorch version from 1.13 on, with any
// suffix after the minor number ignored ("1.13.0a0", "2.5.1+cu124").
// The runtime's kernels are left at CUDA.
absl::StatusOr<TorchRuntime> ParseTorchVersion(std::string_view version);
std::string TorchVersionName(const TorchRuntime& runtime);  // "2.5"

}  // namespace headroom

#endif  // HEADROOM_GRAPH_TORCH_RUNTIME_H_
