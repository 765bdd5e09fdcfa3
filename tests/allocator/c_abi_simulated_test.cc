// The C ABI of libheadroom_cuda_alloc.so (allocator/cuda/c_abi), run over
// simulated devices: headroom_alloc.cc makes no CUDA call, and this file
// supplies the backend factory the library otherwise gets from CUDA.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/cuda/c_abi/c_abi_internal.h"
#include "allocator/cuda/c_abi/headroom_alloc.h"
#include "allocator/history.h"
#include "allocator/simulated/simulated_backend.h"
#include "common/units.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

// Devices 0-8, 10-11 and 13-15 are simulated 1 GiB devices whose stream
// events wait for the test (device 11 without the virtual memory API); device
// 9 cannot be set up; device 12 has 6 MiB, whose events complete at once.
namespace headroom::c_abi {

SimulatedBackend* simulated[16] = {};

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(int device) {
  if (device == 9 || device >= 16) return absl::NotFoundError("no such simulated device");
  absl::StatusOr<std::unique_ptr<SimulatedBackend>> backend =
      SimulatedBackend::Create({.capacity_bytes = device == 12 ? 6 * kMiB : kGiB,
                                .supports_virtual_memory = device != 11,
                                .auto_complete_events = device == 12});
  if (!backend.ok()) return backend.status();
  simulated[device] = backend->get();
  return std::unique_ptr<DeviceBackend>(*std::move(backend));
}

}  // namespace headroom::c_abi

namespace {

using headroom::kGiB;
using headroom::kMiB;

cudaStream_t Stream(uintptr_t id) { return reinterpret_cast<cudaStream_t>(id); }

// HEADROOM_ALLOC_CONF for the devices first used in a scope; nullptr unsets
// it. The value before is put back at the end of the scope.
class ScopedAllocConf {
 public:
  explicit ScopedAllocConf(const char* conf) {
    if (const char* old = std::getenv("HEADROOM_ALLOC_CONF")) old_ = old;
    EXPECT_EQ(conf != nullptr ? setenv("HEADROOM_ALLOC_CONF", conf, 1) : unsetenv("HEADROOM_ALLOC_CONF"), 0);
  }
  ~ScopedAllocConf() {
    EXPECT_EQ(old_ ? setenv("HEADROOM_ALLOC_CONF", old_->c_str(), 1) : unsetenv("HEADROOM_ALLOC_CONF"), 0);
  }
  ScopedAllocConf(const ScopedAllocConf&) = delete;
  ScopedAllocConf& operator=(const ScopedAllocConf&) = delete;

