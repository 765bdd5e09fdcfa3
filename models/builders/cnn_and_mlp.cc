// torchvision CNNs (ResNet, VGG) and the MLP chain.
#include <string>

#include "absl/strings/str_format.h"
#include "models/builder.h"

namespace headroom::builders_internal {

absl::Status Builder::BuildCnn() {
  const int64_t b = o_.batch;
  e_.set_layer(-1);
  const DType input_dtype = o_.param_dtype;
  TensorId x = e_.Input("pixel_values", {b, c_.in_channels, c_.image_size, c_.image_size},
                        input_dtype);
  auto conv = [&](const std::string& name, TensorId in, int64_t out_c, int64_t kernel,
                  int64_t stride, int64_t padding, bool bias) {
    const int64_t in_c = g_.tensor(in).shape[1];
    TensorId w = Param(name + ".weight", {out_c, in_c, kernel, kernel});
    TensorId bb = bias ? Param(name + ".bias", {out_c}) : kNone;
    return e_.Conv2d(name, in, w, bb, stride, padding);
  };
  auto bn = [&](const std::string& name, TensorId in) {
    const int64_t ch = g_.tensor(in).shape[1];
    TensorId w = Param(name + ".weight", {ch});
    TensorId bias = Param(name + ".bias", {ch});
    e_.Buffer(name + ".running_mean", {ch}, DType::kF32);
    e_.Buffer(name + ".running_var", {ch}, DType::kF32);
    e_.Buffer(name + ".num_batches_tracked", {}, DType::kI64);
    return e_.BatchNorm(name, in, w, bias);
  };
  auto relu = [&](const std::string& name, TensorId in) {
    return e_.Activation(name, ActivationKind::kRelu, in, /*inplace=*/true);
  };
  int64_t features = 0;
  if (c_.architecture == "resnet50") {
    // torchvision resnet50 (ResNet v1.5: stride on the 3x3 conv).
    x = relu("relu", bn("bn1", conv("conv1", x, 64, 7, 2, 3, false)));
    x = e_.MaxPool2d("maxpool", x, 3, 2, 1);
    const int64_t blocks[4] = {3, 4, 6, 3};
    int64_t in_c = 64;
    int block_index = 0;
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t width = int64_t{64} << stage;
      for (int64_t j = 0; j < blocks[stage]; ++j) {
        e_.set_layer(block_index++);
        const std::string p = absl::StrFormat("layer%d.%d.", stage + 1, j);
        const int64_t stride = (j == 0 && stage > 0) ? 2 : 1;
        TensorId identity = x;
        TensorId y = relu(p + "relu1", bn(p + "bn1", conv(p + "conv1", x, width, 1, 1, 0, false)));
        y = relu(p + "relu2", bn(p + "bn2", conv(p + "conv2", y, width, 3, stride, 1, false)));
        y = bn(p + "bn3", conv(p + "conv3", y, width * 4, 1, 1, 0, false));
        if (j == 0) {
          identity = bn(p + "downsample.1",
                        conv(p + "downsample.0", x, width * 4, 1, stride, 0, false));
        }
        y = e_.AddInplace(p + "residual", y, identity);
        x = relu(p + "relu3", y);
        in_c = width * 4;
      }
    }
    e_.set_layer(-1);
    x = e_.AdaptiveAvgPool2d("avgpool", x, 1, 1);
    features = in_c;
    x = e_.View("flatten", x, {b, features});
    x = Proj("fc", x, features, c_.num_classes, true, Parallel::kReplicated);
  } else {
    // torchvision vgg16 (configuration "D"), module indices as in `features`.
    const int64_t plan[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0,
                            512, 512, 512, 0, 512, 512, 512, 0};
    int index = 0;
    int conv_index = 0;
    for (int64_t channels : plan) {
      if (channels == 0) {
        x = e_.MaxPool2d(absl::StrFormat("features.%d", index), x, 2, 2, 0);
        index += 1;
        continue;
      }
      e_.set_layer(conv_index++);
      x = conv(absl::StrFormat("features.%d", index), x, channels, 3, 1, 1, true);
      x = relu(absl::StrFormat("features.%d", index + 1), x);
      index += 2;
    }
    e_.set_layer(-1);
    x = e_.AdaptiveAvgPool2d("avgpool", x, 7, 7);
    features = 512 * 7 * 7;
    x = e_.View("flatten", x, {b, features});
    x = relu("classifier.1", Proj("classifier.0", x, features, 4096, true, Parallel::kReplicated));
    x = e_.Dropout("classifier.2", x, 0.5);
    x = relu("classifier.4", Proj("classifier.3", x, 4096, 4096, true, Parallel::kReplicated));
    x = e_.Dropout("classifier.5", x, 0.5);
    x = Proj("classifier.6", x, 4096, c_.num_classes, true, Parallel::kReplicated);
  }
  if (o_.training) Loss(x, b, c_.num_classes);
  return absl::OkStatus();
}

absl::Status Builder::BuildMlp() {
  e_.set_layer(-1);
  TensorId x = e_.Input("x", {o_.batch, c_.mlp_input_size}, o_.param_dtype);
  int64_t in = c_.mlp_input_size;
  const size_t n = c_.mlp_layer_sizes.size();
  for (size_t i = 0; i < n; ++i) {
    e_.set_layer(static_cast<int>(i));
    const std::string name = absl::StrFormat("layers.%d", i);
    const int64_t out = c_.mlp_layer_sizes[i];
    x = Proj(name, x, in, out, c_.mlp_bias, Parallel::kReplicated);
    if (i + 1 < n) {
      x = Activation(name + ".act", x);
      x = e_.Dropout(name + ".dropout", x, c_.mlp_dropout);
    }
    in = out;
  }
  if (o_.training) Loss(x, o_.batch, in);
  return absl::OkStatus();
}

}  // namespace headroom::builders_internal
