// The host copies an offload plan makes in one step, for the host pool's
// benchmarks: 48 sizes log-uniform in [256 KiB, 16 MiB], 64-byte multiples.
#ifndef HEADROOM_BENCH_HOST_COPY_SIZES_H_
#define HEADROOM_BENCH_HOST_COPY_SIZES_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace headroom {

inline std::vector<uint64_t> HostCopySizes() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(18, 24);  // 256 KiB .. 16 MiB
  std::vector<uint64_t> sizes(48);
  for (uint64_t& s : sizes) s = static_cast<uint64_t>(std::exp2(exponent(rng))) / 64 * 64;
  return sizes;
}

}  // namespace headroom

#endif  // HEADROOM_BENCH_HOST_COPY_SIZES_H_