 private:
  std::optional<std::string> old_;
};

// Most tests spell out PyTorch's policy block by block (one cudaMalloc per
// segment, no cross-stream reuse), so the devices they use run it; the
// library's default has tests of its own below.
const bool kPyTorchPolicy = [] { return setenv("HEADROOM_ALLOC_CONF", "pytorch-default", 1) == 0; }();

headroom_stats Stats(int device) {
  headroom_stats s{};
  s.version = HEADROOM_STATS_VERSION;
  s.struct_size = sizeof(headroom_stats);
  EXPECT_EQ(headroom_get_stats(device, &s), 0) << headroom_last_error();
  return s;
}

std::string Snapshot(int device) {
  const ssize_t n = headroom_snapshot_json(device, nullptr, 0);
  EXPECT_GT(n, 0);
  std::string json(static_cast<size_t>(n) + 1, '\0');
  EXPECT_EQ(headroom_snapshot_json(device, json.data(), json.size()), n);
  json.resize(static_cast<size_t>(n));
  return json;
}

TEST(CAbi, MallocFreeStatsSnapshotSummary) {
  ASSERT_EQ(headroom_record_history(0, 100), 0);
  void* p = headroom_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << headroom_last_error();
  headroom_stats s = Stats(0);
  EXPECT_EQ(s.allocated_bytes, 3 * kMiB);
  EXPECT_EQ(s.requested_bytes, 3 * kMiB);
  EXPECT_EQ(s.allocations, 1);
  EXPECT_EQ(s.segments, 1);
  EXPECT_GE(s.reserved_bytes, 3 * kMiB);
  EXPECT_EQ(s.num_device_alloc, 1);

  nlohmann::json snap = nlohmann::json::parse(Snapshot(0));
  EXPECT_EQ(snap["segments"].size(), 1u);
  EXPECT_EQ(snap["device_traces"][0].back()["action"], "alloc");
  char summary[16384];
  ASSERT_GT(headroom_memory_summary(0, summary, sizeof(summary)), 0);
  EXPECT_NE(std::string(summary).find("reserved memory"), std::string::npos);

  headroom_free(p, 3 * kMiB, 0, nullptr);
  s = Stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocated_bytes_peak, 3 * kMiB);
  EXPECT_EQ(headroom_reset_peak_stats(0), 0);
  EXPECT_EQ(Stats(0).allocated_bytes_peak, 0);
  EXPECT_EQ(headroom_empty_cache(0), 0);
  s = Stats(0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(headroom_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(headroom_malloc(-5, 0, nullptr), nullptr);
  headroom_free(nullptr, 0, 0, nullptr);  // a no-op, as free(NULL)
}

TEST(CAbi, ABufferTooSmallIsTruncatedAndTheFullLengthReturned) {
  void* p = headroom_malloc(kMiB, 1, nullptr);
  ASSERT_NE(p, nullptr);
  const std::string full = Snapshot(1);
  char small[8];
  ASSERT_EQ(headroom_snapshot_json(1, small, sizeof(small)), static_cast<ssize_t>(full.size()));
  EXPECT_EQ(std::string(small), full.substr(0, 7));
  headroom_free(p, kMiB, 1, nullptr);
}

// PyTorch frees on the allocation's stream; a free on another stream means
// that stream used the block, so it is reused only once that stream's queued
// work is done (an event, no host wait).
TEST(CAbi, FreeOnAnotherStreamWaitsForThatStream) {
  ASSERT_EQ(headroom_empty_cache(2), 0);  // sets the device up
  headroom::SimulatedBackend& device = *headroom::c_abi::simulated[2];
  const headroom::StreamHandle s1 = *device.CreateStream(), s2 = *device.CreateStream();
  void* p = headroom_malloc(kMiB, 2, Stream(s1.value));
  ASSERT_NE(p, nullptr);
  headroom_free(p, kMiB, 2, Stream(s2.value));
  EXPECT_EQ(Stats(2).allocated_bytes, 0);
  EXPECT_EQ(Stats(2).active_bytes, kMiB);  // freed, but s2 may still use it
  void* q = headroom_malloc(kMiB, 2, Stream(s1.value));
  EXPECT_NE(q, p);
  device.CompleteStream(s2);
  headroom_free(q, kMiB, 2, Stream(s1.value));
  void* r = headroom_malloc(kMiB, 2, Stream(s1.value));
  EXPECT_EQ(r, p);  // lowest address first, now that s2 is done
  EXPECT_EQ(device.HostSynchronizations(), 0u);
  headroom_free(r, kMiB, 2, Stream(s1.value));
  EXPECT_EQ(headroom_record_stream(r, 2, Stream(s2.value)), -1);  // not allocated any more
  EXPECT_NE(std::string(headroom_last_error()).find("not an allocated block"), std::string::npos);
}

TEST(CAbi, BadFreesAreReportedAndChangeNothing) {
  void* p = headroom_malloc(4096, 3, nullptr);
  ASSERT_NE(p, nullptr);
  headroom_free(p, 1234, 3, nullptr);  // wrong size
  EXPECT_NE(std::string(headroom_last_error()).find("allocated with size 4096"), std::string::npos)
      << headroom_last_error();
  EXPECT_EQ(Stats(3).allocated_bytes, 4096);
  headroom_free(p, 4096, 3, nullptr);
  EXPECT_EQ(Stats(3).allocated_bytes, 0);
  headroom_free(p, 4096, 3, nullptr);
  EXPECT_NE(std::string(headroom_last_error()).find("double free"), std::string::npos) << headroom_last_error();
  headroom_free(reinterpret_cast<void*>(0x10), 0, 3, nullptr);
  EXPECT_NE(std::string(headroom_last_error()).find("did not allocate"), std::string::npos)
      << headroom_last_error();
  EXPECT_EQ(Stats(3).allocations, 0);
}

TEST(CAbi, OutOfMemoryReturnsNullWithTheReason) {
  EXPECT_EQ(headroom_malloc(static_cast<ssize_t>(2 * kGiB), 4, nullptr), nullptr);
  const std::string error = headroom_last_error();
  EXPECT_NE(error.find("out of memory"), std::string::npos) << error;
  EXPECT_EQ(Stats(4).num_ooms, 1);
  ASSERT_EQ(headroom_set_memory_fraction(0.5, 4), 0);
  EXPECT_EQ(headroom_malloc(static_cast<ssize_t>(600 * kMiB), 4, nullptr), nullptr);
  void* p = headroom_malloc(static_cast<ssize_t>(400 * kMiB), 4, nullptr);
  EXPECT_NE(p, nullptr) << headroom_last_error();
  headroom_free(p, static_cast<ssize_t>(400 * kMiB), 4, nullptr);
}

TEST(CAbi, ArgumentErrorsNameTheArgument) {
  EXPECT_EQ(headroom_set_memory_fraction(2.0, 0), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("memory fraction"), std::string::npos);
  headroom_stats old_layout{};
  old_layout.version = HEADROOM_STATS_VERSION;
  old_layout.struct_size = 8;
  EXPECT_EQ(headroom_get_stats(0, &old_layout), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(headroom_get_stats(0, nullptr), -1);
  EXPECT_EQ(headroom_empty_cache(-1), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("device -1 out of range"), std::string::npos);
  EXPECT_EQ(headroom_empty_cache(64), -1);
}

TEST(CAbi, ADeviceThatCannotBeSetUpFailsEveryCallWithTheReason) {
  EXPECT_EQ(headroom_malloc(4096, 9, nullptr), nullptr);
  EXPECT_NE(std::string(headroom_last_error()).find("cannot set up device 9: no such simulated device"),
            std::string::npos)
      << headroom_last_error();
  EXPECT_EQ(headroom_empty_cache(9), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("device 9"), std::string::npos);
}

TEST(CAbi, AnInvalidAllocConfIsReportedOnThatDevice) {
  std::string error;
  {
    ScopedAllocConf conf("expandable_segments:Maybe");
    EXPECT_EQ(headroom_malloc(4096, 5, nullptr), nullptr);
    error = headroom_last_error();
  }
  EXPECT_NE(error.find("expandable_segments"), std::string::npos) << error;
}

TEST(CAbi, TheAllocConfIsReadWhenADeviceIsFirstUsed) {
  void* p = nullptr;
  {
    ScopedAllocConf conf("expandable_segments:True");
    p = headroom_malloc(static_cast<ssize_t>(3 * kMiB), 6, nullptr);
  }
  ASSERT_NE(p, nullptr) << headroom_last_error();
  nlohmann::json snap = nlohmann::json::parse(Snapshot(6));
  EXPECT_EQ(snap["allocator_settings"]["expandable_segments"], true) << snap["allocator_settings"];
  headroom_free(p, static_cast<ssize_t>(3 * kMiB), 6, nullptr);
}

// A layout plan named in HEADROOM_ALLOC_CONF after the preset (Note [Following a layout plan]): the allocator
// reads it when the device is first used and places each request where it says (device 13); a plan file that
// cannot be read is that device's error (devices 14 and 15).
TEST(CAbi, FollowsTheLayoutPlanItsConfNames) {
  const std::string path = ::testing::TempDir() + "/c_abi_test.plan.json";
  {
    std::ofstream file(path);
    file << R"({"format": "headroom.layout_plan", "version": 1, "repeat_from": 1,
               "blocks": [[0, 4194304], [6291456, 1048576]]})";
  }
  const std::string conf = "headroom,layout_plan:" + path;
  void* weights = nullptr;
  {
    ScopedAllocConf scoped(conf.c_str());
    weights = headroom_malloc(static_cast<ssize_t>(4 * kMiB), 13, nullptr);
  }
  ASSERT_NE(weights, nullptr) << headroom_last_error();
  for (int step = 0; step < 3; ++step) {
    void* activation = headroom_malloc(static_cast<ssize_t>(kMiB), 13, nullptr);
    EXPECT_EQ(static_cast<char*>(activation), static_cast<char*>(weights) + 6 * kMiB);
    headroom_free(activation, static_cast<ssize_t>(kMiB), 13, nullptr);
  }
  EXPECT_EQ(Stats(13).num_planned_allocs, 4);
  EXPECT_EQ(headroom_plan_departure(13, nullptr, 0), 0);
  // A request the plan does not have ends it; the policy serves it, and the library says why.
  void* other = headroom_malloc(static_cast<ssize_t>(3 * kMiB), 13, nullptr);
  ASSERT_NE(other, nullptr) << headroom_last_error();
  char why[256];
  ASSERT_GT(headroom_plan_departure(13, why, sizeof(why)), 0) << headroom_last_error();
  EXPECT_NE(std::string(why).find("request 4 asks for 3145728 bytes; the plan has 1048576 there"), std::string::npos)
      << why;
  EXPECT_EQ(Stats(13).num_planned_allocs, 4);
  headroom_free(other, static_cast<ssize_t>(3 * kMiB), 13, nullptr);
  headroom_free(weights, static_cast<ssize_t>(4 * kMiB), 13, nullptr);

  std::string error;
  {
    ScopedAllocConf scoped("headroom,layout_plan:/no/such/file.plan.json");
    EXPECT_EQ(headroom_malloc(4096, 14, nullptr), nullptr);
    error = headroom_last_error();
  }
  EXPECT_NE(error.find("/no/such/file.plan.json"), std::string::npos) << error;

  // A plan file is read as every JSON input is (Note [JSON nesting bound] in common/json_document.cc): 100,000
  // '[' are refused at level 129, naming the file, where they took memory in proportion before (device 15).
  const std::string deep = ::testing::TempDir() + "/c_abi_test_deep.plan.json";
  std::ofstream(deep) << std::string(100'000, '[');
  {
    ScopedAllocConf scoped(("headroom,layout_plan:" + deep).c_str());
    EXPECT_EQ(headroom_malloc(4096, 15, nullptr), nullptr);
    error = headroom_last_error();
  }
  EXPECT_NE(error.find(deep + ": arrays and objects nested 129 deep at byte 129"), std::string::npos) << error;
}

// Headroom's own policy, by its preset's name (device 8) and by default (device 10).
TEST(CAbi, HeadroomsOwnPolicyIsTheDefaultAndTakenByItsPresetName) {
  for (const auto& [conf, device] : {std::pair<const char*, int>{"headroom", 8}, {nullptr, 10}}) {
    SCOPED_TRACE(device);
    void* small = nullptr;
    {
      ScopedAllocConf scoped(conf);
      small = headroom_malloc(4096, device, nullptr);
    }
    ASSERT_NE(small, nullptr) << headroom_last_error();
    const nlohmann::json snap = nlohmann::json::parse(Snapshot(device));
    const nlohmann::json& settings = snap["allocator_settings"];
    EXPECT_EQ(settings["expandable_segments"], true) << settings;
    EXPECT_EQ(settings["move_free_pages"], true) << settings;
    EXPECT_EQ(settings["move_threshold_max"], 1.05) << settings;
    EXPECT_EQ(settings["unified_pool"], true) << settings;
    EXPECT_EQ(settings["reuse_layout_min_bytes"], 8 * kMiB) << settings;
    EXPECT_EQ(settings["align_growth"], true) << settings;
    EXPECT_EQ(settings["stitch_pages"], true) << settings;
    // One pool: the small request was served from the large pool's segment.
    ASSERT_EQ(snap["segments"].size(), 1u) << snap["segments"];
    EXPECT_EQ(snap["segments"][0]["segment_type"], "large");
    // Its one page is counted as mapped (stats version 2), and as unmapped
    // once the cache is emptied.
    EXPECT_EQ(Stats(device).num_pages_mapped, 1);
    EXPECT_EQ(Stats(device).num_pages_unmapped, 0);
    headroom_free(small, 4096, device, nullptr);
    ASSERT_EQ(headroom_empty_cache(device), 0) << headroom_last_error();
    EXPECT_EQ(Stats(device).num_pages_unmapped, 1);
  }
}

// The default policy stitches a block from free pieces of pages when the device is full (Note [Stitched
// blocks]): on 6 MiB, four 1 MiB blocks and a 2 MiB one, the first and the fourth freed, then 2 MiB.
TEST(CAbi, TheDefaultPolicyStitchesPiecesOfPages) {
  std::vector<void*> blocks;
  {
    ScopedAllocConf unset(nullptr);
    for (size_t size : {kMiB, kMiB, kMiB, kMiB, 2 * kMiB}) {
      blocks.push_back(headroom_malloc(static_cast<ssize_t>(size), 12, nullptr));
      ASSERT_NE(blocks.back(), nullptr) << headroom_last_error();
    }
  }
  headroom_free(blocks[0], static_cast<ssize_t>(kMiB), 12, nullptr);
  headroom_free(blocks[3], static_cast<ssize_t>(kMiB), 12, nullptr);
  EXPECT_EQ(Stats(12).num_stitched_blocks, 0);
  void* stitched = headroom_malloc(static_cast<ssize_t>(2 * kMiB), 12, nullptr);
  ASSERT_NE(stitched, nullptr) << headroom_last_error();
  EXPECT_EQ(Stats(12).num_stitched_blocks, 1);
  EXPECT_EQ(Stats(12).reserved_bytes, static_cast<int64_t>(6 * kMiB));
  headroom_free(stitched, static_cast<ssize_t>(2 * kMiB), 12, nullptr);
  for (size_t i : {1, 2, 4}) headroom_free(blocks[i], static_cast<ssize_t>(i == 4 ? 2 * kMiB : kMiB), 12, nullptr);
  ASSERT_EQ(headroom_empty_cache(12), 0) << headroom_last_error();
  EXPECT_EQ(Stats(12).reserved_bytes, 0);
}

// Expandable segments need the virtual memory API: without it the default is PyTorch's policy.
TEST(CAbi, WithoutVirtualMemoryTheDefaultIsPyTorchsPolicy) {
  void* p = nullptr;
  {
    ScopedAllocConf unset(nullptr);
    p = headroom_malloc(static_cast<ssize_t>(3 * kMiB), 11, nullptr);
  }
  ASSERT_NE(p, nullptr) << headroom_last_error();
  const nlohmann::json settings = nlohmann::json::parse(Snapshot(11))["allocator_settings"];
  EXPECT_EQ(settings["expandable_segments"], false) << settings;
  EXPECT_EQ(settings["move_free_pages"], false) << settings;
  EXPECT_EQ(Stats(11).num_device_alloc, 1);  // one cudaMalloc'ed segment
  EXPECT_EQ(Stats(11).num_pages_mapped, 0);   // and no pages
  headroom_free(p, static_cast<ssize_t>(3 * kMiB), 11, nullptr);
}

TEST(CAbi, TheLastErrorIsPerThread) {
  EXPECT_EQ(headroom_set_memory_fraction(-1, 7), -1);
  std::string other;
  std::thread([&] { other = headroom_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(headroom_last_error()), "");
}

TEST(CAbi, ANegativeSizeIsAnError) {
  EXPECT_EQ(headroom_set_memory_fraction(-1, 0), -1);  // some earlier error on this thread
  EXPECT_EQ(headroom_malloc(-1, 0, nullptr), nullptr);
  EXPECT_EQ(std::string(headroom_last_error()), "headroom_malloc: size -1 is negative");
}

TEST(CAbi, RecordHistoryIsCapped) {
  EXPECT_EQ(headroom_record_history(0, SIZE_MAX), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("more than the limit of 4294967296"), std::string::npos)
      << headroom_last_error();
  EXPECT_EQ(headroom_record_history(0, headroom::kMaxHistoryEntries), 0) << headroom_last_error();
  EXPECT_EQ(headroom_record_history(0, 0), 0);
}

// A caller compiled against another version of the header passes its own
// version and struct_size: the fields both sides know are filled, nothing
// past its struct is written, and fields the library does not know are left.
TEST(CAbi, StatsFillTheFieldsBothSidesKnow) {
  void* p = headroom_malloc(static_cast<ssize_t>(3 * kMiB), 1, nullptr);
  ASSERT_NE(p, nullptr) << headroom_last_error();

  struct NewerStats {
    headroom_stats known;
    int64_t future_field;
  } newer{};
  newer.known.version = HEADROOM_STATS_VERSION + 1;
  newer.known.struct_size = sizeof(NewerStats);
  newer.future_field = -7;
  ASSERT_EQ(headroom_get_stats(1, &newer.known), 0) << headroom_last_error();
  EXPECT_EQ(newer.known.allocated_bytes, static_cast<int64_t>(3 * kMiB));
  EXPECT_GT(newer.known.reserved_bytes, 0);
  EXPECT_EQ(newer.future_field, -7);
  EXPECT_EQ(newer.known.version, HEADROOM_STATS_VERSION + 1u);
  EXPECT_EQ(newer.known.struct_size, sizeof(NewerStats));

  // An older layout that ends after allocated_bytes_peak.
  // A caller's struct of `version`, whose fields end at byte `struct_size`.
  auto caller = [](uint32_t version, size_t struct_size) {
    headroom_stats stats{};
    stats.version = version;
    stats.struct_size = static_cast<uint32_t>(struct_size);
    return stats;
  };
  headroom_stats older = caller(HEADROOM_STATS_VERSION, offsetof(headroom_stats, reserved_bytes));
  older.reserved_bytes = -1;  // past the caller's struct: must stay as it is
  ASSERT_EQ(headroom_get_stats(1, &older), 0) << headroom_last_error();
  EXPECT_EQ(older.allocated_bytes, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(older.allocated_bytes_peak, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(older.reserved_bytes, -1);

  // A version-2 caller's struct ends before the stitched blocks' count.
  headroom_stats version2 = caller(2, offsetof(headroom_stats, num_stitched_blocks));
  version2.num_stitched_blocks = -1;
  ASSERT_EQ(headroom_get_stats(1, &version2), 0) << headroom_last_error();
  EXPECT_EQ(version2.allocated_bytes, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(version2.num_stitched_blocks, -1);

  // A version-1 caller's struct ends before the page counts: filled up to
  // its last field (the free block left in the 20 MiB segment), not past it.
  headroom_stats version1 = caller(1, offsetof(headroom_stats, num_pages_mapped));
  version1.num_pages_mapped = -1;
  ASSERT_EQ(headroom_get_stats(1, &version1), 0) << headroom_last_error();
  EXPECT_EQ(version1.allocated_bytes, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(version1.largest_free_block_bytes, 17 * kMiB);
  EXPECT_EQ(version1.num_pages_mapped, -1);

  headroom_stats unset{};
  EXPECT_EQ(headroom_get_stats(1, &unset), -1);
  EXPECT_NE(std::string(headroom_last_error()).find("version 0"), std::string::npos) << headroom_last_error();
  headroom_free(p, static_cast<ssize_t>(3 * kMiB), 1, nullptr);
}

}  // namespace
